#!/usr/bin/env python3
"""The measurement tables of the docs, generated from the raw GPU results in docs/gpu-runs/ (each
of which names the build, GPU, driver and command that made it), and the check that keeps the
docs honest: a table between <!-- gpu:NAME:begin --> and <!-- gpu:NAME:end --> must be what this
script makes of its results file, and every measured number written outside a table (a time, a
size, a ratio, a percentage) must appear in a table of the same page.

docs/design.md's measurements give the reasons for decisions, many from earlier sessions' raw
files; docs/history.md, "Earlier measurements (builds before main's library)", split from it,
holds older builds' tables that the measured pages no longer quote, generated here as the
pages' are (held to their files, not to HEAD's library). Every number of either's prose with a unit of
time or size, a ratio or a percentage (both ends of a range) must be one of a few design constants
(DESIGN_CONSTANTS), or appear, as a number, in a raw file that its own paragraph names
(`docs/gpu-runs/FILE`; a size may appear there as its exact count of bytes). Numbers are compared
as values: "29.0" matches "29", "2 528" matches "2528".

Each table and claim of the measured pages ends with a generated line that names the build it
measured and says how far the library (policy/, shim/, trace/) has moved since, as of a commit
(docs_check.py, Lag).

  docs_tables.py ROOT                  rewrite the tables, claims and lag lines (as of HEAD) in place
                                       (and check docs/design.md and docs/history.md)
  docs_tables.py ROOT --check          exit 1 if a table, claim, lag line or number is not what the
                                       results and git say, a comparison is typed outside a claim,
                                       or a cited raw file names no build (a commit here, not -dirty)
  docs_tables.py ROOT --check-library  print, per page and cited raw file, its build and how far
                                       HEAD's library has moved since; exit 0
The checks themselves are in docs_check.py; the raw files of the docs run (run_all.sh --docs), where
they exist, found by name (docs_run.py, DocsRun).
"""
import json
import os
import re
import statistics
import sys
from decimal import Decimal

import docs_check  # test/gpu/docs_check.py
import docs_run  # test/gpu/docs_run.py
from results import exact_result, last_json  # test/gpu/results.py

ROOT = os.path.abspath(sys.argv[1])
CHECK = "--check" in sys.argv
RUNS = os.path.join(ROOT, "docs", "gpu-runs")
PAGES = ["README.md", "docs/compatibility.md", "docs/performance.md", "docs/policies.md"]
if "--check-library" in sys.argv:  # a report, not a check
    print("\n".join(docs_check.report(ROOT, PAGES, RUNS)))
    sys.exit(0)
MiB = 2 ** 20


def load(name):
    return json.load(open(os.path.join(RUNS, name)))


def source(name, header):
    return (f"Source: `docs/gpu-runs/{name}`: build `{header['commit']}`, {header['gpu']} (GPU, driver), "
            f"torch {header.get('torch', '?').split()[0]}, jax {header.get('jax', '?')}, {header['date']}; "
            f"`{header['command']}`.")




def field(pattern, text):
    m = re.search(pattern, text or "")
    return m.group(1) if m else ""


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def by_name(runs):
    return {r["name"]: r for r in runs}


def allocs(r):
    t = r.get("trace") or {}
    return sum(v for k, v in t.get("by_api", {}).items() if k.split(":")[0] in ("alloc", "vmm_create"))


# ---- the tables --------------------------------------------------------------------------------

def compat_suite(name="2026-12-02-runZ4-compat.json"):
    d = load(name)
    cells = {}
    for r in d["runs"]:
        cells.setdefault(r["program"], {})[r["config"]] = r["cell"]
    configs = [c for c in d["configs"] if not c.startswith("native")]
    rows = [[f"`{p}`", "ok" if all(c.get(n) == "ok" for n in ("native1", "native2")) else "FAIL"] +
            [c.get(x, "?") for x in configs] for p, c in cells.items()]
    return source(name, d["header"]) + f" Result: {d['result']}.\n\n" + table(
        ["program", "without cupool (twice)"] + [c.replace("-", " ") for c in configs], rows)


