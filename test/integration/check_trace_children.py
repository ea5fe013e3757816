#!/usr/bin/env python3
"""A traced process that starts others (JAX runs ptxas; launchers start workers), with a trace
path without %p: the first process would write the path, each process it starts writes
<path>.<pid>, and no file is truncated by another process. The first process here (a Python
starter) never uses CUDA, so it writes nothing at all. A Python process under the shim runs prog_runtime
twice at once on the simulated CUDA (a shell would do, but dash leaves by _exit: no footer).
  check_trace_children.py SHIM SIM_DIR PROG_RUNTIME [sanitized]"""
import glob
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_under_shim import fail, read_trace, shim_env  # noqa: E402

shim, sim_dir, prog = sys.argv[1:4]
sanitized = len(sys.argv) > 4 and sys.argv[4] == "sanitized"

with tempfile.TemporaryDirectory() as tmp:
    env = shim_env(shim, sim_dir, sanitized)
    env["CUPOOL_TRACE"] = os.path.join(tmp, "trace.jsonl")
    env["CUPOOL_POLICY"] = "growth"
    env["CUPOOL_LOG_LEVEL"] = "warn"
    env.pop("CUPOOL_TRACE_ROOT_PID", None)
    # Two programs that use CUDA, and one that does not (it must leave no file).
    starter = f"import subprocess; ps = [subprocess.Popen([{prog!r}]) for _ in range(2)]; " \
              "subprocess.run(['true'], check=True); raise SystemExit(max(p.wait() for p in ps))"
    proc = subprocess.run([sys.executable, "-c", starter], env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        fail(f"the starter exited with {proc.returncode}: {proc.stderr[-2000:]}")
    if "unknown variable" in proc.stderr:
        fail(f"the marker for child processes was warned about: {proc.stderr[-500:]}")
    counts = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    if len(counts) != 2:
        fail(f"expected two program reports, got {proc.stdout!r}")
    root = env["CUPOOL_TRACE"]
    if os.path.exists(root):
        fail("the starter never used CUDA, yet a trace is at the path (written by it, or by a child "
             "that took the first process's place)")
    children = sorted(glob.glob(root + ".*"))
    if len(children) != 2:
        fail(f"expected one trace per started CUDA program (none for `true`), found {children}")
    for path, count in zip(children, sorted(counts, key=lambda c: c["allocs"])):
        header, events, footer = read_trace(path)
        allocs = sum(1 for e in events if e["ev"] == "alloc" and e["rc"] == 0 and e["size"] > 0)
        if footer.get("allocs") != allocs or allocs != count["allocs"]:
            fail(f"{path}: {allocs} allocations in the trace, footer {footer.get('allocs')}, program {count['allocs']}")
        if os.path.basename(header["cmdline"][0]) != os.path.basename(prog):
            fail(f"{path}: written by {header['cmdline']}")
    print(f"ok: no trace of the starter and {len(children)} child traces")
