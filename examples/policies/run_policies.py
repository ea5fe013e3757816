#!/usr/bin/env python3
"""The experiments behind docs/policies.md: growth versus preallocate versus each framework's
own allocator, on workloads whose shapes vary, and two processes sharing one GPU. Runs on a
GPU machine; every number in docs/policies.md comes from its output.

  run_policies.py BUILD_DIR OUT    (BUILD_DIR holds shim/libcupool.so and tools/cupool)

Writes OUT/policies.json (each run's own output and `cupool report --json` of its trace) and
OUT/report-*.html for the runs the docs show as charts.
"""
import json
import os
import subprocess
import sys
import time

BUILD, OUT = (os.path.abspath(p) for p in sys.argv[1:3])
HERE = os.path.dirname(os.path.abspath(__file__))
CUPOOL = os.path.join(BUILD, "tools", "cupool")
TRACES = os.environ.get("RUN_POLICIES_TRACES", "/tmp/cupool-policy-traces")
PY = sys.executable
PT = [PY, os.path.join(HERE, "train_varlen.py")]
JX = [PY, os.path.join(HERE, "jax_varlen.py")]
if os.environ.get("RUN_POLICIES_DRYRUN"):  # exercise this script off-GPU with another program
    PT = JX = os.environ["RUN_POLICIES_DRYRUN"].split()
os.makedirs(TRACES, exist_ok=True)
os.makedirs(OUT, exist_ok=True)
results = []
HTML = {"pt-takeover-growth-1", "pt-takeover-preallocate", "share-growth"}


def last_json(text):
    for line in reversed((text or "").splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                pass
    return None


def report(name, traces):
    traces = [t for t in traces if os.path.exists(t)]
    if not traces:
        return None
    p = subprocess.run([CUPOOL, "report", "--json", *traces], capture_output=True, text=True)
    if name in HTML:
        subprocess.run([CUPOOL, "report", *traces, "--html", os.path.join(OUT, f"report-{name}.html")],
                       capture_output=True, text=True)
    try:
        return json.loads(p.stdout)
    except json.JSONDecodeError:
        return {"error": p.stderr[-500:]}


def compact(rep):
    """The numbers docs/policies.md uses, per trace and device."""
    if not rep or "traces" not in rep:
        return rep
    out = []
    for t in rep["traces"]:
        for d in t.get("devices", []):
            lat = {a["api"]: a.get("latency_ns") for a in t.get("apis", []) if a.get("event") == "alloc"}
            out.append({k: d.get(k) for k in ("device", "peak_in_use", "peak_requested", "peak_reserved",
                                                "reserved_ratio", "fragmentation", "chunks_taken",
                                                "chunks_returned", "ooms", "failed_allocs", "allocs")}
                       | {"alloc_latency_ns": lat, "pid": t.get("pid")})
    return out


def cupool_run(name, args, program, env=None):
    trace = os.path.join(TRACES, f"{name}.%p.jsonl")
    return [CUPOOL, "run", "--trace", trace, *args, "--", *program], trace


def finish(name, procs, started, traces):
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=400)
        outs.append({"rc": p.returncode, "result": last_json(out), "stderr_tail": err[-600:]})
    files = []
    for t in traces:
        if t:
            d, base = os.path.dirname(t), os.path.basename(t).split("%p")[0]
            files += sorted(os.path.join(d, f) for f in os.listdir(d) if f.startswith(base))
    rep = report(name, files)
    r = {"name": name, "wall_s": round(time.time() - started, 1), "processes": outs, "report": compact(rep)}
    results.append(r)
    print(f"[{r['wall_s']:6.1f}s] {name}: " + "; ".join(
        f"rc={o['rc']} {json.dumps(o['result'])[:200]}" for o in outs), flush=True)
    for o in outs:
        if o["rc"] != 0:
            print("    stderr:", o["stderr_tail"].replace("\n", "\n    "), flush=True)
    if r["report"]:
        for d in r["report"] if isinstance(r["report"], list) else []:
            print(f"    pid {d['pid']} dev {d['device']}: peak in use {d['peak_in_use']/2**20:.0f} MiB, "
                  f"reserved {d['peak_reserved']/2**20:.0f} MiB, ratio {d['reserved_ratio']}, "
                  f"frag {d['fragmentation']}, ooms {d['ooms']}", flush=True)


# RUN_POLICIES_ONLY=name,name...: run only these experiments (a GPU group that needs a few of them).
ONLY = set(filter(None, os.environ.get("RUN_POLICIES_ONLY", "").split(",")))


def wanted(name):
    return not ONLY or name in ONLY