def exact(run):
    """The exact result of a workload (loss as float.hex, or the weights' digest). Not its step: one
    run each is no comparison of speed (the steps table has the rounds)."""
    return exact_result(run["stdout"])


def frameworks(name="2026-12-01-runA.json"):
    a = load(name)
    r = by_name(a["runs"])
    rows = []
    for mode in ("default", "expandable", "cudaMallocAsync", "nocache"):
        b, u = r[f"torch-{mode}-nocupool"], r[f"torch-{mode}-passthrough"]
        rows.append([f"PyTorch `transformer_step.py`, allocator {mode}", exact(b), exact(u),
                     allocs(u)])
    for mode in ("bfc", "platform"):
        b, u = r[f"jax-{mode}-nocupool"], r[f"jax-{mode}-passthrough"]
        rows.append([f"JAX `jax_check.py`, {mode}", last_json(b["stdout"]).get("checksum"),
                     last_json(u["stdout"]).get("checksum"), allocs(u)])
        b, u = r[f"jaxmlp-{mode}-nocupool"], r[f"jaxmlp-{mode}-passthrough"]
        rows.append([f"JAX `jax_mlp_step.py`, {mode}", exact(b), exact(u), ""])
    b, u = r["cupy-nocupool"], r["cupy-passthrough"]
    rows.append(["CuPy, pool off (`cupy_check.py`)", last_json(b["stdout"]).get("checksum"),
                 last_json(u["stdout"]).get("checksum"), allocs(u)])
    for kind in ("shared", "static"):
        b = r[f"workload-{kind}-nocupool"]
        for policy in ("passthrough", "growth"):
            u = r[f"workload-{kind}-{policy}"]
            j, k = last_json(b["stdout"]), last_json(u["stdout"])
            rows.append([f"`examples/workload.cpp`, {kind} runtime, {policy}",
                         f"{j.get('allocs')} allocs, data ok {j.get('data_ok')}",
                         f"{k.get('allocs')} allocs, data ok {k.get('data_ok')}", allocs(u)])
    return source(name, a["header"]) + "\n\n" + table(
        ["program", "without cupool", "under cupool", "allocations in the trace"], rows)


def steps(prefixes=("step-", "quarantine-", "vmm-")):
    a = load("2026-12-01-runA.json")
    rows = []
    for run in a["runs"]:
        if run["name"].startswith(prefixes):
            t = run.get("trace") or {}
            exact = exact_result(run["stdout"]) or last_json(run["stdout"]).get("digest")
            rows.append([run["name"], field(r"step=([\d.]+) ms", run["stdout"]), exact or "",
                         f"{t['peak_reserved'] // MiB} MiB" if t.get("peak_reserved") else "",
                         f"{t['peak_quarantined'] // MiB} MiB" if t.get("peak_reserved") else "",
                         allocs(run) if t else ""])
    return source("2026-12-01-runA.json", a["header"]) + "\n\n" + table(
        ["run", "step ms", "exact result (loss hex / weights digest)", "peak reserved", "peak quarantined",
         "allocations in the trace"], rows)


