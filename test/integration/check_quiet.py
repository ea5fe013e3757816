#!/usr/bin/env python3
"""A process that never uses CUDA says nothing and writes no trace under the preloaded library
(users preload it into whole job scripts: every `ls` and `grep` loads it), while the first CUDA
call of a process that does brings the configuration line. Before, every process printed the
line at load and left a trace file.
  check_quiet.py SHIM SIM_DIR PROG_RUNTIME [sanitized]"""
import glob
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_under_shim import fail, shim_env  # noqa: E402

shim, sim_dir, prog = sys.argv[1:4]
sanitized = len(sys.argv) > 4 and sys.argv[4] == "sanitized"


with tempfile.TemporaryDirectory() as tmp:
    env = shim_env(shim, sim_dir, sanitized)
    env.update(CUPOOL_TRACE=os.path.join(tmp, "t.%p.jsonl"), CUPOOL_LOG_LEVEL="info", CUPOOL_NO_SUCH_OPTION="1")
    env.pop("CUPOOL_TRACE_ROOT_PID", None)
    p = subprocess.run(["sh", "-c", "true; ls / >/dev/null; echo done"], env=env, capture_output=True, text=True)
    if p.returncode != 0 or p.stdout != "done\n" or p.stderr:
        fail(f"a script that never uses CUDA: exit {p.returncode}, stdout {p.stdout!r}, stderr {p.stderr!r}")
    if glob.glob(os.path.join(tmp, "*")):
        fail(f"processes that never used CUDA left traces: {os.listdir(tmp)}")
    p = subprocess.run([prog], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"{prog} exited {p.returncode}: {p.stderr[-500:]}")
    if p.stderr.count("cupool: policy=") != 1 or "CUPOOL_NO_SUCH_OPTION" not in p.stderr:
        fail(f"the CUDA program should say its configuration and warn of the unknown variable once: {p.stderr!r}")
    if len(glob.glob(os.path.join(tmp, "*"))) != 1:
        fail(f"the CUDA program should leave one trace: {os.listdir(tmp)}")
    print("ok: silent and traceless without CUDA; one configuration line and one trace with it")
