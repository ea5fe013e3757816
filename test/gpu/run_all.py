#!/usr/bin/env python3
"""Every GPU check and benchmark of cupool but the compatibility suite (test/gpu/compat), in one
run (device time is scarce). Called by test/gpu/run_all.sh, which records the build and the
machine first (CUPOOL_RUN_HEADER). Writes results-<groups>.json and .md to OUT, each headed by
that record, prints a short table and the checks, and exits 1 if any check failed: a run that
did not do what it claims (no reuse in an in-flight check, a result that differs by a bit from
the run without cupool, a trace that saw nothing) is a failed check, not a row.

  run_all.py BUILD_DIR WORKLOADS_DIR GPU_BIN_DIR OUT [--only GROUP,...] [--suite-beside-compat COMPAT_BIN_DIR]
Groups: compat (frameworks under passthrough), inflight, bench, rounds, steps, quarantine, vmm,
xlasync, policies, replay (each framework trace replayed under its recorded configuration), share
(the shared-budget check of the simulated CUDA, test/integration/check_share_budget.py, on the GPU),
sharing (trainings sharing one budget against fixed shares and caps, and a member's start-up cost),
nvml (NVML's memory info inside the process), memviz (traces exported for memory_viz and RMM, and
replay --min-capacity), vmmpolicy (the vmm policy against growth and the frameworks' allocators),
stacks (CUPOOL_TRACE_STACKS: what native stacks cost, and that they name the frameworks' code),
defaultpolicy (growth against vmm, three alternating rounds of every workload: issues 29 and 39's decision),
vmmcalls (what the driver's virtual-memory calls cost, per call and per size),
vmmipc (CUDA IPC of the vmm policy's blocks: torch.multiprocessing, simpleIPC's pattern and a shared
block's lifetimes, CuPy, each without cupool, under growth and under vmm in both free modes; and what
shareable handle types cost at cuMemCreate),
peer (two GPUs, kind nvidia-h200-x2: a kernel on one reaches the other's blocks after peer access
is enabled, without cupool, under growth and under vmm).
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

import results  # test/gpu/results.py

BUILD, WORKLOADS, BIN, OUT = (os.path.abspath(p) for p in sys.argv[1:5])
ONLY = set(sys.argv[sys.argv.index("--only") + 1].split(",")) if "--only" in sys.argv else None
# names the results files; CUPOOL_GPU_RESULTS_TAG overrides it (the docs run keeps the names its
# pages' generator reads, docs_run.py, when it runs fewer groups than the call that named them)
TAG = os.environ.get("CUPOOL_GPU_RESULTS_TAG") or ("-".join(sorted(ONLY)) if ONLY else "all")
SHIM = os.path.join(BUILD, "shim", "libcupool.so")
HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable
if "CUPOOL_RUN_HEADER" not in os.environ:
    sys.exit("run_all.py: run it through test/gpu/run_all.sh, which records the build and the machine")
HEADER = json.load(open(os.environ["CUPOOL_RUN_HEADER"]))
runs = []  # every run of this call, in order (not `results`: that is the helper module)
RUNS_LOCK = threading.Lock()  # run() from the compat group's threads (CUPOOL_GPU_COMPAT_JOBS)
checks = []


def check(name, ok, detail=""):
    """One assertion of the run: printed at once, listed at the end, and fatal to the exit status."""
    checks.append({"check": name, "ok": bool(ok), "detail": detail})
    print(f"   check {'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    return ok


def trace_summary(path):
    """Counts per (event, api, path), peaks and drops, read straight from the JSON lines."""
    s = {"events": 0, "by_api": {}, "peak_reserved": 0, "peak_in_use": 0, "peak_quarantined": 0, "peak_external": 0,
         "ooms": 0, "dropped": None, "footer": False, "files": 0, "host_us_by_api": {},
         "allocs": 0, "allocs_with_stack": 0, "stack_lines": 0, "stack_modules": {}}
    live_external = 0
    host_ns = {}
    files = [path] if os.path.exists(path) else []
    d = os.path.dirname(path)
    base = os.path.basename(path)
    if not files and "%p" in base:
        pre = base.split("%p")[0]
        files = [os.path.join(d, f) for f in os.listdir(d) if f.startswith(pre)]
    for f in files:
        s["files"] += 1
        sizes = {}
        events = []
        for line in open(f, encoding="utf-8"):
            r = json.loads(line)
            t = r.get("type")
            if t == "footer":
                s["footer"] = True
                s["dropped"] = (s["dropped"] or 0) + r.get("dropped", 0)
            if t == "event":
                events.append(r)
            if t == "stack":  # CUPOOL_TRACE_STACKS: the modules its frames lie in, by frame count
                s["stack_lines"] += 1
                for fr in r["frames"]:
                    m = os.path.basename(fr.get("module", "")) or "(none)"
                    s["stack_modules"][m] = s["stack_modules"].get(m, 0) + 1
        events.sort(key=lambda e: e["t"])  # threads' buffers are written in turn: sort by time
        for r in events:
            s["events"] += 1
            key = f'{r["ev"]}:{r["api"]}:{r["path"]}' + ("" if r.get("rc", 0) == 0 else f':rc{r["rc"]}')
            s["by_api"][key] = s["by_api"].get(key, 0) + 1
            if r.get("recycled"):  # a VMM call cupool's mapping cache served
                s.setdefault("recycled", {})[r["ev"]] = s.get("recycled", {}).get(r["ev"], 0) + 1
            if "dur" in r:  # host time inside the calls (a sampled timing stands for timed_for calls)
                k = f'{r["ev"]}:{r["api"]}' + (":recycled" if r.get("recycled") else "")
                host_ns[k] = host_ns.get(k, 0) + r["dur"] * r.get("timed_for", 1)
            if r.get("reserved") is not None:
                s["peak_reserved"] = max(s["peak_reserved"], r["reserved"])
                s["peak_in_use"] = max(s["peak_in_use"], r.get("in_use", 0))
                s["peak_quarantined"] = max(s["peak_quarantined"], r.get("quarantined", 0))
            elif r["ev"] in ("alloc", "vmm_create") and r.get("rc", 0) == 0:
                sizes[r["ptr"]] = r.get("size", 0)
                live_external += r.get("size", 0)
                s["peak_external"] = max(s["peak_external"], live_external)
            elif r["ev"] in ("free", "vmm_release") and r["ptr"] in sizes:
                live_external -= sizes.pop(r["ptr"])
            if r["ev"] == "oom":
                s["ooms"] += 1
            if r["ev"] in ("alloc", "vmm_create"):
                s["allocs"] += 1
                s["allocs_with_stack"] += "stack" in r
    s["host_us_by_api"] = {k: round(v / 1e3, 1) for k, v in host_ns.items()}
    return s


def count(summary, ev=None, api=None, path=None):
    n = 0
    for key, v in summary["by_api"].items():
        e, a, p = key.split(":")[:3]
        if key.count(":") > 2:
            continue  # failed calls
        if (ev is None or e == ev) and (api is None or a == api) and (path is None or p == path):
            n += v
    return n


def quick_stack_counts(path, max_lines=500_000):
    """Allocations, those with a stack, and stack lines, in the first max_lines lines of each file
    of a trace, by substring (a benchmark's trace has millions of events: json.loads is too slow);
    the files are removed after."""
    d, base = os.path.dirname(path), os.path.basename(path)
    pre = base.split("%p")[0]
    s = {"allocs": 0, "allocs_with_stack": 0, "stack_lines": 0, "lines_read": 0, "footer": False}
    for f in [os.path.join(d, x) for x in os.listdir(d) if x.startswith(pre)]:
        with open(f, encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                if i >= max_lines:
                    break
                s["lines_read"] += 1
                if line.startswith('{"type":"stack"'):
                    s["stack_lines"] += 1
                elif '"ev":"alloc"' in line:
                    s["allocs"] += 1
                    s["allocs_with_stack"] += '"stack":' in line
        os.unlink(f)
    return s


def run(name, cmd, env_extra=None, shim=None, timeout=150, summary=True, keep=3000):
    """shim: None (no cupool) or a dict of CUPOOL_* settings. summary=False: the trace is only
    sampled for its stacks (quick_stack_counts), for benchmarks whose traces are huge. keep: how
    much of the end of stdout and stderr the results keep."""
    env = dict(os.environ)
    env.update(env_extra or {})
    trace = None
    if shim is not None:
        trace = os.path.join(TRACES, re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".%p.jsonl")
        env["LD_PRELOAD"] = SHIM
        env["CUPOOL_TRACE"] = trace
        env.setdefault("CUPOOL_LOG_LEVEL", "warn")
        env.update(shim)
        if shim.get("CUPOOL_TRACE") == "":
            del env["CUPOOL_TRACE"]
            trace = None
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = "timeout", (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), ""
    wall = time.time() - t0
    r = {"name": name, "rc": rc, "wall_s": round(wall, 1), "stdout": out[-keep:], "stderr": err[-keep:]}
    if trace and not summary:
        r["trace"] = quick_stack_counts(trace)
    elif trace:
        try:
            r["trace"] = trace_summary(trace)
        except Exception as e:  # noqa: BLE001 - a broken trace is a result too
            r["trace_error"] = repr(e)
    with RUNS_LOCK:
        print(f"[{wall:6.1f}s] {name}: rc={rc}", flush=True)
        if rc != 0:
            print("   stderr:", err[-800:].replace("\n", "\n   "), flush=True)
        runs.append(r)
        save_results(complete=False)
    return r


def unique_runs():
    """Each run once, in order, however a group's code listed it (a run appended to `runs` again by
    its group would otherwise be written twice)."""
    return list({id(r): r for r in runs}.values())


def save_results(complete):
    """results-<groups>.json with every run and check so far: rewritten after each run, so that a
    call cut at its time limit still brings back what it measured ("complete": false)."""
    path = os.path.join(OUT, f"results-{TAG}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"header": HEADER, "complete": complete, "checks": checks, "runs": unique_runs()}, f, indent=1)
    os.replace(path + ".tmp", path)


def parse_float(pattern, text):
    m = re.search(pattern, text or "")
    return float(m.group(1)) if m else None


def wanted(group):
    return ONLY is None or group in ONLY


def last_json(r):
    return results.last_json(r.get("stdout"))


def exact(r):
    """The bit-exact result of a reference workload (the other figures it prints are rounded)."""
    return results.exact_result(r.get("stdout"))


def same_result(name, base, *others):
    """Every run succeeded, and each one's exact result equals the one without cupool."""
    runs = (base,) + others
    ok = all(x["rc"] == 0 for x in runs) and exact(base) is not None
    ok = ok and all(exact(x) == exact(base) for x in others)
    return check(name, ok, ", ".join(f'{x["name"]}: rc {x["rc"]} {exact(x)}' for x in runs))


# transformer_step.py is not bit-reproducible on the H200 even without cupool: its exact loss
# took two values (0x1.f6f9820000000p-1 and 0x1.f6f9840000000p-1) across runs without cupool in
# one call (docs/gpu-runs/2026-12-01-runA), against FACTS.md's "the same exact loss". So its runs
# under cupool are held to the values its runs without cupool gave in this same call (checked at
# the end, over all of them), not to one run's.
TRANSFORMER_RUNS = []