def policies(kind, name="2026-12-01-runB-policies.json"):
    b = load(name)
    rows = []
    for run in b["runs"]:
        if not run["name"].startswith(kind):
            continue
        rep = run["report"] if isinstance(run["report"], list) else []
        for i, p in enumerate(run["processes"]):
            res = p["result"] or {}
            d = rep[i] if i < len(rep) else {}
            frag = (d.get("fragmentation") or {})
            if not d and res.get("torch_max_reserved"):  # no trace: PyTorch's own count (marked *)
                in_use, reserved = res["torch_max_allocated"], res["torch_max_reserved"]
                cells = [f"{in_use // MiB} MiB*", f"{reserved // MiB} MiB*", f"{reserved / in_use:.3f}*", "", ""]
            else:
                cells = [f"{d['peak_in_use'] // MiB} MiB" if d.get("peak_in_use") else "",
                         f"{d['peak_reserved'] // MiB} MiB" if d.get("peak_reserved") else "",
                         f"{d['reserved_ratio']:.3f}" if d.get("reserved_ratio") else "",
                         f"{frag['at_peak_in_use'] * 100:.1f}%" if frag else "", d.get("ooms", "")]
            rows.append([run["name"] + (f" (process {i + 1})" if len(run["processes"]) > 1 else ""), p["rc"],
                         res.get("median_step_ms", ""), res.get("loss_hex") or res.get("checksum", "")] + cells)
    return source(name, b["header"]) + " *: PyTorch's own count " + \
        "(`torch.cuda.max_memory_allocated` / `max_memory_reserved`), where no trace saw its memory.\n\n" + table(
        ["run", "exit", "median step ms", "exact loss / checksum", "peak in use", "peak reserved", "reserved / in use",
         "fragmentation at peak in use", "out of memory"], rows)


def limit():
    text = open(os.path.join(RUNS, "2026-12-01-runC-limit.txt")).read().splitlines()
    keep = [l for l in text if re.search(r"commit=|H200|UTC|command:|refused|out of memory|rc=|fragmentation", l)]
    return ("Source: `docs/gpu-runs/2026-12-01-runC-limit.txt` (its first lines name the build, GPU and "
            "driver, date and command); the lines of it that matter:\n\n```\n" + "\n".join(keep) + "\n```")


def replay():
    d = load("2026-12-01-runE-results-replay-steps.json")
    MiB = 2 ** 20
    rows = []
    for r in d["runs"]:
        rp = r.get("replay")
        if not rp:
            continue
        c = rp["config"]
        conf = c["policy"] + " " + c["free"] + (" cap" if c.get("limit") else "")
        rec, rep = rp["recorded"], rp["replayed"]
        rows.append([r["name"].replace("replay-", ""), conf, rp["events"],
                     f'{rec["peak_reserved"] / MiB:.0f} / {rep["peak_reserved"] / MiB:.0f} MiB',
                     f'{rec["chunks_taken"]} / {rep["chunks_taken"]}',
                     f'{rp["recorded_ooms"]} / {rp["replayed_ooms"]}', "yes" if rp["exact"] else "**no**"])
    return source("2026-12-01-runE-results-replay-steps.json", d["header"]) + \
        " Each run's trace replayed with `cupool replay --policy recorded`; recorded / replayed.\n\n" + table(
        ["workload", "recorded configuration", "events", "peak reserved", "chunks taken", "out of memory",
         "exact (peaks, chunks, failures)"], rows)


def sharing():
    d = load("2026-12-01-runH-sharing.json")
    rows = [["alone", "", "growth, no cap", j, "yes" if r["finished"] else "**no**", r["step_ms"] or "",
             f'{r["peak_reserved_mib"]:.0f} MiB', "", ""] for j, r in d["alone"].items()]
    for sc in d["scenarios"]:
        for i, j in enumerate(sc["jobs"]):
            first = i == 0
            waits = "" if j["share_waits"] is None else f'{j["share_waits"]} ({j["share_wait_s"]} s)'
            ooms = f'{j["ooms"]} ({", ".join(j["oom_classes"])})' if j["ooms"] else "0"
            rows.append([f'{sc["scenario"]}, {sc["budget_mib"]} MiB' if first else "",
                         (f'{sc["finished"]}/{len(sc["jobs"])}, {sc["peak_device_used_mib"]} MiB' if first else ""),
                         sc["way"] if first else "", f'{j["job"]} ({j["share_mib"]} MiB)',
                         "yes" if j["finished"] else "**no**", j["step_ms"] or "", f'{j["peak_reserved_mib"]:.0f} MiB',
                         ooms, waits])
    return source("2026-12-01-runH-sharing.json", d["header"]) + (
        " Each job under `cupool run --takeover` (growth unless fixed); a job's share is the budget split in "
        "proportion to its peak alone; device peak: nvidia-smi's used memory over the idle device (it counts each "
        "process's CUDA context too).\n\n") + table(
        ["scenario, budget", "finished, device peak", "way", "job (share)", "finished", "median step ms",
         "peak reserved", "out of memory", "waits (time)"], rows)


