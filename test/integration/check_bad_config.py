#!/usr/bin/env python3
"""A wrong CUPOOL_* value stops the process before its own code runs, with one line that names
the variable, the value and what is accepted."""
import os
import subprocess
import sys

lib, sim_dir = sys.argv[1], sys.argv[2]
sanitized = len(sys.argv) > 3
preload = [lib]
if sanitized:
    preload.insert(0, subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip())

CASES = [
    ({"CUPOOL_POLICY": "grwoth"}, ["CUPOOL_POLICY", "grwoth", "growth", "preallocate", "passthrough"]),
    ({"CUPOOL_FREE": "later"}, ["CUPOOL_FREE", "later", "sync", "deferred"]),
    ({"CUPOOL_LIMIT": "12XB"}, ["CUPOOL_LIMIT", "12XB"]),
    ({"CUPOOL_PREALLOCATE": "150%"}, ["CUPOOL_PREALLOCATE", "150%"]),
    ({"CUPOOL_TRACE": "/nonexistent-dir/trace.jsonl"}, ["CUPOOL_TRACE", "/nonexistent-dir/trace.jsonl"]),
]

failures = 0
for extra, words in CASES:
    env = dict(os.environ, LD_PRELOAD=":".join(preload), LD_LIBRARY_PATH=sim_dir, **extra)
    p = subprocess.run(["/bin/echo", "user code ran"], env=env, capture_output=True, text=True)
    lines = [l for l in p.stderr.splitlines() if "cupool" in l]
    problems = []
    if p.returncode != 78:
        problems.append(f"exit status {p.returncode}, expected 78")
    if "user code ran" in p.stdout:
        problems.append("the program ran")
    if len(lines) != 1 or not all(w in lines[0] for w in words):
        problems.append(f"stderr should be one line naming {words}: {p.stderr!r}")
    if problems:
        failures += 1
        print(f"FAIL {extra}: " + "; ".join(problems))
    else:
        print(f"ok {extra}: {lines[0]}")

env = dict(os.environ, LD_PRELOAD=":".join(preload), CUPOOL_POLICY="growth", CUPOOL_LOG_LEVEL="warn")
p = subprocess.run(["/bin/echo", "user code ran"], env=env, capture_output=True, text=True)
if p.returncode != 0 or "user code ran" not in p.stdout:
    failures += 1
    print(f"FAIL: a good configuration must not stop the program: {p.returncode} {p.stderr!r}")
sys.exit(1 if failures else 0)
