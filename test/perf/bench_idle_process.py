#!/usr/bin/env python3
"""What a process that never uses CUDA pays for having libcupool.so preloaded (users preload it
into whole job scripts: every `true`, `ls` and `grep` loads it): the wall time and peak resident
memory of `true`, with and without LD_PRELOAD, alternating, over many runs; and what it prints
(it must print nothing, and write no trace). Memory is that of `sleep`, read while it sleeps. A benchmark (suite perf): the times depend on the
machine and its load, so nothing here is a pass/fail bound but the silence.

  bench_idle_process.py SHIM [RUNS]
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

shim = os.path.abspath(sys.argv[1])
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 200
true = shutil.which("true")


def one(env):
    t0 = time.perf_counter_ns()
    p = subprocess.run([true], env=env, capture_output=True)
    return time.perf_counter_ns() - t0, p.stdout + p.stderr


def memory_kib(env):
    """The memory of `sleep` (another program that never uses CUDA), read from /proc while it
    sleeps: resident, proportional (shared pages of libraries split among the processes that map
    them) and private dirty (what this process alone costs the machine). The kernel's peak-RSS
    figure of a child would count the parent's memory before the exec."""
    p = subprocess.Popen([shutil.which("sleep"), "0.3"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(0.15)
    kib = {}
    with open(f"/proc/{p.pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss", "Private_Dirty"):
                kib[key] = int(rest.split()[0])
    out, err = p.communicate()
    return kib, out + err


with tempfile.TemporaryDirectory() as tmp:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CUPOOL_") and k != "LD_PRELOAD"}
    under = dict(base, LD_PRELOAD=shim, CUPOOL_TRACE=os.path.join(tmp, "t.%p.jsonl"), CUPOOL_LOG_LEVEL="info")
    times = {"without": [], "with": []}
    mem = {"without": [], "with": []}
    printed = b""
    for i in range(runs):
        for label, env in (("without", base), ("with", under)):
            w, out = one(env)
            times[label].append(w)
            if label == "with":
                printed += out
        if i % 10 == 0:  # a sleeping process takes 0.3 s: fewer of these
            for label, env in (("without", base), ("with", under)):
                k, out = memory_kib(env)
                mem[label].append(k)
                if label == "with":
                    printed += out
    files = os.listdir(tmp)
    med = {k: statistics.median(v) / 1e6 for k, v in times.items()}
    print(f"true x {runs}, median wall: {med['without']:.3f} ms without cupool, {med['with']:.3f} ms with "
          f"(+{med['with'] - med['without']:.3f} ms)")
    for key in ("Rss", "Pss", "Private_Dirty"):
        a = statistics.median(m[key] for m in mem["without"])
        b = statistics.median(m[key] for m in mem["with"])
        print(f"sleep, median {key}: {a:.0f} KiB without, {b:.0f} KiB with (+{b - a:.0f} KiB)")
    print(f"printed: {len(printed)} bytes; trace files: {len(files)}")
    if printed or files:
        print(f"FAIL: a process that never used CUDA printed {printed[:300]!r} and left {files[:5]}")
        sys.exit(1)