def share_startup(name="2026-12-01-runH-results-share-sharing.json"):
    d = load(name)
    r = by_name(d["runs"])["share-startup-cost"]
    rows = []
    for line in r["stdout"].splitlines():
        if line.startswith("{"):
            x = json.loads(line)
            rows.append([x["members"], x["samples"], f'{x["join_us"]["median"]} us', f'{x["first_admit_us"]["median"]} us',
                         f'{x["total_us"]["median"]} us', f'{x["total_us"]["p90"]} us'])
    return source(name, d["header"]) + \
        " `test/perf/bench_share_startup.cpp`: fresh forked processes join a budget that already has N members.\n\n" + \
        table(["members", "samples", "join (median)", "first admission (median)", "total (median)", "total (p90)"], rows)


def vmm_others(name):
    d = load(name)
    rows = []
    for r in d["runs"]:
        if not r["name"].startswith("vmmpolicy-") or "-bench-" in r["name"]:
            continue
        t = r.get("trace") or {}
        ratio = f'{t["peak_reserved"] / t["peak_in_use"]:.3f}' if t.get("peak_in_use") else ""
        rows.append([r["name"].replace("vmmpolicy-", ""), r["rc"], field(r"step=([\d.]+) ms", r["stdout"]),
                     exact_result(r["stdout"]) or "",
                     f'{t["peak_in_use"] // MiB} MiB' if t.get("peak_in_use") else "",
                     f'{t["peak_reserved"] // MiB} MiB' if t.get("peak_reserved") else "", ratio])
    benches = [r for r in d["runs"] if "-bench-" in r["name"]]
    text = source(name, d["header"]) + " Peaks from each run's trace; the runs without cupool have none.\n\n" + table(
        ["run", "exit", "median step ms", "exact loss", "peak in use", "peak reserved", "reserved / in use"], rows)
    if any("-round" in r["name"] for r in benches):  # three alternating rounds per policy, every size
        cells = {}  # (bytes, threads) -> policy -> the rounds' medians
        for r in benches:
            pol = re.search(r"-round\d+-(\w+)-deferred", r["name"]).group(1)
            for line in (r.get("stdout") or "").splitlines():
                if line.startswith("{"):
                    j = json.loads(line)
                    cells.setdefault((j["bytes"], j["threads"]), {}).setdefault(pol, []).append(j["median_ns"])
        pols = sorted({p for c in cells.values() for p in c})
        rows = [[f"{b // MiB} MiB" if b >= MiB else f"{b} B", t] +
                [f'{" / ".join(str(x) for x in c[p])} ({sorted(c[p])[len(c[p]) // 2]})' for p in pols]
                for (b, t), c in sorted(cells.items())]
        every = {p: [x for c in cells.values() for x in c.get(p, [])] for p in pols}
        rows.append(["every size", "1 and 8"] + [f"median of {len(every[p])}: {statistics.median(every[p]):.1f}"
                                                 for p in pols])
        return text + ("\n\nPool-hit pair cost (`test/gpu/bench_alloc.cu`, median ns per alloc+free per thread; "
                       "three alternating rounds, trace off, deferred frees; each cell: the rounds, and their median):"
                       "\n\n") + table(["size", "threads"] + pols, rows)
    bench = [[r["name"].replace("vmmpolicy-", ""), last_json(r.get("stdout")).get("median_ns")] for r in benches]
    return text + "\n\nPool-hit pair cost (`test/gpu/bench_alloc.cu`, 64 MiB, 8 threads, one run each):\n\n" + table(
        ["run", "median ns"], bench)