def transformer_runs(*runs):
    TRANSFORMER_RUNS.extend(runs)


def check_transformer_losses():
    if not TRANSFORMER_RUNS:
        return
    native = [r for r in TRANSFORMER_RUNS if r["name"].endswith("nocupool")]
    under = [r for r in TRANSFORMER_RUNS if not r["name"].endswith("nocupool")]
    seen = {exact(r) for r in native if r["rc"] == 0 and exact(r)}
    check("transformer_step without cupool: at least two runs, every one finished", len(native) >= 2 and
          all(r["rc"] == 0 and exact(r) for r in native), f"{len(native)} runs, exact losses {sorted(seen)}")
    for r in under:
        check(f'{r["name"]}: an exact loss a run without cupool gave', r["rc"] == 0 and exact(r) in seen,
              f"{exact(r)} (without cupool: {sorted(seen)})")


def traced(r, at_least=1):
    """A run under cupool whose trace recorded the program's allocations (interception worked)."""
    t = r.get("trace") or {}
    n = sum(v for k, v in t.get("by_api", {}).items() if k.split(":")[0] in ("alloc", "vmm_create"))
    return check(f'{r["name"]}: the trace saw its allocations', n >= at_least and t.get("footer"),
                 f"{n} allocation events, footer {t.get('footer')}, dropped {t.get('dropped')}")


