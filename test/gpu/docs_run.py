"""The tables and claims of the docs run (test/gpu/run_all.sh --docs --part K/N, kept in docs/gpu-runs
as DATE-docsK-FILE by docs_plan.py save): every comparison over the rounds, as min / median / max.
docs_tables.py registers them; until a docs run is kept, each says so in one line.

Which kept file a table reads does not depend on the split: each table asks for a file by name
(DocsRun.find: defaultpolicy.json, sharing.json, ...) or for the results file of a part whose
run_all.py ran a group (DocsRun.results: results-TAG.json, TAG the part's groups joined by '-'),
and gets the newest such file of any part of any kept docs run. So the four-part run of
2026-12-02/03 (its part 2's results-compat-inflight-rounds-share.json holds the frameworks and
the pair cost) and a two-part run after it (results-compat-...json and results-...-rounds-...json,
whatever parts docs_plan.py puts them in) are read alike; the newest date wins, table by table.
The default-policy tables read defaultpolicy.json from a docs part or from the decision's own run
(DATE-decision-FILE), whichever is newer."""
import json
import os
import re
import statistics

import docs_plan  # test/gpu/docs_plan.py: the parts, and which group each holds

from results import exact_result, last_json  # test/gpu/results.py

MiB = 2 ** 20
# DATE-docsK-FILE (a part of a docs run) or DATE-decision-FILE (the default-policy decision, a run
# of its own: docs_plan.py)
KEPT = re.compile(r"(\d{4}-\d\d-\d\d-(?:docs\d+|decision))-(.+)")


class DocsRun:
    def __init__(self, runs_dir):
        self.runs_dir = runs_dir
        # (prefix DATE-docsK, FILE), oldest first: the date leads the name
        self.kept = sorted(m.groups() for f in os.listdir(runs_dir) if (m := KEPT.fullmatch(f)))

    def find(self, f):
        """The newest kept DATE-docsK-f, as (prefix, f); None if no docs run kept one."""
        got = [(p, g) for p, g in self.kept if g == f]
        return got[-1] if got else None

    def results(self, group):
        """The newest kept results file of a part whose run_all.py ran group, as (prefix, file)."""
        got = [(p, g) for p, g in self.kept
               if (m := re.fullmatch(r"results-([\w-]+)\.json", g)) and group in m.group(1).split("-")]
        return got[-1] if got else None

    def name(self, at):
        return f"{at[0]}-{at[1]}"

    def load(self, at, f=None):
        return json.load(open(os.path.join(self.runs_dir, self.name((at[0], f or at[1])))))

    def source(self, at):
        h = self.load(at, "header.json")
        return (f"Source: `docs/gpu-runs/{self.name(at)}`: build `{h['commit']}`, {h['gpu']} (GPU, driver), "
                f"torch {h.get('torch', '?').split()[0]}, jax {h.get('jax', '?')}, {h['date']}; `{h['command']}`.")

    @staticmethod
    def missing(what, group):
        if not any(group in p["groups"] for p in docs_plan.PARTS):
            return (f"No run kept in docs/gpu-runs has {what} yet (test/gpu/run_all.sh BUILD CARRY OUT --only "
                    f"{group}, then test/gpu/docs_plan.py save OUT docs/gpu-runs/DATE-decision).")
        part = next((k for k, p in zip(docs_plan.PART_NUMBERS, docs_plan.PARTS) if group in p["groups"]), "K")
        return (f"No docs run kept in docs/gpu-runs has {what} yet (test/gpu/run_all.sh BUILD CARRY OUT --docs "
                f"--part {part}/{len(docs_plan.PARTS)}, then test/gpu/docs_plan.py save).")


def mmm(v, fmt="{}"):
    v = [x for x in v if x is not None]
    if not v:
        return "missing"
    return " / ".join(fmt.format(x) for x in (min(v), statistics.median(v), max(v)))


def med(v):
    v = [x for x in v if x is not None]
    return round(statistics.median(v), 3) if v else None  # the median of two is a new float: no 65.04500000000002


def rounds_of(runs, pattern):
    """{config: [run, ...]} of the runs named like pattern (a regex with groups round and config)."""
    out = {}
    for r in runs:
        m = re.fullmatch(pattern, r["name"])
        if m:
            out.setdefault(m.group("config"), []).append(r)
    return out


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def pair_rows(d):
    """{(config, bytes, threads): [median_ns of each round]} of the `rounds` group."""
    cells = {}
    for config, rs in rounds_of(d["runs"], r"round(?P<round>\d+)-(?P<config>.+)").items():
        for r in rs:
            for line in (r.get("stdout") or "").splitlines():
                if line.startswith("{"):
                    j = json.loads(line)
                    if "median_ns" in j:
                        cells.setdefault((config, j["bytes"], j["threads"]), []).append(j["median_ns"])
    return cells