def run(name, cmd, trace=None, env=None):
    if not wanted(name):
        return
    started = time.time()
    p = subprocess.Popen(cmd, env=dict(os.environ, **(env or {})), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    finish(name, [p], started, [trace])


def run_pair(name, cmds_traces, env=None):
    if not wanted(name):
        return
    started = time.time()
    procs = [subprocess.Popen(c, env=dict(os.environ, **(env or {})), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for c, _ in cmds_traces]
    finish(name, procs, started, [t for _, t in cmds_traces])


quiet = {"CUPOOL_LOG_LEVEL": "warn"}
REPEAT = int(os.environ.get("RUN_POLICIES_REPEAT", "3"))
# PyTorch: its caching allocator alone; cupool under it; cupool instead of it. Growth's peak
# reserved depends on the order in which blocks are freed, so its runs repeat, and every
# repetition is reported (not the best of them).
for i in range(1, REPEAT + 1):
    run(f"pt-caching-nocupool-{i}", PT)
    run(f"pt-takeover-growth-{i}", *cupool_run(f"pt-takeover-growth-{i}", ["--takeover", "--policy", "growth"], PT),
        env=quiet)
run("pt-nocache-nocupool", PT, env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
# PyTorch's own answer to fragmentation: segments that grow on the virtual-memory API.
run("pt-expandable-nocupool", PT, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
run("pt-caching-passthrough", *cupool_run("pt-caching-passthrough", ["--policy", "passthrough"], PT), env=quiet)
run("pt-caching-growth", *cupool_run("pt-caching-growth", ["--policy", "growth"], PT), env=quiet)
run("pt-takeover-growth-sync", *cupool_run("pt-takeover-growth-sync", ["--takeover", "--policy", "growth", "--free", "sync"], PT),
    env=quiet)
run("pt-takeover-preallocate", *cupool_run("pt-takeover-preallocate", ["--takeover", "--policy", "preallocate",
    "--preallocate", "20GiB"], PT), env=quiet)
# The vmm policy (issue 15): one virtual range, 2 MiB granules mapped as blocks need them. Its
# peak reserved should follow the peak in use (target: at most 1.03 times on train_varlen.py);
# repeated as growth is, in both free modes, and under the cap that binds growth.
for i in range(1, REPEAT + 1):
    run(f"pt-takeover-vmm-{i}", *cupool_run(f"pt-takeover-vmm-{i}", ["--takeover", "--policy", "vmm"], PT), env=quiet)
run("pt-takeover-vmm-sync", *cupool_run("pt-takeover-vmm-sync", ["--takeover", "--policy", "vmm", "--free", "sync"], PT),
    env=quiet)
run("pt-takeover-vmm-limit-5GiB", *cupool_run("pt-takeover-vmm-limit-5GiB", ["--takeover", "--policy", "vmm",
    "--limit", "5GiB"], PT), env=quiet)
run("jax-takeover-vmm", *cupool_run("jax-takeover-vmm", ["--takeover", "--policy", "vmm"], JX), env=quiet)
# A cap that binds: below what growth reserved unbounded, above what the run has in use.
run("pt-takeover-growth-limit-5GiB", *cupool_run("pt-takeover-growth-limit-5GiB", ["--takeover", "--policy", "growth",
    "--limit", "5GiB"], PT), env=quiet)
# JAX: XLA's BFC preallocating (default) and growing; cupool with XLA's cache off.
run("jax-bfc-preallocate", *cupool_run("jax-bfc-preallocate", ["--policy", "passthrough"], JX), env=quiet)
run("jax-bfc-growth", *cupool_run("jax-bfc-growth", ["--policy", "passthrough"], JX),
    env=dict(quiet, XLA_PYTHON_CLIENT_PREALLOCATE="false"))
run("jax-takeover-growth", *cupool_run("jax-takeover-growth", ["--takeover", "--policy", "growth"], JX), env=quiet)
# Two processes on one GPU: growth unbounded, growth with a cap each that binds (5 GiB: below
# what one process reserves unbounded), preallocating 60% each (more than the device holds for
# two), and JAX's default.
short = dict(quiet, STEPS="60")
run_pair("share-growth", [cupool_run(f"share-growth-{i}", ["--takeover", "--policy", "growth"], PT) for i in range(2)], short)
run_pair("share-preallocate-60pct", [cupool_run(f"share-preallocate-{i}", ["--takeover", "--policy", "preallocate",
         "--preallocate", "60%"], PT) for i in range(2)], short)
run_pair("share-growth-limit-5GiB", [cupool_run(f"share-limit-{i}", ["--takeover", "--policy", "growth", "--limit", "5GiB"],
         PT) for i in range(2)], short)
run_pair("share-jax-default", [(JX, None), (JX, None)], dict(quiet, STEPS="60"))

header = json.load(open(os.environ["CUPOOL_RUN_HEADER"])) if os.environ.get("CUPOOL_RUN_HEADER") else None
with open(os.path.join(OUT, "policies.json"), "w") as f:
    json.dump({"header": header, "runs": results}, f, indent=1)
missing = sorted(ONLY - {r["name"] for r in results})
if missing:
    sys.exit(f"run_policies.py: RUN_POLICIES_ONLY names experiments that do not exist: {', '.join(missing)}")
