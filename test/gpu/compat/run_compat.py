#!/usr/bin/env python3
"""The compatibility suite: does each program behave exactly the same without cupool and under
every cupool configuration? (test/gpu/compat/README.md)

  run_compat.py BUILD_DIR BIN_DIR OUT [--only name,...] [--jobs N] [--heavy-jobs N] [--keep-traces]

BUILD_DIR holds shim/libcupool.so; BIN_DIR the programs built by build.sh. Every program runs
twice without cupool (it must reproduce itself), then under CUPOOL_POLICY in {passthrough,
growth, preallocate, vmm} x CUPOOL_FREE in {sync, deferred}, with a trace. A run under cupool passes
("same") when its exit status, its stdout (lines starting with '#' left out) and its verdict line
(keys in VOLATILE_KEYS left out) equal the first run without cupool, its trace recorded the
program's allocations, and, for programs that count address reuse, the pool policies reused an
address at least once. Writes OUT/compat.json and OUT/compat.md, prints the table, exits 1 if
any run differs or fails.
"""
import argparse
import concurrent.futures as cf
import datetime
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
POLICIES = ("passthrough", "growth", "preallocate", "vmm")
FREES = ("sync", "deferred")
CONFIGS = [(p, f) for p in POLICIES for f in FREES]
# Verdict keys that may legitimately differ between runs (the pool decides where memory goes).
VOLATILE_KEYS = {"reused_same_address"}

# Settings of the pool runs. Programs that count reuse get a pool with room for one of their
# 256 MiB buffers and never two (384 MiB; the rest holds the runtime's own small allocations),
# so a freed buffer's memory must be handed out again, and deferred frees must wait for it.
REUSE_GROWTH = {"CUPOOL_LIMIT": "384MiB", "CUPOOL_GROWTH_CHUNK": "2MiB"}
REUSE_PREALLOCATE = {"CUPOOL_PREALLOCATE": "384MiB", "CUPOOL_LIMIT": "384MiB"}
# Preallocate reserves 75% of the GPU by default: every preallocate run here sets a region that
# fits its program, so that runs can go side by side on one GPU.
DEFAULT_PREALLOCATE = {"CUPOOL_PREALLOCATE": "2GiB"}


def prog(name, min_allocs, reuse=False, timeout=120, growth=None, preallocate=None, env=None, script=None, heavy=False):
    return {"name": name, "min_allocs": min_allocs, "reuse": reuse, "timeout": timeout,
            "growth": dict(growth or {}), "preallocate": dict(preallocate or DEFAULT_PREALLOCATE),
            "env": dict(env or {}), "script": script, "heavy": heavy}


# min_allocs: successful alloc / vmm_create events the trace must hold (all processes of the run),
# a lower bound from the program's own calls.
PROGRAMS = [
    prog("stream_destroy", 20, reuse=True, growth=REUSE_GROWTH, preallocate=REUSE_PREALLOCATE),
    prog("stream_destroy_static", 20, reuse=True, growth=REUSE_GROWTH, preallocate=REUSE_PREALLOCATE),
    prog("per_thread_stream", 10, reuse=True, growth=REUSE_GROWTH, preallocate=REUSE_PREALLOCATE),
    prog("per_thread_stream_explicit", 10, reuse=True, growth=REUSE_GROWTH, preallocate=REUSE_PREALLOCATE),
    prog("capture", 30),
    prog("graph_memory", 4),
    prog("arrays", 4),
    prog("arrays_driver", 2),
    prog("last_error", 2),
    prog("lib_cublas", 12),
    prog("lib_cufft", 5),
    prog("lib_cusolver", 9),
    prog("lib_cusparse", 9),
    prog("lib_thrust_cub", 6),
    prog("ipc_mempool", 2),
    prog("ipc_vmm", 2),
    prog("cooperative", 12),
    prog("openmp_threads", 1600),
    prog("device_malloc", 5),
    # Issue 25: the patterns of programs nobody here wrote. NVML linked at build time or dlopened
    # before CUDA; cuCtxCreate contexts pushed and popped across threads, threads with no current
    # context (cuMemCreate and four 64 MiB cuMemAllocAsync); libcuda dlopened late by a plugin
    # thread; a CUDA program that execs and spawns CUDA children (every process's trace counts).
    prog("nvml_linked", 1),
    prog("nvml_dlopen_first", 1),
    prog("contexts_threads", 7),
    prog("late_dlopen", 8),
    prog("exec_child", 5),
    prog("torch_graphs", 1, timeout=420, script="torch_graphs.py", heavy=True,
         preallocate={"CUPOOL_PREALLOCATE": "8GiB"},
         env={"TORCHINDUCTOR_COMPILE_THREADS": "2", "PYTHONHASHSEED": "0"}),
]