# Traces stay on the machine (only a few result files travel back).
# One folder per call, emptied first: a machine kept warm between calls still holds the last
# call's traces, and a run's files are found by name (runL of 2026-12-02 counted both calls').
TRACES = os.path.join(os.environ.get("CUPOOL_GPU_TRACES", "/tmp/cupool-gpu-traces"), os.path.basename(OUT))
shutil.rmtree(TRACES, ignore_errors=True)
os.makedirs(TRACES, exist_ok=True)
os.environ.setdefault("CUPOOL_SHARING_TRACES", os.path.join(TRACES, "sharing"))
os.environ.setdefault("RUN_POLICIES_TRACES", os.path.join(TRACES, "policies"))
TRANSFORMER = os.path.join(WORKLOADS, "transformer_step.py")
JAX_MLP = os.path.join(WORKLOADS, "jax_mlp_step.py")
TORCH_MODES = {
    "default": {},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "cudaMallocAsync": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
    "nocache": {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
}
# The transformer workload as it is, plus the allocator's own statistics afterwards.
TRANSFORMER_WITH_STATS = [PY, "-c",
    "import runpy, json, torch; runpy.run_path(%r, run_name='__main__'); s = torch.cuda.memory_stats();"
    "print(json.dumps({'num_device_alloc': s.get('num_device_alloc'), 'num_device_free': s.get('num_device_free'),"
    "'max_reserved': torch.cuda.max_memory_reserved(), 'max_allocated': torch.cuda.max_memory_allocated()}))"
    % TRANSFORMER]

# ---- Issue 2: passthrough is invisible, and the trace accounts for every allocation ----------
# Correctness only (no timing of these runs is quoted): with CUPOOL_GPU_COMPAT_JOBS=N (the docs
# run: 4) its runs go N at a time, and with --suite-beside-compat COMPAT_BIN_DIR (run_all.sh, where
# the docs plan asks it) the compatibility suite (test/gpu/compat/run_compat.py) runs beside them;
# no group after this one starts before both are done, so nothing runs beside a timing run. The
# results are the same in form either way: the runs in the order below, then the same checks.
COMPAT_JOBS = max(1, int(os.environ.get("CUPOOL_GPU_COMPAT_JOBS", "1")))
SUITE = None
if "--suite-beside-compat" in sys.argv:
    suite_log = open(os.path.join(TRACES, "compat-suite.log"), "w+")
    SUITE = subprocess.Popen([PY, os.path.join(HERE, "compat", "run_compat.py"), BUILD,
                              os.path.abspath(sys.argv[sys.argv.index("--suite-beside-compat") + 1]), OUT, "--jobs", "8"],
                             stdout=suite_log, stderr=subprocess.STDOUT)
    print(f"run_all.py: the compatibility suite runs beside group compat (its output follows when it is done)",
          flush=True)
if wanted("compat"):
    jobs = []  # (name, command, environment, cupool settings or None): independent runs, checked after
    for mode, env in TORCH_MODES.items():
        jobs += [(f"torch-{mode}-nocupool", TRANSFORMER_WITH_STATS, dict(env, MODE=mode), None),
                 (f"torch-{mode}-passthrough", TRANSFORMER_WITH_STATS, dict(env, MODE=mode),
                  {"CUPOOL_POLICY": "passthrough"})]
    # XLA's BFC takes 75% of the device at start: beside other runs, a smaller arena (the same
    # allocator; these programs use well under 1 GiB).
    bfc = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.05"} if COMPAT_JOBS > 1 or SUITE else {}
    for mode, env in {"bfc": bfc, "platform": {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}}.items():
        jobs += [(f"jax-{mode}-nocupool", [PY, os.path.join(HERE, "jax_check.py")], env, None),
                 (f"jax-{mode}-passthrough", [PY, os.path.join(HERE, "jax_check.py")], env,
                  {"CUPOOL_POLICY": "passthrough"}),
                 (f"jaxmlp-{mode}-nocupool", [PY, JAX_MLP], dict(env, MODE=mode), None),
                 (f"jaxmlp-{mode}-passthrough", [PY, JAX_MLP], dict(env, MODE=mode), {"CUPOOL_POLICY": "passthrough"})]
    jobs += [("cupy-nocupool", [PY, os.path.join(HERE, "cupy_check.py")], None, None),
             ("cupy-passthrough", [PY, os.path.join(HERE, "cupy_check.py")], None, {"CUPOOL_POLICY": "passthrough"})]
    for kind in ("shared", "static"):
        exe = os.path.join(BIN, f"workload_{kind}")
        jobs += [(f"workload-{kind}-nocupool", [exe, "100", "8"], None, None)] + [
            (f"workload-{kind}-{policy}", [exe, "100", "8"], None, {"CUPOOL_POLICY": policy, "CUPOOL_FREE": "deferred"})
            for policy in ("passthrough", "growth")]
    first = len(runs)
    if COMPAT_JOBS > 1:
        import concurrent.futures
        with concurrent.futures.ThreadPoolExecutor(COMPAT_JOBS) as pool:
            got = dict(zip((j[0] for j in jobs), pool.map(lambda j: run(*j), jobs)))
        order = {j[0]: i for i, j in enumerate(jobs)}  # the results list them as one at a time would
        with RUNS_LOCK:
            runs[first:] = sorted(runs[first:], key=lambda r: order.get(r["name"], len(order)))
    else:
        got = {j[0]: run(*j) for j in jobs}
    for mode in TORCH_MODES:
        transformer_runs(got[f"torch-{mode}-nocupool"], got[f"torch-{mode}-passthrough"])
        traced(got[f"torch-{mode}-passthrough"])
    for mode in ("bfc", "platform"):
        base, under = got[f"jax-{mode}-nocupool"], got[f"jax-{mode}-passthrough"]
        check(f"jax {mode}: passthrough gives the same checksum", base["rc"] == 0 and under["rc"] == 0 and
              last_json(base).get("checksum") is not None and last_json(base).get("checksum") == last_json(under).get("checksum"),
              f'{last_json(base).get("checksum")} vs {last_json(under).get("checksum")}')
        traced(under)
        same_result(f"jax_mlp_step {mode}: passthrough gives the same weights", got[f"jaxmlp-{mode}-nocupool"],
                    got[f"jaxmlp-{mode}-passthrough"])
    base, under = got["cupy-nocupool"], got["cupy-passthrough"]
    check("cupy: passthrough gives the same checksum", base["rc"] == 0 and under["rc"] == 0 and
          last_json(base).get("checksum") == last_json(under).get("checksum"),
          f'{last_json(base).get("checksum")} vs {last_json(under).get("checksum")}')
    traced(under)
    for kind in ("shared", "static"):
        base = got[f"workload-{kind}-nocupool"]
        for policy in ("passthrough", "growth"):
            under = got[f"workload-{kind}-{policy}"]
            check(f"workload {kind} {policy}: same counts and data as without cupool",
                  base["rc"] == 0 and under["rc"] == 0 and last_json(base) == last_json(under),
                  f"{last_json(base)} vs {last_json(under)}")
            traced(under, last_json(base).get("allocs", 1))
SUITE_FAILED = False
if SUITE is not None:
    SUITE.wait()
    suite_log.seek(0)
    print(suite_log.read(), end="", flush=True)
    SUITE_FAILED = SUITE.returncode != 0
    print(f"run_all.py: the compatibility suite (beside group compat) exited {SUITE.returncode}", flush=True)

# ---- Issue 3: safe reuse after free -----------------------------------------------------------
if wanted("inflight"):
    exe = os.path.join(BIN, "inflight")
    base = run("inflight-nocupool", [exe])
    check("inflight without cupool: the kernel saw its data", base["rc"] == 0 and
          last_json(base).get("kernel_saw_overwrite") == 0, str(last_json(base)))
    for policy in ("growth", "preallocate", "vmm"):
        for free in ("sync", "deferred"):
            # Room for one 256 MiB buffer (and the flag word and the runtime's own small
            # allocations), never two: the second allocation must reuse the first's memory, so
            # the pool must wait (sync: at the free; deferred: for the fence). A run that got other
            # memory tested nothing, and fails.
            r = run(f"inflight-{policy}-{free}", [exe], shim={"CUPOOL_POLICY": policy, "CUPOOL_FREE": free,
                                                           "CUPOOL_PREALLOCATE": "384MiB", "CUPOOL_LIMIT": "384MiB",
                                                           "CUPOOL_GROWTH_CHUNK": "2MiB"})
            j = last_json(r)
            check(f"inflight {policy} {free}: the kernel saw its data, and the memory was reused",
                  r["rc"] == 0 and j.get("kernel_saw_overwrite") == 0 and j.get("reused_same_address", 0) > 0, str(j))

# ---- Issue 3: pair cost ---------------------------------------------------------------------
if wanted("bench"):
    exe = os.path.join(BIN, "bench_alloc")
    # Its own list: run() already adds each run to `runs` (binding `runs` here dropped the earlier
    # groups' runs from the results, and appending to it listed each cupool run twice).
    bench_runs = [run("bench-driver", [exe, "malloc", "driver cudaMalloc+cudaFree"]),
                  run("bench-async", [exe, "async", "cudaMallocAsync+cudaFreeAsync"])]
    for free in ("deferred", "sync"):
        bench_runs.append(run(f"bench-cupool-{free}-trace-off", [exe, "malloc", f"cupool growth {free}, trace off"],
                              shim={"CUPOOL_POLICY": "growth", "CUPOOL_FREE": free, "CUPOOL_TRACE": ""}))
        bench_runs.append(run(f"bench-cupool-{free}-trace-on", [exe, "malloc", f"cupool growth {free}, trace on"],
                              shim={"CUPOOL_POLICY": "growth", "CUPOOL_FREE": free, "CUPOOL_TRACE_BUFFER": "1048576"}))
    for r in bench_runs:
        check(f'{r["name"]}: ran and measured', r["rc"] == 0 and last_json(r).get("median_ns") is not None)

# ---- Issue 3: pair cost, alternating rounds (the host's noise moves single runs by 50 ns) --------
# Every configuration of `bench` (and vmm's) once per round, the order reversed every other round
# (A B C .. C B A ..), ROUNDS rounds: docs_tables.py reports min / median / max over the rounds.
ROUNDS = int(os.environ.get("CUPOOL_GPU_ROUNDS", "3"))


def selected(configs, var):
    """The configurations (tuples, name first) that the comma list in env var names, in their own
    order; all of them where var is unset (run_all.sh --docs sets it to what the pages quote)."""
    names = [n for n in os.environ.get(var, "").split(",") if n]
    if not names:
        return configs
    unknown = set(names) - {c[0] for c in configs}
    if unknown:
        sys.exit(f"run_all.py: {var} names no configuration {sorted(unknown)}")
    return [c for c in configs if c[0] in names]


if wanted("rounds"):
    exe = os.path.join(BIN, "bench_alloc")
    configs = [("driver", "malloc", None), ("async", "async", None)] + [
        (f"{pol}-{free}-trace-{tr}", "malloc", dict({"CUPOOL_POLICY": pol, "CUPOOL_FREE": free},
                                                    **({"CUPOOL_TRACE_BUFFER": "1048576"} if tr == "on" else {"CUPOOL_TRACE": ""})))
        for pol, free, tr in (("growth", "deferred", "off"), ("growth", "deferred", "on"), ("growth", "sync", "off"),
                              ("growth", "sync", "on"), ("vmm", "deferred", "off"))]
    configs = selected(configs, "CUPOOL_GPU_ROUNDS_CONFIGS")
    for i in range(1, ROUNDS + 1):
        for name, api, shim in (configs if i % 2 else configs[::-1]):
            # The trace is only sampled (a trace-on run writes millions of events: parsing them
            # all took minutes of device time).
            r = run(f"round{i}-{name}", [exe, api, f"round {i}: {name}"], shim=shim, summary=False)
            check(f'{r["name"]}: ran and measured', r["rc"] == 0 and last_json(r).get("median_ns") is not None)
    for r in runs:
        if r["name"].startswith("round"):
            rows = [json.loads(l) for l in r["stdout"].splitlines() if l.startswith("{")]
            print(f'   {r["name"]}: ' + " ".join(f'{x["bytes"]}/{x["threads"]}:{x["median_ns"]}' for x in rows), flush=True)

# ---- Issue 3: framework steps with every tensor through cupool ----------------------------------
# ROUNDS alternating rounds (the order reversed every other round): docs_tables.py reports min /
# median / max of each configuration's step over the rounds.
if wanted("steps"):
    nocache = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    platform_env = {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}
    deferred = {"CUPOOL_POLICY": "growth", "CUPOOL_FREE": "deferred"}
    configs = [  # (name, command, environment, cupool settings or None)
        ("torch-caching-nocupool", TRANSFORMER_WITH_STATS, {"MODE": "caching"}, None),
        ("torch-nocache-nocupool", TRANSFORMER_WITH_STATS, dict(nocache, MODE="nocache"), None),
        ("torch-nocache-growth-deferred", TRANSFORMER_WITH_STATS, dict(nocache, MODE="nocache+cupool deferred"), deferred),
        ("torch-nocache-growth-sync", TRANSFORMER_WITH_STATS, dict(nocache, MODE="nocache+cupool sync"),
         {"CUPOOL_POLICY": "growth", "CUPOOL_FREE": "sync"}),
        ("torch-caching-growth", TRANSFORMER_WITH_STATS, {"MODE": "caching+cupool"}, deferred),
        ("jax-bfc-nocupool", [PY, JAX_MLP], {"MODE": "bfc"}, None),
        ("jax-platform-nocupool", [PY, JAX_MLP], dict(platform_env, MODE="platform"), None),
        ("jax-platform-growth-deferred", [PY, JAX_MLP], dict(platform_env, MODE="platform+cupool"), deferred),
    ]
    configs = selected(configs, "CUPOOL_GPU_STEPS_CONFIGS")
    for i in range(1, ROUNDS + 1):
        got = {}
        for name, cmd, env, shim in (configs if i % 2 else configs[::-1]):
            got[name] = run(f"step-round{i}-{name}", cmd, env, shim=shim)
            if name.startswith("torch-"):
                transformer_runs(got[name])
            if shim is not None:
                traced(got[name])
        if "jax-platform-nocupool" in got and "jax-platform-growth-deferred" in got:
            same_result(f"jax_mlp_step round {i}: every buffer through cupool gives the platform allocator's weights",
                        got["jax-platform-nocupool"], got["jax-platform-growth-deferred"])

# ---- Issue 3: how much memory the deferred quarantine holds -------------------------------------
# Fences (and so quarantine) are needed once the process has created a stream that can run beside
# the others. The transformer workload alone never does; here it runs unchanged after making one
# side stream first, as programs with prefetch or communication streams do (torch.cuda.Stream()
# is a non-blocking stream).
if wanted("quarantine"):
    side = [PY, "-c", "import torch; side = torch.cuda.Stream(); " + TRANSFORMER_WITH_STATS[2]]
    nocache = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    # Like for like: every cupool row has the same workload without cupool beside it (the caching
    # allocator with the same side stream, and every tensor through the driver).
    group_runs = [
        run("quarantine-torch-caching-nocupool", TRANSFORMER_WITH_STATS, {"MODE": "caching"}),
        run("quarantine-torch-caching-sidestream-nocupool", side, {"MODE": "caching, side stream"}),
        run("quarantine-torch-nocache-deferred", TRANSFORMER_WITH_STATS, dict(nocache, MODE="nocache+cupool deferred"),
            shim={"CUPOOL_POLICY": "growth", "CUPOOL_FREE": "deferred"}),
        run("quarantine-torch-nocache-sidestream-deferred", side, dict(nocache, MODE="side stream, deferred"),
            shim={"CUPOOL_POLICY": "growth", "CUPOOL_FREE": "deferred"}),
        run("quarantine-torch-nocache-sidestream-sync", side, dict(nocache, MODE="side stream, sync"),
            shim={"CUPOOL_POLICY": "growth", "CUPOOL_FREE": "sync"}),
    ]
    transformer_runs(*group_runs)
    for r in group_runs:
        t = r.get("trace") or {}
        r["quarantine"] = {"step_ms": parse_float(r"step=([\d.]+) ms", r["stdout"]),
                           "loss": parse_float(r"loss=([\d.]+)", r["stdout"]),
                           "peak_reserved_mib": round(t.get("peak_reserved", 0) / 2**20),
                           "peak_in_use_mib": round(t.get("peak_in_use", 0) / 2**20),
                           "peak_quarantined_mib": round(t.get("peak_quarantined", 0) / 2**20),
                           "fences_retired": t.get("by_api", {}).get("fence_retired:pool:none", 0)}
        print(f"   {r['name']}: {r['quarantine']}", flush=True)

# ---- VMM mapping cache: XLA's platform allocator as fast as its BFC pool, same results ------------
if wanted("vmm"):
    JAX_VMM = [PY, os.path.join(HERE, "jax_vmm_check.py")]
    det = {"XLA_FLAGS": "--xla_gpu_autotune_level=0 --xla_gpu_deterministic_ops=true"}
    platform = dict(det, XLA_PYTHON_CLIENT_ALLOCATOR="platform")
    group_runs = [
        run("vmm-jax-bfc-nocupool", JAX_VMM, dict(det, MODE="bfc")),
        run("vmm-jax-platform-nocupool", JAX_VMM, dict(platform, MODE="platform")),
        run("vmm-jax-platform-growth-deferred", JAX_VMM, dict(platform, MODE="platform+cupool deferred"),
            shim={"CUPOOL_POLICY": "growth", "CUPOOL_FREE": "deferred"}),
        run("vmm-jax-platform-growth-sync", JAX_VMM, dict(platform, MODE="platform+cupool sync"),
            shim={"CUPOOL_POLICY": "growth", "CUPOOL_FREE": "sync"}),
        run("vmm-jax-platform-growth-deferred-cacheoff", JAX_VMM, dict(platform, MODE="platform+cupool nocache"),
            shim={"CUPOOL_POLICY": "growth", "CUPOOL_FREE": "deferred", "CUPOOL_VMM_CACHE": "off"}),
    ]
    outs = []
    for r in group_runs:
        last = [l for l in r["stdout"].splitlines() if l.startswith("{")]
        outs.append(json.loads(last[-1]) if last else {})
    ref = outs[0].get("digest")
    for r, o in zip(group_runs[1:], outs[1:]):
        check(f'{r["name"]}: same weights as BFC', r["rc"] == 0 and o.get("digest") is not None and o.get("digest") == ref,
              f'{o.get("digest")} vs {ref}')
    for r, o in zip(group_runs, outs):
        r["vmm_check"] = {"step_ms": o.get("step_ms"), "digest": o.get("digest"), "same_as_bfc": o.get("digest") == ref,
                          "vs_bfc": round(o["step_ms"] / outs[0]["step_ms"], 2) if o.get("step_ms") and outs[0].get("step_ms") else None}
        t = r.get("trace")
        if t:  # how many VMM calls the cache served (the trace's "recycled":true events)
            r["vmm_check"]["recycled_events"] = sum(v for k, v in t.get("recycled", {}).items())
            top = sorted(t["host_us_by_api"].items(), key=lambda kv: -kv[1])[:4]
            r["vmm_check"]["host_ms_top"] = {k: round(v / 1e3, 2) for k, v in top}
        print(f"   {r['name']}: {r['vmm_check']}", flush=True)

# ---- Why JAX's platform allocator cannot reach BFC's step time, whatever sits under it ------------
# XLA's GpuExecutable blocks the host until the device is done inside every execution when its
# allocator cannot free asynchronously (the platform allocator cannot; BFC can). "dispatch" shows
# it (how soon the gradient call returns), "serial" measures the floor it sets (BFC with every
# execution waited for), to set beside the step under cupool.
if wanted("xlasync"):
    JAX_VMM = [PY, os.path.join(HERE, "jax_vmm_check.py")]
    det = {"XLA_FLAGS": "--xla_gpu_autotune_level=0 --xla_gpu_deterministic_ops=true"}
    platform = dict(det, XLA_PYTHON_CLIENT_ALLOCATOR="platform")
    sync = {"CUPOOL_POLICY": "growth", "CUPOOL_FREE": "sync"}
    deferred = {"CUPOOL_POLICY": "growth", "CUPOOL_FREE": "deferred"}
    group_runs = [
        run("xlasync-bfc-dispatch", JAX_VMM + ["dispatch"], dict(det, MODE="bfc")),
        run("xlasync-platform-dispatch", JAX_VMM + ["dispatch"], dict(platform, MODE="platform")),
        run("xlasync-platform-sync-dispatch", JAX_VMM + ["dispatch"], dict(platform, MODE="platform+cupool sync"),
            shim=sync),
        run("xlasync-platform-deferred-dispatch", JAX_VMM + ["dispatch"], dict(platform, MODE="platform+cupool deferred"),
            shim=deferred),
    ]
    for i in (1, 2, 3):  # alternating rounds: the host's noise moves single runs
        group_runs += [
            run(f"xlasync{i}-bfc-step", JAX_VMM, dict(det, MODE="bfc")),
            run(f"xlasync{i}-bfc-serial", JAX_VMM + ["serial"], dict(det, MODE="bfc")),
            run(f"xlasync{i}-platform-sync-step", JAX_VMM, dict(platform, MODE="platform+cupool sync"), shim=sync),
            run(f"xlasync{i}-platform-deferred-step", JAX_VMM, dict(platform, MODE="platform+cupool deferred"),
                shim=deferred),
            # XLA's own BFC pool under cupool: the cap and honest memory info at BFC's speed
            run(f"xlasync{i}-bfc-growth-step", JAX_VMM, dict(det, MODE="bfc+cupool growth"), shim=deferred),
        ]
    for r in group_runs:
        last = [l for l in r["stdout"].splitlines() if l.startswith("{")]
        r["xlasync"] = json.loads(last[-1]) if last else {}
        print(f"   {r['name']}: {r['xlasync']}", flush=True)
        check(f'{r["name"]}: ran and measured', r["rc"] == 0 and bool(r["xlasync"]))

# ---- Issue 4: growth vs preallocate vs the frameworks' allocators (docs/policies.md) ----------
# CUPOOL_GPU_POLICIES_ROUNDS_OF=name,...: only these experiments, once each per round, in ROUNDS
# rounds (A B C A B C ..., each round's results in OUT/policies-roundN/policies.json), for
# docs_tables.py's min / median / max (run_all.sh --docs sets it).
if wanted("policies"):
    script = os.path.join(HERE, "..", "..", "examples", "policies", "run_policies.py")
    rounds_of = os.environ.get("CUPOOL_GPU_POLICIES_ROUNDS_OF")
    if rounds_of:
        for i in range(1, ROUNDS + 1):
            p = subprocess.run([PY, script, BUILD, os.path.join(OUT, f"policies-round{i}")],
                               env=dict(os.environ, RUN_POLICIES_ONLY=rounds_of, RUN_POLICIES_REPEAT="1",
                                        RUN_POLICIES_TRACES=os.path.join(TRACES, f"policies-round{i}")))
            check(f"policies round {i}: every experiment ran ({rounds_of})", p.returncode == 0,
                  f"run_policies.py exited {p.returncode}")
    else:
        p = subprocess.run([PY, script, BUILD, OUT])
        check("policies: every experiment ran", p.returncode == 0, f"run_policies.py exited {p.returncode}")

# ---- Issue 13: replay runs what the shim runs -------------------------------------------------------
# A framework run under cupool, then `cupool replay --policy recorded` of its trace: the same
# ProcessMemory on a simulated device of the H200's size. Where the run's decisions did not depend
# on the device's timing, the replay must find its reserved bytes and out-of-memory events; the
# rows say how close each is (PyTorch allocates from two threads: the main one and autograd's).
if wanted("replay"):
    nocache = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    cupool_cmd = os.path.join(BUILD, "tools", "cupool")
    cases = [
        ("replay-torch-nocache-growth-sync", TRANSFORMER_WITH_STATS, nocache, {"CUPOOL_POLICY": "growth", "CUPOOL_FREE": "sync"}),
        ("replay-torch-nocache-growth-deferred", TRANSFORMER_WITH_STATS, nocache, {"CUPOOL_POLICY": "growth", "CUPOOL_FREE": "deferred"}),
        ("replay-torch-nocache-preallocate-deferred", TRANSFORMER_WITH_STATS, nocache,
         {"CUPOOL_POLICY": "preallocate", "CUPOOL_FREE": "deferred", "CUPOOL_PREALLOCATE": "8GiB"}),
        ("replay-torch-nocache-growth-limit", TRANSFORMER_WITH_STATS, nocache,
         {"CUPOOL_POLICY": "growth", "CUPOOL_FREE": "sync", "CUPOOL_LIMIT": "1GiB"}),
        ("replay-torch-nocache-passthrough", TRANSFORMER_WITH_STATS, nocache, {"CUPOOL_POLICY": "passthrough"}),
        ("replay-jax-platform-growth-deferred", [PY, JAX_MLP], {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"},
         {"CUPOOL_POLICY": "growth", "CUPOOL_FREE": "deferred"}),
    ]
    for name, cmd, env, shim in cases:
        r = run(name, cmd, dict(env, MODE=name), shim=shim)
        traced(r)
        prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", name) + "."
        files = sorted(os.path.join(TRACES, f) for f in os.listdir(TRACES) if f.startswith(prefix))
        rp = subprocess.run([cupool_cmd, "replay", "--json", "--no-progress", "--policy", "recorded"] + files,
                            capture_output=True, text=True, timeout=600)
        try:
            out = json.loads(rp.stdout)
        except ValueError:
            out = None
        ok = rp.returncode in (0, 1) and out is not None and out["events"] > 0
        if check(f"{name}: cupool replay --policy recorded read the whole trace", ok,
                 f"rc {rp.returncode}, {out['events'] if out else 0} events, {len(files)} files {rp.stderr[-300:]}"):
            rec = {d["device"]: d for d in out["recorded"]["devices"]}
            rep = {d["device"]: d for d in out["policies"][0]["devices"]}
            keys = ["peak_in_use", "peak_reserved", "chunks_taken", "chunk_bytes_taken", "failed_allocs"]
            r["replay"] = {"recorded": {k: sum(d[k] for d in rec.values()) for k in keys},
                           "replayed": {k: sum(d[k] for d in rep.values()) for k in keys},
                           "recorded_ooms": out["recorded"]["oom_count"], "replayed_ooms": out["policies"][0]["oom_count"],
                           "events": out["events"], "config": out["policies"][0]["config"]}
            r["replay"]["exact"] = (r["replay"]["recorded"] == r["replay"]["replayed"] and
                                    r["replay"]["recorded_ooms"] == r["replay"]["replayed_ooms"])
            print(f"   replay: exact {r['replay']['exact']}: recorded {r['replay']['recorded']} ooms "
                  f"{r['replay']['recorded_ooms']}; replayed {r['replay']['replayed']} ooms {r['replay']['replayed_ooms']}",
                  flush=True)

# ---- Issue 14: one budget shared by processes, on the real driver ---------------------------------
if wanted("share"):
    empty = os.path.join(TRACES, "no-sim")  # no simulated CUDA on the library path: the real driver answers
    os.makedirs(empty, exist_ok=True)
    p = subprocess.run([PY, os.path.join(HERE, "..", "integration", "check_share_budget.py"), "--shim", SHIM,
                        "--sim-dir", empty, "--program", os.path.join(BIN, "prog_share")],
                       capture_output=True, text=True, timeout=600)
    runs.append({"name": "share-budget", "rc": p.returncode, "wall_s": 0, "stdout": p.stdout[-3000:],
                 "stderr": p.stderr[-3000:]})
    check("share-budget: admission across processes, class share, memory info, give-back, a killed member "
          "reclaimed, on the GPU", p.returncode == 0, (p.stdout + p.stderr).strip()[-600:])
    # Issue 26 on the real driver: PID namespaces, pthread_exit, exec, a member SIGKILLed while it
    # waits and while it claims, planted files, top's figures (check_share_hostile.py --real).
    p = subprocess.run([PY, os.path.join(HERE, "..", "integration", "check_share_hostile.py"), "--shim", SHIM,
                        "--sim-dir", empty, "--program", os.path.join(BIN, "prog_share"),
                        "--cupool", os.path.join(BUILD, "tools", "cupool"), "--real"],
                       capture_output=True, text=True, timeout=600)
    runs.append({"name": "share-hostile", "rc": p.returncode, "wall_s": 0, "stdout": p.stdout[-3000:],
                 "stderr": p.stderr[-3000:]})
    check("share-hostile: another PID namespace, pthread_exit, exec, killed while waiting or claiming, planted "
          "files, top's figures, on the GPU", p.returncode == 0, (p.stdout + p.stderr).strip()[-600:])
    # 8 processes racing for an 8 GiB budget, half in PID namespaces of their own (share_race.py).
    r = run("share-race", [PY, os.path.join(HERE, "share_race.py"), SHIM, os.path.join(BIN, "prog_share")],
            timeout=300)
    rows = [json.loads(l) for l in r["stdout"].splitlines() if l.startswith("{")]
    r["race"] = rows
    check("share-race: 8 racing members (4 in their own PID namespaces) never held more than the 8 GiB budget "
          "under passthrough, growth and vmm", r["rc"] == 0 and len(rows) == 3 and all(x.get("within_budget") for x in rows),
          "; ".join(f'{x.get("policy")}: {x.get("most_above_baseline_mib")} MiB' for x in rows))

# ---- Issue 14: several jobs, one budget ---------------------------------------------------------
# PyTorch trainings started together under fixed preallocated shares, per-process caps and one
# shared budget (examples/share/run_sharing.py writes sharing.json), and what joining a budget
# costs a new member with 1, 16 and 64 members (test/perf/bench_share_startup.cpp).
if wanted("sharing"):
    r = run("share-startup-cost", [os.path.join(BIN, "bench_share_startup"), "1,16,64", "200"], timeout=300)
    lines = [json.loads(l) for l in r["stdout"].splitlines() if l.startswith("{")]
    check("share-startup-cost: a new member joined and was admitted with 1, 16 and 64 members",
          r["rc"] == 0 and [l["members"] for l in lines] == [1, 16, 64],
          "; ".join(f'{l["members"]} members: median {l["total_us"]["median"]} us' for l in lines))
    p = subprocess.run([PY, os.path.join(HERE, "..", "..", "examples", "share", "run_sharing.py"), BUILD, WORKLOADS,
                        OUT], timeout=1500)
    check("sharing: every job and way of sharing ran as claimed", p.returncode == 0,
          f"run_sharing.py exited {p.returncode}")

# ---- Issue 14: NVML's memory queries inside the process agree with cudaMemGetInfo ----------------
# test/gpu/nvml_check.py: torch allocates, then NVML (by dlopen + dlsym, as pynvml does) and
# torch.cuda.mem_get_info are asked, without cupool, under a cap, and as a shared budget's member.
if wanted("nvml"):
    for name, extra in (("nvml-limit", ["--limit", "2GiB"]), ("nvml-share", ["--limit", "4GiB", "--share-limit", "1GiB"])):
        r = run(name, [PY, os.path.join(HERE, "nvml_check.py"), SHIM] + extra, timeout=300)
        got = last_json(r) or {}
        r["nvml"] = got
        print(f"   {name}: {json.dumps(got)[:400]}", flush=True)
        check(f"{name}: NVML's memory info under cupool is cudaMemGetInfo's, and the whole device without it",
              r["rc"] == 0 and got.get("ok") is True, json.dumps(got.get("failures", got))[:600])

# ---- Issue 16: the tools users already read: PyTorch's memory_viz, RMM's log, min-capacity ---------
# The reference transformer under cupool (takeover, growth) and examples/policies/train_varlen.py
# (takeover, growth): their traces exported for memory_viz (opened by torch.cuda._memory_viz,
# test/gpu/memviz_check.py) and as RMM's CSV (every allocation and free of the trace a row), and
# `cupool replay --min-capacity` per policy: the smallest device each fits in, beside peak live.
if wanted("memviz"):
    cupool_cmd = os.path.join(BUILD, "tools", "cupool")
    varlen = os.path.join(HERE, "..", "..", "examples", "policies", "train_varlen.py")
    nocache = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    for name, cmd in (("memviz-transformer-takeover-growth", [PY, TRANSFORMER]),
                      ("memviz-varlen-takeover-growth", [PY, varlen])):
        r = run(name, cmd, dict(nocache, MODE=name), shim={"CUPOOL_POLICY": "growth"}, timeout=300)
        if not traced(r):
            continue
        prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", name) + "."
        files = sorted(os.path.join(TRACES, f) for f in os.listdir(TRACES) if f.startswith(prefix))
        viz_dir = os.path.join(OUT, "memviz", name)
        p = subprocess.run([PY, os.path.join(HERE, "memviz_check.py"), "--cupool", cupool_cmd, "--out", viz_dir]
                           + sum((["--trace", f] for f in files), []), capture_output=True, text=True, timeout=600)
        got = results.last_json(p.stdout) or {}
        # The pages are large; the pickle and one page are what a reader opens.
        for f in os.listdir(viz_dir) if os.path.isdir(viz_dir) else []:
            if f.endswith("trace_plot_segments.html") or f.endswith("trace_plot.html"):
                os.unlink(os.path.join(viz_dir, f))
        r["memviz"] = got
        print(f"   memviz: {json.dumps(got)[:600]}", flush=True)
        check(f"{name}: --memory-viz export opened by torch.cuda._memory_viz (segment_plot, trace_plot, segsum)",
              p.returncode == 0 and got.get("ok") is True and all(t.get("segments", 0) > 0 for t in got["traces"]),
              (json.dumps(got.get("failures") or got.get("error")) + p.stderr[-300:])[:600])
        csv_path = os.path.join(TRACES, name + ".rmm.csv")
        p = subprocess.run([cupool_cmd, "export", "--rmm-csv", *files, "-o", csv_path, "--no-progress"],
                           capture_output=True, text=True, timeout=600)
        rows = {}
        header = ""
        if p.returncode == 0:
            with open(csv_path) as f:
                header = f.readline().strip()
                for line in f:
                    action = line.split(",")[2]
                    rows[action] = rows.get(action, 0) + 1
        t = r.get("trace") or {}
        allocs = sum(v for k, v in t.get("by_api", {}).items() if k.split(":")[0] == "alloc")
        r["rmm_csv"] = {"rc": p.returncode, "header": header, "rows": rows, "trace_allocs": allocs}
        print(f"   rmm-csv: {r['rmm_csv']}", flush=True)
        check(f"{name}: --rmm-csv has RMM's header and one allocate row per allocation of the trace",
              p.returncode == 0 and header == "Thread,Time,Action,Pointer,Size,Stream" and rows.get("allocate") == allocs
              and rows.get("free", 0) > 0, f"{r['rmm_csv']} {p.stderr[-300:]}")
        p = subprocess.run([cupool_cmd, "replay", "--json", "--no-progress", "--min-capacity", "--policy", "growth",
                            "--policy", "preallocate", "--policy", "vmm", *files], capture_output=True, text=True,
                           timeout=600)
        try:
            out = json.loads(p.stdout)
        except ValueError:
            out = None
        caps = {}
        for pol in (out or {}).get("policies", []):
            mc = pol.get("min_capacity") or {}
            caps[pol["policy"]] = {"bytes": mc.get("bytes"), "peak_requested": mc.get("peak_requested"),
                                             "fits": mc.get("fits"), "probes": mc.get("probes")}
        r["min_capacity"] = {"rc": p.returncode, "policies": caps}
        print(f"   min-capacity: {r['min_capacity']}", flush=True)
        check(f"{name}: replay --min-capacity found the smallest device for growth, preallocate and vmm",
              out is not None and len(caps) == 3 and all(c["bytes"] and c["peak_requested"] for c in caps.values()),
              f"rc {p.returncode} {caps} {p.stderr[-300:]}")

# ---- Issue 15: the vmm policy against chunked growth and the frameworks' own allocators ----------
# train_varlen.py (shapes vary every step) under PyTorch's caching allocator, its expandable
# segments, cupool's growth and cupool's vmm policy (examples/policies/run_policies.py, a few of its
# experiments); the reference transformer and JAX's MLP (platform allocator) under growth and vmm;
# the pool-hit pair cost under both, side by side.
if wanted("vmmpolicy"):
    names = ["pt-caching-nocupool-1", "pt-expandable-nocupool", "pt-takeover-growth-1", "pt-takeover-growth-sync",
             "pt-takeover-vmm-1", "pt-takeover-vmm-sync"]
    vm_out = os.path.join(OUT, "vmmpolicy")
    p = subprocess.run([PY, os.path.join(HERE, "..", "..", "examples", "policies", "run_policies.py"), BUILD, vm_out],
                       env=dict(os.environ, RUN_POLICIES_ONLY=",".join(names), RUN_POLICIES_REPEAT="1",
                                RUN_POLICIES_TRACES=os.path.join(TRACES, "vmmpolicy")), timeout=900)
    got = {}
    if os.path.exists(os.path.join(vm_out, "policies.json")):
        got = {r["name"]: r for r in json.load(open(os.path.join(vm_out, "policies.json")))["runs"]}
    for name in names:
        r = got.get(name) or {}
        procs = r.get("processes") or []
        rep = r.get("report")
        ok = bool(procs) and all(x["rc"] == 0 for x in procs)
        if "nocupool" not in name:  # under cupool: its trace was read
            ok = ok and isinstance(rep, list) and len(rep) > 0 and all(d.get("peak_reserved") for d in rep)
        check(f"vmmpolicy {name}: ran" + ("" if "nocupool" in name else ", and its trace was reported"), ok,
              json.dumps({"processes": [{"rc": x["rc"], "result": x["result"]} for x in procs], "report": rep})[:500])
    nocache = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    transformer_runs(
        run("vmmpolicy-transformer-caching-1-nocupool", TRANSFORMER_WITH_STATS, {"MODE": "caching"}),
        run("vmmpolicy-transformer-caching-2-nocupool", TRANSFORMER_WITH_STATS, {"MODE": "caching"}),
        # The runs under cupool take every tensor from it (PyTorch's cache off): the same setting
        # without cupool is their like-for-like (its exact loss is the one they are held to).
        run("vmmpolicy-transformer-nocache-nocupool", TRANSFORMER_WITH_STATS, dict(nocache, MODE="nocache")),
        run("vmmpolicy-transformer-takeover-growth", TRANSFORMER_WITH_STATS, dict(nocache, MODE="growth"),
            shim={"CUPOOL_POLICY": "growth"}),
        run("vmmpolicy-transformer-takeover-vmm", TRANSFORMER_WITH_STATS, dict(nocache, MODE="vmm"),
            shim={"CUPOOL_POLICY": "vmm"}))
    platform = {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}
    jx = [run("vmmpolicy-jax-platform-nocupool", [PY, JAX_MLP], dict(platform, MODE="platform")),
          run("vmmpolicy-jax-platform-growth", [PY, JAX_MLP], dict(platform, MODE="growth"), shim={"CUPOOL_POLICY": "growth"}),
          run("vmmpolicy-jax-platform-vmm", [PY, JAX_MLP], dict(platform, MODE="vmm"), shim={"CUPOOL_POLICY": "vmm"})]
    for r in runs:
        if r["name"].startswith("vmmpolicy-") and "nocupool" not in r["name"]:
            traced(r)
    for r in jx:
        check(f'{r["name"]}: ran', r["rc"] == 0, r["stderr"][-300:])
    # The pool-hit pair cost, growth and vmm in three alternating rounds (the host's noise moves
    # single runs by some nanoseconds): the median of the rounds' 64 MiB, 8-thread medians.
    exe = os.path.join(BIN, "bench_alloc")
    pair = {"growth": [], "vmm": []}
    for i in (1, 2, 3):
        for pol in pair:
            r = run(f"vmmpolicy-bench-round{i}-{pol}-deferred-trace-off", [exe, "malloc", f"round {i}: cupool {pol} deferred, trace off"],
                    shim={"CUPOOL_POLICY": pol, "CUPOOL_FREE": "deferred", "CUPOOL_TRACE": ""})
            pair[pol].append(last_json(r).get("median_ns"))
            check(f'{r["name"]}: ran and measured', r["rc"] == 0 and last_json(r).get("median_ns") is not None)
    med = {p: statistics.median(v) for p, v in pair.items() if v and all(x is not None for x in v)}
    print(f"   vmmpolicy pair cost (64 MiB, 8 threads), median of 3 rounds (ns): {med}", flush=True)

# ---- Issue 29: the default policy, decided by data: growth against vmm ---------------------------
# Every workload under each policy in three alternating rounds (the order flips each round, so the
# host's drift falls on both alike), every tensor through cupool (the frameworks' caches off):
# the reference transformer, train_varlen.py (shapes that vary: where growth fragments), JAX's
# MLP (XLA's platform allocator), a CuPy workload (test/gpu/cupy_steps.py) and a Hugging Face
# GPT-2 trained from a config (test/gpu/hf_steps.py). Per workload and policy: min / median / max of the step, and,
# from each run's trace, the peak reserved against the peak in use, of the pool and of everything
# (the pool plus the memory outside it, which XLA's cuMemCreate buffers are).
if wanted("defaultpolicy"):
    varlen = os.path.join(HERE, "..", "..", "examples", "policies", "train_varlen.py")
    nocache = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    platform = {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    median_step = lambda r: (last_json(r) or {}).get("median_step_ms")
    workloads = {
        "transformer": (TRANSFORMER_WITH_STATS, nocache, lambda r: parse_float(r"step=([0-9.]+) ms", r["stdout"])),
        "varlen": ([PY, varlen], nocache, median_step),
        "jaxmlp": ([PY, JAX_MLP], platform, lambda r: parse_float(r"step=([0-9.]+) ms", r["stdout"])),
        # Issue 39 asks for CuPy and a Hugging Face model too (both with their caches off).
        "cupy": ([PY, os.path.join(HERE, "cupy_steps.py")], {}, median_step),
        "hf": ([PY, os.path.join(HERE, "hf_steps.py")], nocache, median_step),
    }
    # Results that differ from run to run without cupool too are held to a tolerance, not to
    # equality: train_varlen.py's loss (runZ6: 0x1.e099bc and 0x1.e099b8 in two runs without
    # cupool), the GPT-2 model's loss (its embedding's backward adds with atomics) and CuPy's
    # checksum (a float64 sum of reductions whose order the library may choose).
    tolerance = {"varlen": ("loss", 1e-5), "hf": ("loss", 1e-4), "cupy": ("checksum", 1e-6)}
    # The transformer's exact loss depends on PyTorch's cache (on or off), not on cupool: its runs
    # are held to the losses of these two runs without cupool (check_transformer_losses).
    # CUPOOL_GPU_DEFAULTPOLICY_REFS=0 (the docs run, where group compat or steps runs in the same call
    # and runs the transformer without cupool in both cache modes): no runs of its own.
    if os.environ.get("CUPOOL_GPU_DEFAULTPOLICY_REFS", "1") != "0":
        transformer_runs(run("defaultpolicy-transformer-caching-nocupool", TRANSFORMER_WITH_STATS, {"MODE": "caching"}),
                         run("defaultpolicy-transformer-nocache-nocupool", TRANSFORMER_WITH_STATS,
                             dict(nocache, MODE="nocache")))
    table = {}
    for i in (1, 2, 3):
        order = ("growth", "vmm") if i % 2 else ("vmm", "growth")
        for wl, (cmd, env, step_of) in workloads.items():
            for pol in order:
                r = run(f"defaultpolicy-round{i}-{wl}-{pol}", cmd, dict(env, MODE=pol), shim={"CUPOOL_POLICY": pol},
                        timeout=300)
                if wl == "transformer":
                    transformer_runs(r)
                t = r.get("trace") or {}
                res = exact(r) if wl not in tolerance else (last_json(r) or {}).get(tolerance[wl][0])
                table.setdefault((wl, pol), []).append({
                    "rc": r["rc"], "step_ms": step_of(r), "result": res,
                    "pool_in_use": t.get("peak_in_use"), "pool_reserved": t.get("peak_reserved"),
                    "outside": t.get("peak_external"),
                    # Where a policy's time goes: the pool's own driver calls (chunks or granules
                    # taken and given back, fences retired), counted and timed.
                    "pool_events": {k: v for k, v in t.get("by_api", {}).items()
                                    if k.split(":")[0] in ("grow", "release", "fence_retired", "vmm_release")},
                    "host_us": {k: v for k, v in t.get("host_us_by_api", {}).items()
                                if k.split(":")[0] in ("grow", "release", "alloc", "free")}})
    def mmm(v):
        v = [x for x in v if x is not None]
        return (min(v), statistics.median(v), max(v)) if v else None
    summary = {}
    print("   defaultpolicy: step ms (min / median / max of 3 rounds); peak reserved / peak in use of the pool", flush=True)
    for wl in workloads:
        for pol in ("growth", "vmm"):
            rows = table.get((wl, pol), [])
            ratios = [x["pool_reserved"] / x["pool_in_use"] for x in rows if x["pool_in_use"] and x["pool_reserved"]]
            summary[f"{wl}-{pol}"] = {"step_ms": mmm([x["step_ms"] for x in rows]), "reserved_over_in_use": mmm(ratios),
                                      "pool_reserved_mib": mmm([x["pool_reserved"] / 2**20 for x in rows if x["pool_reserved"]]),
                                      "outside_peak_mib": mmm([x["outside"] / 2**20 for x in rows if x["outside"] is not None])}
            print(f"   {wl:12s} {pol:7s} {summary[f'{wl}-{pol}']}", flush=True)
            for x in rows:
                print(f"      pool events {x['pool_events']}; host us {x['host_us']}", flush=True)
            check(f"defaultpolicy {wl} {pol}: all 3 rounds ran, measured a step and were traced",
                  len(rows) == 3 and all(x["rc"] == 0 and x["step_ms"] is not None and x["pool_in_use"] for x in rows),
                  json.dumps(rows)[:600])
        g, v = summary[f"{wl}-growth"]["step_ms"], summary[f"{wl}-vmm"]["step_ms"]
        if g and v:
            print(f"   {wl}: vmm / growth, ratio of median steps {v[1] / g[1]:.4f}", flush=True)
        if wl == "transformer":
            continue
        if wl in tolerance:
            key, tol = tolerance[wl]
            got = [x["result"] for pol in ("growth", "vmm") for x in table.get((wl, pol), [])]
            check(f"defaultpolicy {wl}: every round's {key} within {tol} of the others under growth and vmm (the "
                  "workload's own run-to-run spread; its exact value is not reproducible without cupool either)",
                  len(got) == 6 and None not in got and max(got) - min(got) <= tol, str(got))
            continue
        results_seen = {x["result"] for pol in ("growth", "vmm") for x in table.get((wl, pol), [])}
        check(f"defaultpolicy {wl}: the same result under growth and vmm in every round", len(results_seen) == 1
              and None not in results_seen, str(sorted(map(str, results_seen))))
    json.dump(summary, open(os.path.join(OUT, "defaultpolicy.json"), "w"), indent=1)

# ---- Issue 16: who allocated it: native stacks at allocation (CUPOOL_TRACE_STACKS) --------------
# The pool-hit pair cost with the trace on and stacks off, on (one allocation in 64) and all, in
# alternating rounds; the reference transformer (every tensor through cupool) and JAX's MLP with
# stacks off, on and all: the step time, and that the stacks name the frameworks' libraries, in
# the trace, in `cupool report` and in the memory_viz export (opened by torch.cuda._memory_viz; a
# smaller export is kept for the headless-Chromium check of docs/cli.md).
if wanted("stacks"):
    cupool_cmd = os.path.join(BUILD, "tools", "cupool")
    exe = os.path.join(BIN, "bench_alloc")
    pair = {"off": [], "on": [], "all": []}
    for i in (1, 2, 3):
        for mode in pair:
            r = run(f"stacks-round{i}-{mode}", [exe, "malloc", f"round {i}: cupool growth deferred, trace on, stacks {mode}"],
                    shim={"CUPOOL_POLICY": "growth", "CUPOOL_FREE": "deferred", "CUPOOL_TRACE_BUFFER": "1048576",
                          "CUPOOL_TRACE_STACKS": mode}, summary=False)
            pair[mode].append(last_json(r).get("median_ns"))
            t = r.get("trace") or {}
            want = {"off": t.get("allocs_with_stack") == 0,
                    "on": 0 < (t.get("allocs_with_stack") or 0) < t.get("allocs", 0) / 16,
                    "all": t.get("allocs_with_stack") == t.get("allocs") and t.get("allocs", 0) > 0}[mode]
            check(f'{r["name"]}: ran and measured, stacks as asked', r["rc"] == 0 and last_json(r).get("median_ns")
                  is not None and want, f'{t.get("allocs_with_stack")} of the first {t.get("allocs")} allocations '
                  f'with a stack')
    med = {m: statistics.median(v) for m, v in pair.items() if v and all(x is not None for x in v)}
    print(f"   stacks pair cost, median of rounds (ns): {med}", flush=True)
    check("stacks: the trace-on pair cost with CUPOOL_TRACE_STACKS=on stays under 0.5 us (median of 3 rounds)",
          med.get("on") is not None and med["on"] < 500, json.dumps(med))

    nocache = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    platform = {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}
    tr, jx = {}, {}
    for mode in ("off", "on", "all"):
        tr[mode] = run(f"stacks-transformer-takeover-{mode}", TRANSFORMER_WITH_STATS, dict(nocache, MODE=f"stacks {mode}"),
                       shim={"CUPOOL_POLICY": "growth", "CUPOOL_TRACE_STACKS": mode})
        jx[mode] = run(f"stacks-jax-platform-{mode}", [PY, JAX_MLP], dict(platform, MODE=f"stacks {mode}"),
                       shim={"CUPOOL_POLICY": "growth", "CUPOOL_TRACE_STACKS": mode})
    # (The transformer's exact loss is checked by the groups that run it without cupool beside it.)
    same_result("jax_mlp_step: the same weights with stacks off, on and all", jx["off"], jx["on"], jx["all"])
    for framework, runs_of, libs in (("transformer", tr, ("libc10", "libtorch")), ("jax", jx, ("xla", "jaxlib"))):
        for mode, r in runs_of.items():
            traced(r)
        t = runs_of["all"].get("trace") or {}
        mods = t.get("stack_modules", {})
        named = {m: n for m, n in mods.items() if any(lib in m for lib in libs)}
        r = runs_of["all"]
        r["stack_modules_top"] = dict(sorted(mods.items(), key=lambda kv: -kv[1])[:12])
        check(f'{r["name"]}: every allocation has a stack, and frames lie in {"/".join(libs)}',
              t.get("allocs", 0) > 0 and t.get("allocs_with_stack") == t.get("allocs") and named,
              f'{t.get("allocs_with_stack")} of {t.get("allocs")} allocations, {t.get("stack_lines")} stacks; '
              f'modules {json.dumps(r["stack_modules_top"])[:400]}')
        prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", r["name"]) + "."
        files = sorted(os.path.join(TRACES, f) for f in os.listdir(TRACES) if f.startswith(prefix))
        if not files:
            continue
        p = subprocess.run([cupool_cmd, "report", "--no-progress", *files], capture_output=True, text=True, timeout=600)
        section = p.stdout.split("stacks of the largest allocations", 1)
        shown = section[1].split("\n  out of memory", 1)[0] if len(section) == 2 else ""
        r["report_stacks"] = ("stacks of the largest allocations" + shown)[:4000]
        check(f'{r["name"]}: cupool report shows the largest allocations\' stacks, in {"/".join(libs)}',
              p.returncode == 0 and any(lib in shown for lib in libs), (p.stderr or shown)[-400:])
        if framework == "transformer":
            viz = os.path.join(OUT, "stacks")
            os.makedirs(viz, exist_ok=True)
            p = subprocess.run([PY, os.path.join(HERE, "memviz_check.py"), "--cupool", cupool_cmd, "--frames-like", "libc10"]
                               + sum((["--trace", f] for f in files), []), capture_output=True, text=True, timeout=600)
            got = results.last_json(p.stdout) or {}
            r["memviz"] = got
            check(f'{r["name"]}: the memory_viz export carries the frames, and torch.cuda._memory_viz opens it',
                  p.returncode == 0 and got.get("ok") is True, json.dumps(got)[:600])
            # For the headless-Chromium check of MemoryViz.js (docs/cli.md): the last entries only.
            p = subprocess.run([cupool_cmd, "export", "--memory-viz", "--max-entries", "3000", "--no-progress", *files,
                                "-o", os.path.join(viz, "transformer-stacks.pickle")], capture_output=True, text=True,
                               timeout=600)
            check(f'{r["name"]}: a 3000-entry export for the page', p.returncode == 0, p.stderr[-300:])
    steps = {f"{fw}-{mode}": parse_float(r"step=([\d.]+) ms", rr["stdout"]) for fw, runs_of in (("transformer", tr), ("jax", jx))
             for mode, rr in runs_of.items()}
    print(f"   stacks step ms: {steps}", flush=True)

# ---- Issue 15: what the driver's virtual-memory calls cost (test/gpu/bench_vmm_calls.cu) -------------
# Per call and per size, and a run of 2 MiB granules made, moved and given back as the vmm policy
# does, with the device idle and with a kernel queued (a call that waits for the device shows it).
if wanted("vmmcalls"):
    r = run("vmmcalls", [os.path.join(BIN, "bench_vmm_calls")], timeout=300, keep=100_000)
    rows = [json.loads(l) for l in r["stdout"].splitlines() if l.startswith("{")]
    r["rows"] = [x for x in rows if "what" in x]
    for x in r["rows"]:
        print(f'   {x["what"]:>14} {x["bytes"] >> 20:>5} MiB {x["granules"]:>4} granules: {x["median_ns"] / 1e3:9.1f} us',
              flush=True)
    check("vmmcalls: ran to the end and measured every call", r["rc"] == 0 and any(x.get("done") for x in rows)
          and len(r["rows"]) >= 5 * 6 + 3 * 4, f'rc {r["rc"]}, {len(r["rows"])} rows {r["stderr"][-300:]}')

# ---- Issue 29: CUDA IPC of the vmm policy's blocks ----------------------------------------------
# torch.multiprocessing (test/gpu/ipc_check.py: spawn, a tensor inside a block that is not the
# first), NVIDIA simpleIPC's pattern and a shared block's lifetimes (test/gpu/simple_ipc.cu: N
# children writing their parts, double close, the exporter freeing while an importer maps, the
# exporter exiting, an importer without cupool) and a CuPy round trip (test/gpu/cupy_ipc_check.py):
# each without cupool (the driver's own behaviour, recorded as the reference), under growth (the
# control: pool blocks shared since issue 2's IPC work) and under vmm in both free modes. Every vmm
# run is held to the exporter's own trace: the shared block is a pool block with granules mapped
# behind it ('grow' events with "granules"), not the first block of the pool's range, and the
# refusal that vmm gave before is not in its log. Then what asking for shareable handle types at
# cuMemCreate costs (bench_vmm_calls handle-types). Every error code seen goes to OUT/vmmipc.json.
if wanted("vmmipc"):
    VMM_REFUSAL = "cannot share a block of the vmm policy"
    ipc_configs = {"nocupool": None, "growth": {"CUPOOL_POLICY": "growth"},
                   "vmm-deferred": {"CUPOOL_POLICY": "vmm", "CUPOOL_FREE": "deferred"},
                   "vmm-sync": {"CUPOOL_POLICY": "vmm", "CUPOOL_FREE": "sync"}}
    ipc_out = {"torch": {}, "simple_ipc": {}, "cupy": {}, "error_codes": {}, "bench": None}

    def ipc_addr(x):
        return int(x, 16) if isinstance(x, str) else x

    def ipc_rc(x):
        """The rc of a {"rc": N, "name": ...} result; None where there is none."""
        return x.get("rc") if isinstance(x, dict) else None

    def ipc_code(key, x):
        """Records an error code a case saw (rc and name, or CuPy's status and text)."""
        if isinstance(x, dict):
            ipc_out["error_codes"][key] = f'{x.get("rc", x.get("status"))} {x.get("name", x.get("text", ""))}'.strip()

    def ipc_trace(run_name, pid):
        """The header and the events, in time order, of one process's trace in a run."""
        path = os.path.join(TRACES, re.sub(r"[^A-Za-z0-9_.-]", "_", run_name) + f".{pid}.jsonl")
        header, events = {}, []
        if pid is None or not os.path.exists(path):
            return header, events
        for line in open(path, encoding="utf-8", errors="replace"):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("type") == "header":
                header = rec
            elif rec.get("type") == "event":
                events.append(rec)
        events.sort(key=lambda e: e["t"])
        return header, events

    def ipc_block(run_name, pid, ptr, policy):
        """What the exporter's own trace says of the pool block holding ptr: (ok, facts). ok: the
        trace is the policy's, a pool block (an alloc event with the pool's keys) holds ptr, and an
        earlier pool block lies below it; under vmm also: granules were mapped behind the whole
        block and the block does not start the range (the lowest granule mapped)."""
        header, events = ipc_trace(run_name, pid)
        ptr = ipc_addr(ptr)
        facts = {"pid": pid, "trace": bool(header), "policy": (header.get("config") or {}).get("policy")}
        pooled = [e for e in events if e["ev"] == "alloc" and e.get("rc", 0) == 0 and "reserved" in e]
        holding = [e for e in pooled if ptr is not None and ipc_addr(e["ptr"]) <= ptr < ipc_addr(e["ptr"]) + e["size"]]
        if not holding:
            return False, dict(facts, block=None)
        blk = holding[-1]
        base, size = ipc_addr(blk["ptr"]), blk["size"]
        below = [e for e in pooled if e["t"] < blk["t"] and ipc_addr(e["ptr"]) < base]
        facts.update(block=hex(base), block_bytes=size, offset_in_block=ptr - base, blocks_below=len(below))
        ok = facts["policy"] == policy and len(below) >= 1
        if policy == "vmm":
            spans = sorted((ipc_addr(e["ptr"]), ipc_addr(e["ptr"]) + e["size"]) for e in events
                           if e["ev"] == "grow" and e.get("granules") and e.get("rc", 0) == 0)
            merged = []
            for lo, hi in spans:
                if merged and lo <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], hi)
                else:
                    merged.append([lo, hi])
            facts["granule_grows"] = len(spans)
            facts["range_low"] = hex(spans[0][0]) if spans else None
            facts["granules_behind_block"] = any(lo <= base and base + size <= hi for lo, hi in merged)
            ok = ok and facts["granules_behind_block"] and bool(spans) and base > spans[0][0]
        return ok, facts

    def importer_events(run_name, pid):
        """Events of an importer's trace that name IPC (informational: the trace format has none yet)."""
        _, events = ipc_trace(run_name, pid)
        n = {}
        for e in events:
            if "ipc" in (e.get("ev", "") + e.get("api", "")).lower():
                k = f'{e["ev"]}:{e["api"]}:rc{e.get("rc", 0)}'
                n[k] = n.get(k, 0) + 1
        return n

    def held_to_trace(r, what, pid, ptr, cfg, inside=False):
        """Under cupool: the block shared was the policy's kind, and not the first; under vmm also
        the old refusal is not in the log. inside: the shared address also lies inside its block."""
        policy = "vmm" if cfg.startswith("vmm") else "growth"
        ok, facts = ipc_block(r["name"], pid, ptr, policy)
        if inside:
            ok = ok and (facts.get("offset_in_block") or 0) > 0
        r.setdefault("ipc_blocks", {})[what] = facts
        check(f'{r["name"]}: the trace shows the {what} was a {policy} pool block, not the first'
              + (" (granules mapped behind it, above the range's start)" if policy == "vmm" else "")
              + (", and lay inside it" if inside else ""), ok, json.dumps(facts))
        if policy == "vmm":
            check(f'{r["name"]}: no vmm IPC refusal in the log', VMM_REFUSAL not in (r["stderr"] or ""),
                  (r["stderr"] or "")[-300:])

    # 1. torch.multiprocessing, spawn; one more vmm run with PyTorch's cache off (every tensor its
    # own cudaMalloc, as cupool run --takeover does). PyTorch's own code refuses to share a tensor
    # with its cache off: its uncached path keeps no block record, and the caching allocator's
    # shareIpcHandle answers "invalid device pointer" (the vmm run at b3e56e8 raised exactly that,
    # docs/gpu-runs/2026-12-02-runZ8-vmmipc-run.log; see also pytorch/pytorch#114534). So that run
    # is held to the same run without cupool: the same outcome, not success.
    torch_cfgs = dict(ipc_configs, **{"nocupool-nocache": None, "vmm-deferred-nocache": ipc_configs["vmm-deferred"]})
    torch_seen = {}
    for cfg, shim in torch_cfgs.items():
        env = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"} if cfg.endswith("nocache") else {}
        r = run(f"vmmipc-torch-{cfg}", [PY, os.path.join(HERE, "ipc_check.py")], env, shim=shim, timeout=180)
        j = last_json(r)
        ok = (r["rc"] == 0 and j.get("same") is True and j.get("child_write_seen") is True
              and j.get("other_tensor_untouched") is True and j.get("error") is None and j.get("child_exit") == 0)
        torch_seen[cfg] = (ok, "invalid device pointer" in (r["stderr"] or "") + json.dumps(j))
        if cfg.endswith("nocache"):
            base = torch_seen.get("nocupool-nocache")
            check(f'{r["name"]}: as without cupool with PyTorch\'s cache off (shared, or refused by PyTorch with '
                  f'"invalid device pointer" in both)', base is not None and torch_seen[cfg] == base and (ok or base[1]),
                  json.dumps({"this": torch_seen[cfg], "without_cupool": base, "result": j})[:700])
        else:
            check(f'{r["name"]}: the spawned child read the shared tensor, and its in-place add landed in it and in '
                  f'no other tensor', ok, json.dumps(j)[:700] + ("" if ok else " " + (r["stderr"] or "")[-400:]))
        if shim and ok:
            held_to_trace(r, "tensor's block", j.get("pid"), j.get("ptr"), cfg, inside=j.get("caching", False))
            r["importer_ipc_events"] = importer_events(r["name"], j.get("child_pid"))
        ipc_out["torch"][cfg] = {"ok": ok, "result": j, "blocks": r.get("ipc_blocks"),
                                 "importer_ipc_events": r.get("importer_ipc_events")}
        if cfg.startswith("vmm"):
            check(f'{r["name"]}: the driver says the shared memory is not cuMemAlloc\'d (legacy IPC capable 0)',
                  (j.get("driver") or {}).get("legacy_ipc_capable") != 1, json.dumps(j.get("driver")))

    # 2. simpleIPC's pattern and the lifetimes (test/gpu/simple_ipc.cu, 4 children).
    simple_ref = {}
    for cfg, shim in ipc_configs.items():
        r = run(f"vmmipc-simple-{cfg}", [os.path.join(BIN, "simple_ipc"), "4"], shim=shim, timeout=240, keep=30000)
        j = last_json(r)
        vmm = cfg.startswith("vmm")
        if cfg == "nocupool":
            simple_ref = j
        s = j.get("simple") or {}
        kids = s.get("results") or []
        ok = (r["rc"] == 0 and ipc_rc(j.get("get")) == 0 and ipc_rc(j.get("driver_get")) == 0 and len(kids) == 4
              and s.get("bad_words") == 0
              and j.get("first_bad") == 0 and s.get("exits") == ["exit 0"] * 4
              and all(isinstance(k, dict) and ipc_rc(k.get("open")) == 0 and k.get("fill_bad") == 0
                      and ipc_rc(k.get("kernel")) == 0 and ipc_rc(k.get("close")) == 0 for k in kids))
        check(f'{r["name"]}: 4 children opened the handle (2 by the runtime API, 2 by the driver API), saw the parent\'s '
              f'fill, each wrote its part by a kernel and closed; the parent saw every word, and its other block unchanged', ok,
              json.dumps({k: j.get(k) for k in ("get", "driver_get", "driver_handle_same", "first_ptr", "shared_ptr",
                                                "first_bad", "exporter_driver")})
              + " " + json.dumps(s)[:600] + ("" if ok else " " + (r["stderr"] or "")[-400:]))
        ipc_code(f"{cfg}: cudaIpcGetMemHandle", j.get("get"))
        ipc_code(f"{cfg}: cuIpcGetMemHandle", j.get("driver_get"))
        d = (j.get("double") or {}).get("result") or {}
        ipc_code(f"{cfg}: second cudaIpcCloseMemHandle", d.get("close2"))
        ref2 = ipc_rc((((simple_ref.get("double") or {}).get("result")) or {}).get("close2"))
        check(f'{r["name"]}: a second close of the same mapping returns an error (or what the driver returns), and the '
              f'process goes on', ipc_rc(d.get("close1")) == 0 and ipc_rc(d.get("sync_after")) == 0
              and (j.get("double") or {}).get("exit") == "exit 0"
              and (ipc_rc(d.get("close2")) not in (None, 0) or (cfg != "nocupool" and ipc_rc(d.get("close2")) == ref2)),
              json.dumps(j.get("double")) + f" (without cupool: {ref2})")
        p = (j.get("plain") or {}).get("result") or {}
        ipc_code(f"{cfg}: cudaIpcOpenMemHandle in a process without cupool", p.get("open"))
        opened = ipc_rc(p.get("open")) == 0
        check(f'{r["name"]}: a process without cupool given the handle ' + ("is refused with a CUDA error, " if vmm else "")
              + "does not crash and never sees the wrong memory",
              (j.get("plain") or {}).get("exit") == "exit 0" and p.get("ld_preload") == "" and p.get("open") is not None
              and ipc_rc(p.get("sync_after")) == 0 and (not opened or p.get("first_words_bad") == 0) and not (vmm and opened),
              json.dumps(j.get("plain")))
        f = j.get("freed") or {}
        ipc_code(f"{cfg}: exporter frees while imported, importer's close", (f.get("kept") or {}).get("close"))
        freed_ok = (ipc_rc(f.get("get")) == 0 and ipc_rc((f.get("opened") or {}).get("open")) == 0
                    and (f.get("opened") or {}).get("fill_bad") == 0 and ipc_rc(f.get("free")) == 0
                    and ipc_rc((f.get("written") or {}).get("write")) == 0 and (f.get("written") or {}).get("written_bad") == 0
                    and f.get("next_sees_importer_words") == 0 and (f.get("kept") or {}).get("kept_bad") == 0
                    and ipc_rc((f.get("kept") or {}).get("close")) == 0 and f.get("next_after_close_bad") == 0
                    and f.get("exit") == "exit 0")
        o = j.get("orphan") or {}
        oc = o.get("checked") or {}
        ipc_code(f"{cfg}: importer reads after the exporter exited", oc.get("after_exit_copy"))
        ipc_code(f"{cfg}: importer writes after the exporter exited", oc.get("write"))
        orphan_ok = (ipc_rc((o.get("exporter") or {}).get("get")) == 0 and ipc_rc((o.get("opened") or {}).get("open")) == 0
                     and (o.get("opened") or {}).get("fill_bad") == 0 and o.get("exporter_exit") == "exit 0"
                     and oc.get("after_exit_bad") == 0 and ipc_rc(oc.get("write")) == 0 and oc.get("written_bad") == 0
                     and ipc_rc(oc.get("close")) == 0 and o.get("importer_exit") == "exit 0")
        if vmm:
            check(f'{r["name"]}: the exporter frees while the importer maps: the importer\'s words stay, and the '
                  f'exporter\'s next allocation neither sees them nor is changed by them', freed_ok, json.dumps(f)[:900])
            check(f'{r["name"]}: the exporter exits while the importer maps: the importer still reads, writes and closes it',
                  orphan_ok, json.dumps(o)[:900])
            held_to_trace(r, "simple case's buffer", j.get("pid"), j.get("shared_ptr"), cfg)
            ex = o.get("exporter") or {}
            ok_o, facts_o = ipc_block(r["name"], ex.get("pid"), ex.get("ptr"), "vmm")
            r.setdefault("ipc_blocks", {})["orphan exporter's block"] = facts_o
            check(f'{r["name"]}: the trace of the exiting exporter shows its shared block was a vmm pool block, not the first',
                  ok_o, json.dumps(facts_o))
            r["importer_ipc_events"] = importer_events(r["name"], (kids[0] if kids and isinstance(kids[0], dict) else {}).get("pid"))
        else:
            if shim:
                held_to_trace(r, "simple case's buffer", j.get("pid"), j.get("shared_ptr"), cfg)
            # The reference (the driver's own IPC) and the control (a growth block freed while
            # open may be reused: README's known limits) are recorded, not held to vmm's rule.
            print(f"   {r['name']}: freed while mapped {'as vmm must' if freed_ok else 'NOT as vmm must'}; "
                  f"exporter exit {'as vmm must' if orphan_ok else 'NOT as vmm must'} (recorded, not checked)", flush=True)
        ipc_out["simple_ipc"][cfg] = {"simple_ok": ok, "freed_as_vmm_must": freed_ok, "orphan_as_vmm_must": orphan_ok,
                                      "result": j, "blocks": r.get("ipc_blocks")}

    # 3. CuPy: ipcGetMemHandle / ipcOpenMemHandle between two processes.
    cupy_ref = {}
    for cfg, shim in ipc_configs.items():
        r = run(f"vmmipc-cupy-{cfg}", [PY, os.path.join(HERE, "cupy_ipc_check.py")], shim=shim, timeout=180)
        j = last_json(r)
        c = j.get("child") or {}
        if cfg == "nocupool":
            cupy_ref = c
        ok = (r["rc"] == 0 and j.get("get") == 0 and j.get("same") is True and j.get("child_write_seen") is True
              and j.get("other_arrays_untouched") is True and "error" not in j and "error" not in c
              and c.get("close") == 0 and c.get("sync_after") == 0 and j.get("child_exit") == 0)
        check(f'{r["name"]}: the other process opened the CuPy array\'s handle, read it, added 1 in place and closed it; '
              f'the change landed in that array only', ok, json.dumps(j)[:700] + ("" if ok else " " + (r["stderr"] or "")[-400:]))
        again = (c.get("close_again") or {}).get("status")
        ipc_code(f"{cfg}: CuPy's second ipcCloseMemHandle", c.get("close_again"))
        ref_again = (cupy_ref.get("close_again") or {}).get("status")
        check(f'{r["name"]}: a second close is an error (or what the driver returns)',
              again not in (None, 0) or (cfg != "nocupool" and again == ref_again),
              f"{c.get('close_again')} (without cupool: {ref_again})")
        if shim:
            held_to_trace(r, "array's block", j.get("pid"), j.get("ptr"), cfg)
            r["importer_ipc_events"] = importer_events(r["name"], c.get("pid"))
        ipc_out["cupy"][cfg] = {"ok": ok, "result": j, "blocks": r.get("ipc_blocks")}

    # 4. What asking for shareable handle types at cuMemCreate costs (no cupool: the driver's calls).
    r = run("vmmipc-bench-handle-types", [os.path.join(BIN, "bench_vmm_calls"), "handle-types", "7", "200"], timeout=240)
    b = next((x for x in (json.loads(l) for l in r["stdout"].splitlines() if l.startswith("{"))
              if x.get("bench") == "vmm_handle_types"), {})
    ipc_out["bench"] = b
    kinds = b.get("kinds") or {}

    def measured(k, key="cycle_ns"):
        return ((kinds.get(k) or {}).get(key) or {}).get("rounds", 0) >= 5

    for k, v in kinds.items():
        print(f'   handle types {k:9s} {v.get("state")}: cycle {v.get("cycle_ns")}; create {v.get("create_ns")}; '
              f'export {v.get("export_ns")}; import {v.get("import_ns")}', flush=True)
    print(f'   cycle / cycle without handle types: {b.get("cycle_over_none")}', flush=True)
    fab = (kinds.get("fabric") or {}).get("state", "")
    check("vmmipc-bench-handle-types: cuMemCreate..cuMemRelease of a 2 MiB granule measured in >= 5 alternating "
          "rounds without handle types and with POSIX file descriptors (and their export), fabric measured or its "
          "refusal recorded", r["rc"] == 0 and measured("none") and measured("posix_fd")
          and measured("posix_fd", "export_ns") and (measured("fabric") if fab == "measured" else bool(fab)),
          json.dumps(b)[:900] + " " + r["stderr"][-300:])
    json.dump(ipc_out, open(os.path.join(OUT, "vmmipc.json"), "w"), indent=1)
    print("   vmmipc error codes seen:", flush=True)
    for k, v in ipc_out["error_codes"].items():
        print(f"      {k}: {v}", flush=True)

# ---- Issue 15: peer access to the vmm policy's blocks (two GPUs) -----------------------------------
# test/gpu/peer_check.cu: device 1 enables peer access to device 0 and a kernel on it adds to
# two of device 0's blocks (allocated before and after the enabling). Fails on one GPU: the check
# did not run what it claims.
if wanted("peer"):
    exe = os.path.join(BIN, "peer_check")
    for name, shim in (("peer-nocupool", None), ("peer-growth", {"CUPOOL_POLICY": "growth"}),
                       ("peer-vmm-deferred", {"CUPOOL_POLICY": "vmm", "CUPOOL_FREE": "deferred"}),
                       ("peer-vmm-sync", {"CUPOOL_POLICY": "vmm", "CUPOOL_FREE": "sync"})):
        r = run(name, [exe], shim=shim)
        j = last_json(r) or {}
        want_mappings = 2 if "vmm" in name else 0
        check(f"{name}: a kernel on device 1 wrote both of device 0's blocks after peer access was enabled",
              r["rc"] == 0 and j.get("ok") is True and j.get("mappings") == want_mappings,
              f"{json.dumps(j)} (expected {want_mappings} mappings) {r['stderr'][-300:]}")

check_transformer_losses()

save_results(complete=True)
runs = unique_runs()

# ---- A short table ---------------------------------------------------------------------------
lines = ["| run | rc | result | trace: allocs (api:path) | peak reserved |", "|---|---|---|---|---|"]
for r in runs:
    out = r["stdout"]
    res = []
    for pat, label in ((r"step=([\d.]+) ms", "step ms"), (r"loss=([\d.]+)", "loss")):
        v = parse_float(pat, out)
        if v is not None:
            res.append(f"{label} {v}")
    last = [l for l in out.splitlines() if l.startswith("{")]
    if last:
        res.append(last[-1][:160])
    t = r.get("trace")
    allocs = ""
    peak = ""
    if t and "by_api" not in t:  # a sampled trace (quick_stack_counts): its counts only
        allocs = f'{t["allocs"]} allocs in the first {t["lines_read"]} lines (sampled)'
    elif t:
        allocs = ", ".join(f"{k}={v}" for k, v in sorted(t["by_api"].items()) if k.split(":")[0] in ("alloc", "vmm_create"))
        peak = f'{t["peak_reserved"] / 2**20:.0f} MiB' if t["peak_reserved"] else f'{t["peak_external"] / 2**20:.0f} MiB ext'
        if t.get("dropped"):
            allocs += f" DROPPED={t['dropped']}"
        if not t["footer"]:
            allocs += " (no footer)"
    elif r.get("trace_error"):
        allocs = r["trace_error"][:80]
    lines.append(f"| {r['name']} | {r['rc']} | {'; '.join(res)} | {allocs[:300]} | {peak} |")
head = "\n".join(f"- {k}: {v}" for k, v in HEADER.items())
failed = [c for c in checks if not c["ok"]]
summary = f"{len(checks) - len(failed)} of {len(checks)} checks passed" + "".join(
    f"\n- FAILED: {c['check']}: {c['detail']}" for c in failed)
table = "\n".join(lines)
open(os.path.join(OUT, f"results-{TAG}.md"), "w").write(f"{head}\n\n{table}\n\n{summary}\n")
print(table)
print(summary)
if SUITE_FAILED:
    print("run_all.py: the compatibility suite failed (its output above; OUT/compat.md)", flush=True)
sys.exit(1 if failed or SUITE_FAILED else 0)