def vmm_calls():
    name = "2026-12-02-runV-results-inflight-nvml-share-vmmcalls-vmmpolicy.json"
    d = load(name)
    r = by_name(d["runs"])["vmmcalls"]
    rows = [[x["what"], f'{x["bytes"] // MiB} MiB', x["granules"], f'{x["median_ns"] / 1e3:.1f} us',
             f'{x["median_ns"] / 1e3 / x["granules"]:.1f} us'] for x in r["rows"]]
    return source(name, d["header"]) + (" `test/gpu/bench_vmm_calls.cu`, without cupool: median of 15 calls (single "
                                        "handles), 9 runs (granule runs) or 5 (`_busy`: a 20 ms kernel queued first). "
                                        "`create` ... `release`: one handle of that size; `run_new`: n 2 MiB handles "
                                        "created and mapped, one `cuMemSetAccess`, as the vmm policy maps; `run_free`: "
                                        "unmapped and released; `run_move`: the same handles unmapped and mapped at "
                                        "other addresses.\n\n") + table(
        ["call", "size", "2 MiB granules", "median", "per granule"], rows)


def stacks():
    name = "2026-12-02-runN-results-stacks.json"
    d = load(name)
    r = by_name(d["runs"])
    rows = []
    for mode in ("off", "on", "all"):
        ns = [last_json(r[f"stacks-round{i}-{mode}"]["stdout"]).get("median_ns") for i in (1, 2, 3)]
        rows.append([f"pair cost, trace on, stacks {mode}", " / ".join(str(x) for x in ns),
                     f"{sorted(ns)[1]} ns"])
    for fw, label in (("transformer", "transformer step (every tensor through cupool)"), ("jax", "JAX MLP step (platform allocator)")):
        for mode in ("off", "on", "all"):
            run = r[f"stacks-{fw}-takeover-{mode}" if fw == "transformer" else f"stacks-jax-platform-{mode}"]
            t = run.get("trace") or {}
            rows.append([f"{label}, stacks {mode}", f'{t.get("allocs_with_stack")} of {t.get("allocs")} allocations with a stack, '
                         f'{t.get("stack_lines")} distinct stacks', f'{field(r"step=([0-9.]+) ms", run["stdout"])} ms'])
    return source(name, d["header"]) + (" Pair cost: `test/gpu/bench_alloc.cu`, 64 MiB, 8 threads, median ns per "
                                        "alloc+free per thread, three alternating rounds (growth, deferred frees, "
                                        "trace on). Steps: median ms.\n\n") + table(["run", "rounds / stacks", "median"], rows)


def min_capacity():
    name = "2026-12-02-runK-results-memviz.json"
    d = load(name)
    rows = []
    for r in d["runs"]:
        mc = r.get("min_capacity")
        if not mc:
            continue
        for pol, c in mc["policies"].items():
            rows.append([r["name"].replace("memviz-", ""), pol, f'{c["peak_requested"] / MiB:.1f} MiB',
                         f'{c["bytes"] / MiB:.1f} MiB', f'{(c["bytes"] - c["peak_requested"]) / MiB:.1f} MiB',
                         f'{c["bytes"] / c["peak_requested"]:.3f}', c["probes"]])
    return source(name, d["header"]) + (" `cupool replay --min-capacity` of each run's trace (recorded under "
                                        "`--takeover`, growth), per policy, on the simulated device.\n\n") + table(
        ["trace", "policy", "peak live", "smallest device", "what fragmentation costs", "smallest / peak live", "probes"], rows)


