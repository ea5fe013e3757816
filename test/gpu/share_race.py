#!/usr/bin/env python3
"""Issue 26 on the real driver: 8 member processes race for one shared budget at its edge, half of
them in PID namespaces of their own (unshare --pid, as containers sharing /dev/shm but not PIDs).
Each allocates and frees 512 MiB pieces at random (prog_share, cudaMalloc) for a few seconds;
a sampler reads the device's used memory through NVML as fast as it can. The most above the
baseline (every member started, nothing allocated) must not pass the budget. Under passthrough,
growth and vmm. Prints one JSON line per policy and exits 1 if any passed the budget.
  share_race.py SHIM PROG_SHARE [--seconds 8] [--budget-gib 8]"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import uuid

import pynvml

MiB = 1 << 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shim")
    ap.add_argument("program")
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--budget-gib", type=int, default=8)
    a = ap.parse_args()
    pynvml.nvmlInit()
    dev = pynvml.nvmlDeviceGetHandleByIndex(0)
    unshare = shutil.which("unshare") if os.getuid() == 0 else None
    ok = True
    for policy in ("passthrough", "growth", "vmm"):
        budget = "race-" + uuid.uuid4().hex[:8]
        env = dict(os.environ, LD_PRELOAD=a.shim, CUPOOL_SHARE=budget, CUPOOL_SHARE_LIMIT=f"{a.budget_gib}GiB",
                   CUPOOL_POLICY=policy, CUPOOL_FREE="sync", CUPOOL_GROWTH_CHUNK="2MiB", CUPOOL_LOG_LEVEL="error")
        env.pop("CUPOOL_RUN_HEADER", None)
        members = []
        for i in range(8):
            cmd = [a.program]
            if unshare and i % 2:
                cmd = [unshare, "--pid", "--fork", "--mount-proc"] + cmd
            members.append(subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True, bufsize=1))
        for i, m in enumerate(members):
            line = m.stdout.readline().strip()
            if line != "ready":
                m.kill()
                err = m.stderr.read()
                print(json.dumps({"policy": policy, "error": f"member {i} did not start: {line!r}",
                                  "exit": m.wait(), "stderr": err[-1500:]}), flush=True)
                return 1
        # Their stderr is drained, so that a chatty member never blocks on a full pipe.
        for m in members:
            threading.Thread(target=m.stderr.read, daemon=True).start()
        time.sleep(0.5)
        baseline = pynvml.nvmlDeviceGetMemoryInfo(dev).used
        peak = baseline
        samples = 0
        stop = threading.Event()
        granted = refused = 0
        lock = threading.Lock()

        def sample():
            nonlocal peak, samples
            while not stop.is_set():
                used = pynvml.nvmlDeviceGetMemoryInfo(dev).used
                samples += 1
                if used > peak:
                    peak = used

        def drive(m, seed):
            nonlocal granted, refused
            rnd = random.Random(seed)
            held = 0
            end = time.monotonic() + a.seconds
            while time.monotonic() < end:
                if held and rnd.random() < 0.4:
                    m.stdin.write("free\n")
                    m.stdout.readline()
                    held = 0
                    continue
                m.stdin.write("alloc 512\n")
                rc = m.stdout.readline().split()[-1]
                with lock:
                    if rc == "0":
                        granted += 1
                        held += 1
                    else:
                        refused += 1
            m.stdin.write("free\n")
            m.stdout.readline()

        sampler = threading.Thread(target=sample)
        sampler.start()
        drivers = [threading.Thread(target=drive, args=(m, i)) for i, m in enumerate(members)]
        for t in drivers:
            t.start()
        for t in drivers:
            t.join()
        stop.set()
        sampler.join()
        for m in members:
            m.stdin.write("quit\n")
            m.stdin.flush()
            m.wait(timeout=120)
        above = (peak - baseline) // MiB
        passed = above <= a.budget_gib * 1024
        ok = ok and passed and granted > 0 and refused > 0
        print(json.dumps({"policy": policy, "members": 8, "in_own_pid_namespace": 4 if unshare else 0,
                          "budget_mib": a.budget_gib * 1024, "most_above_baseline_mib": above, "samples": samples,
                          "granted": granted, "refused": refused, "within_budget": passed}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