def sh(cmd, timeout=60):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def build_commit(path):
    """The commit a build came from: test/gpu/prepare.sh's BUILD_ID (commit=...) or build.sh's
    (the git describe alone). Never git on the machine that runs it: its copy is not the build's."""
    if not os.path.exists(path):
        return None
    text = open(path).read()
    for line in text.splitlines():
        if line.startswith("commit="):
            return line.split("=", 1)[1].strip()
    return text.strip() or None


def header(args):
    h = {}
    lib_commit = build_commit(os.path.join(args.build, "BUILD_ID"))
    build_id = build_commit(os.path.join(args.bin, "BUILD_ID"))
    h["commit"] = lib_commit or f"{build_id or 'unknown'} (the programs' build; the library's is not recorded)"
    h["binaries_build_id"] = build_id or "unknown"
    shim = os.path.join(args.build, "shim", "libcupool.so")
    h["libcupool_sha256"] = hashlib.sha256(open(shim, "rb").read()).hexdigest()[:16] if os.path.exists(shim) else "missing"
    h["gpu"] = sh(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]) or "unknown (nvidia-smi failed)"
    h["cuda"] = sh([os.path.join(args.bin, "last_error"), "--versions"]) or "unknown"
    h["torch"] = sh([sys.executable, "-c", "import torch; print(torch.__version__, torch.version.cuda)"], 120) or "not available"
    h["jax"] = sh([sys.executable, "-c", "import jax; print(jax.__version__)"], 120) or "not available"
    h["python"] = sys.version.split()[0]
    h["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    h["command"] = " ".join([os.path.basename(sys.executable)] + sys.argv)
    return h


def clean_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUPOOL_") and k != "LD_PRELOAD"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def command(p, args):
    if p["script"]:
        return [sys.executable, os.path.join(HERE, p["script"])]
    return [os.path.join(args.bin, p["name"])]


def trace_summary(pattern):
    """Successful allocation events (alloc, vmm_create) in every file of one run, by api:path."""
    s = {"files": 0, "allocs": 0, "by_api": {}, "footers": 0, "dropped": 0, "errors": []}
    for f in sorted(glob.glob(pattern)):
        s["files"] += 1
        try:
            with open(f, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    try:
                        r = json.loads(line)
                    except ValueError:
                        s["errors"].append(f"{os.path.basename(f)}: a line cut short")
                        continue
                    t = r.get("type")
                    if t == "footer":
                        s["footers"] += 1
                        s["dropped"] += r.get("dropped", 0)
                    elif t == "event" and r.get("ev") in ("alloc", "vmm_create") and r.get("rc", 0) == 0:
                        s["allocs"] += 1
                        key = f'{r.get("ev")}:{r.get("api")}:{r.get("path")}'
                        s["by_api"][key] = s["by_api"].get(key, 0) + 1
        except OSError as e:
            s["errors"].append(str(e))
    return s


def run_one(p, config, args, tracedir):
    """config: "native1", "native2" or (policy, free)."""
    env = clean_env()
    env.update(p["env"])
    trace_pattern = None
    label = config if isinstance(config, str) else f"{config[0]}-{config[1]}"
    if not isinstance(config, str):
        policy, free = config
        env["LD_PRELOAD"] = args.shim
        env["CUPOOL_POLICY"] = policy
        env["CUPOOL_FREE"] = free
        env["CUPOOL_LOG_LEVEL"] = "warn"
        # The vmm policy runs with growth's settings (a cap, where a program needs reuse shown).
        env.update(p.get("growth" if policy == "vmm" else policy, {}) if policy in ("growth", "preallocate", "vmm") else {})
        env["CUPOOL_TRACE"] = os.path.join(tracedir, f"{p['name']}.{label}.%p.jsonl")
        trace_pattern = os.path.join(tracedir, f"{p['name']}.{label}.*.jsonl")
    cmd = command(p, args)
    t0 = time.time()
    timed_out = False
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors="replace", start_new_session=True, cwd=args.bin)
    except OSError as e:
        return {"program": p["name"], "config": label, "rc": None, "stdout": "", "stderr": str(e), "seconds": 0,
                "timed_out": False, "trace": None, "env": {k: v for k, v in env.items() if k.startswith("CUPOOL_")}}
    try:
        out, err = proc.communicate(timeout=p["timeout"])
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the program and any child it started
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
    secs = round(time.time() - t0, 1)
    return {"program": p["name"], "config": label, "rc": proc.returncode, "stdout": out, "stderr": err,
            "seconds": secs, "timed_out": timed_out,
            "trace": trace_summary(trace_pattern) if trace_pattern else None,
            "env": {k: v for k, v in env.items() if k.startswith("CUPOOL_") and k != "CUPOOL_TRACE"}}


def parse(stdout):
    """(compared lines, verdict dict or None)."""
    body, verdict = [], None
    for line in stdout.splitlines():
        s = line.rstrip()
        if s.startswith("#"):
            continue
        if s.startswith('{"program"'):
            try:
                verdict = json.loads(s)
                continue
            except ValueError:
                pass
        body.append(s)
    return body, verdict


def stable(verdict):
    return None if verdict is None else {k: v for k, v in verdict.items() if k not in VOLATILE_KEYS}


def compare(ref, run):
    """None if the two runs agree, else a short description of the first difference."""
    if ref["rc"] != run["rc"]:
        return f"exit status {ref['rc']} vs {run['rc']}"
    rb, rv = parse(ref["stdout"])
    b, v = parse(run["stdout"])
    for i in range(max(len(rb), len(b))):
        a = rb[i] if i < len(rb) else "<no line>"
        c = b[i] if i < len(b) else "<no line>"
        if a != c:
            return f"line {i + 1}: {a!r} vs {c!r}"
    if stable(rv) != stable(v):
        return f"verdict {json.dumps(stable(rv))} vs {json.dumps(stable(v))}"
    return None


def judge(p, runs):
    """Fills in each run's cell and reason."""
    n1, n2 = runs["native1"], runs["native2"]
    for r in (n1, n2):
        _, v = parse(r["stdout"])
        r["verdict"] = v
    native_ok = True
    if n1["timed_out"] or n1["rc"] != 0 or not n1["verdict"] or n1["verdict"].get("verdict") != "ok":
        n1["cell"], n1["reason"] = "FAIL", ("timed out" if n1["timed_out"] else
                                            f"exit status {n1['rc']}, verdict {json.dumps(n1['verdict'])}")
        native_ok = False
    else:
        d = compare(n1, n2)
        n2["first_difference"] = d
        if d:
            n1["cell"], n1["reason"] = "not reproducible", "second run without cupool: " + d
            native_ok = False
        else:
            n1["cell"], n1["reason"] = "ok", None
    n2["cell"], n2["reason"] = n1["cell"], n1["reason"]
    for policy, free in CONFIGS:
        r = runs[f"{policy}-{free}"]
        _, v = parse(r["stdout"])
        r["verdict"] = v
        cell, reason = "same", None
        d = compare(n1, r)
        r["first_difference"] = d
        t = r["trace"] or {}
        if r["timed_out"]:
            cell, reason = "FAIL", f"timed out after {r['seconds']} s"
        elif r["rc"] is not None and r["rc"] < 0:
            cell, reason = "FAIL", f"killed by signal {-r['rc']}"
        elif d:
            cell, reason = "DIFF", d
        elif t.get("allocs", 0) < p["min_allocs"]:
            cell, reason = "FAIL", (f"the trace holds {t.get('allocs', 0)} allocation events (at least "
                                    f"{p['min_allocs']} expected): interception failed ({t.get('files', 0)} trace files)")
        elif p["reuse"] and policy != "passthrough" and not (v or {}).get("reused_same_address"):
            cell, reason = "no reuse", "the pool never handed a freed buffer's address out again: the run tested nothing"
        r["cell"], r["reason"] = cell, reason
    return native_ok


def first_lines(text, n=12, width=300):
    return "\n".join(line[:width] for line in (text or "").strip().splitlines()[-n:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("bin")
    ap.add_argument("out")
    ap.add_argument("--only", help="comma-separated program names")
    ap.add_argument("--jobs", type=int, default=8, help="runs of compiled programs at once (default 8)")
    ap.add_argument("--heavy-jobs", type=int, default=4, help="runs of Python programs at once (default 4)")
    ap.add_argument("--keep-traces", action="store_true", help="keep the traces (their folder is printed)")
    args = ap.parse_args()
    args.build, args.bin, args.out = (os.path.abspath(x) for x in (args.build, args.bin, args.out))
    args.shim = os.path.join(args.build, "shim", "libcupool.so")
    os.makedirs(args.out, exist_ok=True)
    programs = PROGRAMS
    if args.only:
        want = set(args.only.split(","))
        unknown = want - {p["name"] for p in PROGRAMS}
        if unknown:
            sys.exit(f"run_compat.py: unknown programs: {', '.join(sorted(unknown))}")
        programs = [p for p in PROGRAMS if p["name"] in want]

    h = header(args)
    head_lines = [f"{k}: {v}" for k, v in h.items()]
    print("\n".join(head_lines), flush=True)
    if not os.path.exists(args.shim):
        sys.exit(f"run_compat.py: {args.shim} does not exist")
    missing = [p["name"] for p in programs if not p["script"] and not os.access(os.path.join(args.bin, p["name"]), os.X_OK)]
    if missing:
        sys.exit(f"run_compat.py: not built in {args.bin}: {', '.join(missing)} (run build.sh)")
    links = {}
    if os.path.exists(os.path.join(args.bin, "LINKS")):
        for line in open(os.path.join(args.bin, "LINKS")):
            parts = line.split()
            if len(parts) == 2:
                links[parts[0]] = parts[1]

    tracedir = tempfile.mkdtemp(prefix="cupool-compat-traces-")
    t_start = time.time()
    lock = threading.Lock()
    results = {p["name"]: {} for p in programs}
    labels = ["native1", "native2"] + [f"{a}-{b}" for a, b in CONFIGS]

    def task(p, config):
        r = run_one(p, config, args, tracedir)
        with lock:
            results[p["name"]][r["config"]] = r
            print(f"[{time.time() - t_start:6.1f}s] {p['name']} {r['config']}: rc={r['rc']}"
                  f"{' TIMEOUT' if r['timed_out'] else ''} ({r['seconds']} s)", flush=True)

    light = cf.ThreadPoolExecutor(max_workers=max(1, args.jobs))
    heavy = cf.ThreadPoolExecutor(max_workers=max(1, args.heavy_jobs))
    futures = []
    for config in ["native1", "native2"] + CONFIGS:
        for p in programs:
            futures.append((heavy if p["heavy"] else light).submit(task, p, config))
    for f in futures:
        f.result()
    light.shutdown()
    heavy.shutdown()
    total = round(time.time() - t_start, 1)

    all_ok = True
    rows, details = [], []
    for p in programs:
        runs = results[p["name"]]
        all_ok &= judge(p, runs)
        cells = [runs["native1"]["cell"]] + [runs[f"{a}-{b}"]["cell"] for a, b in CONFIGS]
        all_ok &= all(c in ("ok", "same") for c in cells)
        link = "python" if p["script"] else links.get(p["name"], "?")
        rows.append(f"| {p['name']} | {link} | " + " | ".join(cells) + " |")
        for label in ["native1"] + [f"{a}-{b}" for a, b in CONFIGS]:
            r = runs[label]
            if r["cell"] not in ("ok", "same"):
                details.append(f"- **{p['name']}, {label}: {r['cell']}**: {r['reason']}")
                err = first_lines(r["stderr"], 6)
                if err:
                    details.append("  stderr (last lines): `" + err.replace("\n", " / ").replace("`", "'") + "`")

    cols = ["native (x2)"] + [f"{a} {b}" for a, b in CONFIGS]
    table = ["| program | runtime | " + " | ".join(cols) + " |", "|---" * (len(cols) + 2) + "|"] + rows
    settings = ["| program | growth runs | preallocate runs | reuse required | min. allocation events | timeout |",
                "|---|---|---|---|---|---|"]
    for p in programs:
        g = " ".join(f"{k}={v}" for k, v in p["growth"].items()) or "defaults"
        pr = " ".join(f"{k}={v}" for k, v in p["preallocate"].items())
        settings.append(f"| {p['name']} | {g} | {pr} | {'yes' if p['reuse'] else 'no'} | {p['min_allocs']} | {p['timeout']} s |")
    verdict_line = (f"RESULT: {'all runs the same' if all_ok else 'DIFFERENCES OR FAILURES'} "
                    f"({len(programs)} programs x {len(labels)} runs, {total} s)")
    md = ["# cupool compatibility suite", ""] + [f"- {line}" for line in head_lines] + ["", verdict_line, ""] + table
    md += ["", "Cells: `ok`/`same` pass; `DIFF`: exit status, output or verdict differ from the run without cupool; "
           "`FAIL`: timed out, killed, or the trace shows no interception; `no reuse`: a pool run that never reused "
           "an address (tested nothing); `not reproducible`: two runs without cupool differ.", ""]
    if details:
        md += ["## Differences and failures", ""] + details + [""]
    md += ["## Settings of the pool runs", "",
           "Every pool run: `LD_PRELOAD=BUILD_DIR/shim/libcupool.so CUPOOL_POLICY=... CUPOOL_FREE=... "
           "CUPOOL_TRACE=<one file per process> CUPOOL_LOG_LEVEL=warn`, plus the program's settings below "
           "(growth settings for growth runs, preallocate settings for preallocate runs; passthrough runs get none). "
           f"Up to {args.jobs} compiled programs and {args.heavy_jobs} Python programs run at once; every preallocate "
           "run reserves only the size below, so they share the GPU.", ""] + settings
    open(os.path.join(args.out, "compat.md"), "w").write("\n".join(md) + "\n")

    def slim(r):
        _, v = parse(r["stdout"])
        d = {k: r.get(k) for k in ("program", "config", "rc", "seconds", "timed_out", "cell", "reason", "first_difference",
                                   "env")}
        d["verdict"] = v
        d["trace"] = r["trace"]
        d["stdout"] = r["stdout"] if r["cell"] not in ("ok", "same") else None
        d["stderr_tail"] = first_lines(r["stderr"], 20) or None
        return d

    doc = {"header": h, "result": "same" if all_ok else "differences or failures", "seconds": total,
           "configs": labels, "volatile_verdict_keys": sorted(VOLATILE_KEYS),
           "settings": {p["name"]: {k: p[k] for k in ("growth", "preallocate", "reuse", "min_allocs", "timeout", "env")}
                        for p in programs},
           "runs": [slim(results[p["name"]][label]) for p in programs for label in labels]}
    with open(os.path.join(args.out, "compat.json"), "w") as f:
        json.dump(doc, f, indent=1)

    print()
    print("\n".join(table))
    if details:
        print()
        print("\n".join(details))
    print()
    print(verdict_line)
    print(f"wrote {os.path.join(args.out, 'compat.md')} and compat.json")
    if args.keep_traces:
        print(f"traces kept in {tracedir}")
    else:
        shutil.rmtree(tracedir, ignore_errors=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