# The measured pages' own tables (compat-suite, frameworks: the docs run's once it is kept), and the
# older builds' tables kept in docs/history.md, "Earlier measurements" (every other name here).
TABLES = {"compat-suite": compat_suite, "replay": replay, "frameworks": frameworks,
          "quarantine-vmm-cache": lambda: steps(("quarantine-", "vmm-")),
          "policies-pt": lambda: policies("pt-"), "policies-jax": lambda: policies("jax-"),
          "policies-share": lambda: policies("share-"), "limit": limit,
          "sharing": sharing, "share-startup": share_startup,
          "vmm-varlen": lambda: policies("pt-", "2026-12-02-runV-vmmpolicy-policies.json"),
          "vmm-varlen-before": lambda: policies("pt-", "2026-12-02-runO-vmmpolicy-policies.json"),
          "vmm-others-before": lambda: vmm_others("2026-12-02-runO-results-vmmpolicy.json"), "vmm-calls": vmm_calls,
          "stacks": stacks,
          "min-capacity": min_capacity}


def checks_passed(name):
    """The "N of M checks passed" line of a run's log, and the checks that failed, as the log says."""
    text = open(os.path.join(RUNS, name), errors="replace").read()
    m = re.search(r"^(\d+) of (\d+) checks passed$", text, re.M)
    failed = re.findall(r"^- FAILED: ([^:]+):", text, re.M)
    return (f"{m.group(1)} of {m.group(2)} checks passed" + (f" (failed: {', '.join(failed)})" if failed else "")
            + f" (docs/gpu-runs/{name})") if m else f"no check count in docs/gpu-runs/{name}"


CLAIMS = {"vmmipc-checks": lambda: checks_passed("2026-12-03-runV3-vmmipc-run.log")}
# The docs run's (run_all.sh --docs): min / median / max over alternating rounds (docs_run.py).
DOCS_RUN, docs_tables, docs_claims = docs_run.make(RUNS)
TABLES.update(docs_tables)
CLAIMS.update(docs_claims)
# The tables the docs run measures again come from it, once a part that runs them is kept (the
# newest kept file of each, whatever the split: docs_run.DocsRun).
if _at := DOCS_RUN.find("compat.json"):
    TABLES["compat-suite"] = lambda at=_at: compat_suite(DOCS_RUN.name(at))
if _at := DOCS_RUN.results("compat"):
    TABLES["frameworks"] = lambda at=_at: frameworks(DOCS_RUN.name(at))
if _at := DOCS_RUN.results("sharing"):
    TABLES["docs-share-startup"] = lambda at=_at: share_startup(DOCS_RUN.name(at))

# ---- rewriting and checking (docs_check.py) ------------------------------------------------------

errors = []
LAG = docs_check.Lag(ROOT, RUNS, CHECK)
for page in PAGES:
    path = os.path.join(ROOT, page)
    text = open(path).read()
    new = docs_check.fill(text, page, TABLES, CLAIMS, CHECK, errors, LAG)
    docs_check.check_prose(new, page, RUNS, True, errors)
    if not CHECK and new != text:
        open(path, "w").write(new)
# Without the history (a shallow clone, no git), the lag lines and the builds' commits are not checked.
SKIPPED = docs_check.check_builds(ROOT, PAGES, RUNS, errors) + LAG.skipped

# ---- docs/design.md ------------------------------------------------------------------------------

# docs/design.md and the history split from it (docs/history.md: "Earlier measurements"), checked alike.
DESIGN_PAGES = ("docs/design.md", "docs/history.md")
# Their "Earlier measurements" tables: generated as the pages' are; written back only where one changed.
for _page in DESIGN_PAGES:
    _path = os.path.join(ROOT, _page)
    _text = open(_path).read()
    _new = docs_check.fill(_text, _page, TABLES, CLAIMS, CHECK, errors)
    if not CHECK and _new != _text:
        open(_path, "w").write(_new)