def make(runs_dir):
    run = DocsRun(runs_dir)

    def pair_cost():
        at = run.results("rounds")
        if not at:
            return run.missing("the pair-cost rounds (group rounds)", "rounds")
        d = run.load(at)
        rows = [[c, f"{b // MiB} MiB" if b >= MiB else f"{b} B", t, mmm(v), len(v)]
                for (c, b, t), v in sorted(pair_rows(d).items())]
        return run.source(at) + (" `test/gpu/bench_alloc.cu`: median ns per alloc+free per thread of each run; "
                                 "the rounds alternate (order reversed every other round).\n\n") + table(
            ["configuration", "size", "threads", "ns: min / median / max of the rounds", "rounds"], rows)

    def steps():
        at = run.results("steps")
        if not at:
            return run.missing("the framework steps (group steps)", "steps")
        d = run.load(at)
        rows = []
        for config, rs in rounds_of(d["runs"], r"step-round(?P<round>\d+)-(?P<config>.+)").items():
            steps_ms = [float(m.group(1)) if (m := re.search(r"step=([\d.]+) ms", r["stdout"])) else None for r in rs]
            res = sorted({exact_result(r["stdout"]) or "" for r in rs})
            peaks = [(r.get("trace") or {}).get("peak_reserved") for r in rs]
            rows.append([config, mmm(steps_ms), ", ".join(res),
                         mmm([p // MiB if p else None for p in peaks], "{} MiB") if any(peaks) else "", len(rs)])
        return run.source(at) + " Transformer and JAX MLP steps, median ms of each run, over alternating rounds.\n\n" + \
            table(["configuration", "step ms: min / median / max", "exact results seen", "peak reserved (trace)",
                   "rounds"], rows)

    def defaultpolicy():
        at = run.find("defaultpolicy.json")
        if not at:
            return run.missing("defaultpolicy.json", "defaultpolicy")
        s = run.load(at)
        rows = [[k.rsplit("-", 1)[0], k.rsplit("-", 1)[1], mmm(v["step_ms"] or []),
                 mmm(v["pool_reserved_mib"] or [], "{:.0f} MiB"), mmm(v["reserved_over_in_use"] or [], "{:.3f}"),
                 mmm(v["outside_peak_mib"] or [], "{:.0f} MiB")] for k, v in s.items()]
        return run.source(at) + (" Every tensor through cupool (the frameworks' caches off), "
                                 "growth and vmm in alternating rounds; pool peaks from each "
                                 "run's trace.\n\n") + table(
            ["workload", "policy", "step ms: min / median / max", "pool peak reserved", "reserved / in use (pool)",
             "outside the pool, peak"], rows)

    def sharing():
        at = run.find("sharing.json")
        if not at:
            return run.missing("sharing.json", "sharing")
        d = run.load(at)
        ways = {}
        for sc in d["scenarios"]:
            ways.setdefault((sc["scenario"], sc["budget_mib"], sc["way"]), []).append(sc)
        rows = [[f"{sc}, {b} MiB", w, ", ".join(f'{x["finished"]}/{len(x["jobs"])}' for x in xs),
                 mmm([x["peak_device_used_mib"] for x in xs], "{} MiB"),
                 mmm([med([j["step_ms"] for j in x["jobs"] if j["finished"]]) for x in xs]), len(xs)]
                for (sc, b, w), xs in ways.items()]
        return run.source(at) + (" Each job under `cupool run --takeover`; a job's share is the budget "
                                                "split in proportion to its peak alone; device peak: nvidia-smi's used "
                                                "memory over the idle device.\n\n") + table(
            ["scenario, budget", "way", "jobs finished, each round", "device peak: min / median / max",
             "median step of the finished jobs (ms)", "rounds"], rows)

    def policies():
        at = run.find("policies-round1-policies.json")
        if not at:
            return run.missing("policies-round1-policies.json", "policies")
        got = {}
        for i in range(1, docs_plan.ROUNDS + 1):  # the rounds of the same part, one file each
            f = f"policies-round{i}-policies.json"
            if os.path.isfile(os.path.join(runs_dir, run.name((at[0], f)))):
                for r in run.load(at, f)["runs"]:
                    got.setdefault(r["name"], []).append(r)
        rows = []
        for name, rs in got.items():
            res = [(r["processes"][0].get("result") or {}) for r in rs]
            rows.append([name, mmm([x.get("median_step_ms") for x in res]),
                         mmm([x["torch_max_reserved"] // MiB if x.get("torch_max_reserved") else None for x in res], "{} MiB"),
                         mmm([x["torch_max_allocated"] // MiB if x.get("torch_max_allocated") else None for x in res], "{} MiB"),
                         len(rs)])
        return run.source(at) + (" `train_varlen.py` without cupool, in alternating "
                                                                  "rounds (one file a round); PyTorch's own counts.\n\n") + \
            table(["run", "median step ms: min / median / max", "max reserved", "max allocated", "rounds"], rows)

    def vmm_vs_growth():
        at = run.find("defaultpolicy.json")
        if not at:
            return run.missing("defaultpolicy.json", "defaultpolicy")
        s = run.load(at)
        out = []
        for wl in ("transformer", "varlen", "jaxmlp", "cupy", "hf"):
            g, v = s.get(f"{wl}-growth", {}).get("step_ms"), s.get(f"{wl}-vmm", {}).get("step_ms")
            if g and v:
                ratio = v[1] / g[1]
                out.append(f"{wl}: vmm's median step {v[1]} ms against growth's {g[1]} ms, {ratio:.3f} times "
                           f"({'slower' if ratio > 1 else 'faster' if ratio < 1 else 'the same'})")
        return "; ".join(out) + " (docs/gpu-runs/" + run.name(at) + ")"

    def sharing_finished():
        at = run.find("sharing.json")
        if not at:
            return run.missing("sharing.json", "sharing")
        d = run.load(at)
        by = {}
        for sc in d["scenarios"]:
            f, n = by.get(sc["way"], (0, 0))
            by[sc["way"]] = (f + sc["finished"], n + len(sc["jobs"]))
        return "jobs finished over every round: " + ", ".join(f"{w} {f} of {n}" for w, (f, n) in by.items()) + \
            " (docs/gpu-runs/" + run.name(at) + ")"

    tables = {"docs-pair-cost": pair_cost, "docs-steps": steps, "docs-defaultpolicy": defaultpolicy,
              "docs-sharing": sharing, "docs-policies": policies}
    claims = {"docs-vmm-vs-growth": vmm_vs_growth, "docs-sharing-finished": sharing_finished}
    return run, tables, claims