# Sizes and intervals that the code or a test sets, which design.md states as such: not measurements.
DESIGN_CONSTANTS = {
    "2 MiB",     # chunk granularity (growth, preallocate, SimUpstream)
    "1 MiB",     # thread-cache bins: largest block; the pool benchmark's largest random size
    "16 MiB",    # thread-cache bins: bytes per thread
    "64 MiB",    # a fence batch's bytes; the bench's large block; the bins tried; the probe's graph node
    "256 MiB",   # the quarantine bound's floor; the bins tried per thread; prog_arrays' arrays
    "1 GiB",     # prog_arrays' cap
    "256 GiB",   # the largest chunk an IPC handle's spare bytes can describe
    "1 ms",      # the sealing interval
    "100 ms",    # the capture probe's kernel
    "16 times",  # a sampled timing's weight (one call in 16 timed)
}
# A measured-looking number: a value, or a range of two (both ends are checked), with a unit of
# time or size, a percentage, or a ratio ("7x"; not "8192 x 8192"). Thousands may be separated.
DESIGN_NUMBER = re.compile(
    r"(?<![\w.])(\d{1,3}(?:[ ,\u202f]\d{3})+(?![\d.])|\d+(?:\.\d+)?)"
    r"(?:\s?(?:-|\u2013|to)\s?(\d+(?:\.\d+)?))?"
    r"\s?(ms|us|[\u00b5\u03bc]s|ns|s\b|MiB|GiB|KiB|MB|GB|%|x\b(?!\s?\d)|times\b)")
BYTES = {"KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}


def numbers_in(text):
    """Every number written in a raw file, as a value (so 29.0 and 29 are one number)."""
    return {Decimal(t) for t in re.findall(r"\d+(?:\.\d+)?", text)}


def blank(m):
    return re.sub(r"[^\n]", " ", m.group(0))


def check_design(page):
    """Each measured number of the page is a design constant or in a raw file its paragraph names."""
    text = open(os.path.join(ROOT, page)).read()
    # Generated tables are their files' by construction (checked above); code holds names, options
    # and commands, not measurements (both blanked, so line numbers stay).
    text = docs_check.BLOCK.sub(blank, text)
    text = re.sub(r"```.*?```", blank, text, flags=re.S)
    out = []
    line = 1
    parts = re.split(r"(\n[ \t]*\n)", text)  # paragraphs at even places, the blank lines between at odd
    for i, para in enumerate(parts):
        if i % 2 == 0:
            cited = sorted({f for f in re.findall(r"docs/gpu-runs/([\w.-]*\w)", para)
                            if f != "README.md" and os.path.isfile(os.path.join(RUNS, f))})
            known = set()
            for f in cited:
                known |= numbers_in(open(os.path.join(RUNS, f), errors="replace").read())
            prose = re.sub(r"`[^`]*`", blank, para)
            for m in DESIGN_NUMBER.finditer(prose):
                unit = m.group(3)
                if f"{m.group(1)} {unit}" in DESIGN_CONSTANTS and not m.group(2):
                    continue
                for value in filter(None, (m.group(1), m.group(2))):
                    v = Decimal(re.sub(r"[ ,\u202f]", "", value))
                    if v in known or (unit in BYTES and v * BYTES[unit] in known):
                        continue
                    where = line + prose[:m.start()].count("\n")
                    out.append(f"{page}:{where}: '{' '.join(m.group(0).split())}' ({value}) is not a design constant "
                               f"(DESIGN_CONSTANTS) and is in no raw file its paragraph names "
                               f"({', '.join('docs/gpu-runs/' + f for f in cited) or 'none'}); quote the "
                               f"number as a file in docs/gpu-runs/ writes it and name that file in the paragraph, "
                               f"or describe it without a number")
        line += para.count("\n")
    return out


for _page in DESIGN_PAGES:
    errors += check_design(_page)

for e in errors:
    print("FAIL:", e)
if errors:
    sys.exit(1)
for s in SKIPPED:  # everything else was checked; only the history to compare the builds with is missing
    print("SKIP:", s)
print(f"ok: the measurement tables of {', '.join(PAGES)} are what docs/gpu-runs says, and so are their numbers "
      f"and their lag lines{' (but the skipped ones)' if SKIPPED else ''}; every cited raw file names its build; "
      f"every measured number of {' and '.join(DESIGN_PAGES)} is a design constant or in a raw file its "
      f"paragraph names")
