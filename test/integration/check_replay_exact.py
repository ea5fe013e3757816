#!/usr/bin/env python3
"""Replay runs what the shim runs: runs prog_replay on the simulated CUDA under libcupool.so with a
trace, replays the trace with `cupool replay --policy recorded`, and requires the replay to find
exactly what the run recorded: peak reserved and in-use bytes, chunks taken and returned, failed
allocations, and every out-of-memory event (count and the first one's class, size and line).
It also fails when the run did not exercise what the configuration is about: a cap that refused
nothing, or VMM mappings that never appear in the trace."""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_under_shim import fail, shim_env  # noqa: E402

DEVICE_KEYS = ["peak_requested", "peak_in_use", "peak_reserved", "chunks_taken", "chunk_bytes_taken",
               "chunks_returned", "chunk_bytes_returned", "failed_allocs"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", required=True)
    ap.add_argument("--sim-dir", required=True)
    ap.add_argument("--cupool", required=True)
    ap.add_argument("--program", required=True)
    ap.add_argument("--policy", required=True)
    ap.add_argument("--free", required=True)
    ap.add_argument("--limit", default="")
    ap.add_argument("--vmm", default="0")
    ap.add_argument("--sanitized", action="store_true")
    a = ap.parse_args()
    name = f"{a.policy}/{a.free}" + (f" limit {a.limit}" if a.limit else "") + (" vmm" if a.vmm == "1" else "")

    with tempfile.TemporaryDirectory() as tmp:
        env = shim_env(a.shim, a.sim_dir, a.sanitized)
        env.update({"CUPOOL_TRACE": os.path.join(tmp, "trace.jsonl"), "CUPOOL_POLICY": a.policy,
                    "CUPOOL_FREE": a.free, "CUPOOL_SIM_TOTAL_MEM": "512MiB", "PROG_VMM": a.vmm,
                    "CUPOOL_LOG": "error"})
        if a.limit:
            env["CUPOOL_LIMIT"] = a.limit
            # Room under the cap beside the preallocated region, for memory outside the pool.
            env["CUPOOL_PREALLOCATE"] = "48MiB"
        p = subprocess.run([a.program], env=env, capture_output=True, text=True, timeout=240)
        if p.returncode != 0:
            fail(f"{name}: the program failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
        counts = json.loads(p.stdout.strip().splitlines()[-1])
        traces = glob.glob(os.path.join(tmp, "trace*.jsonl"))
        if len(traces) != 1:
            fail(f"{name}: expected one trace, found {traces}")
        if a.limit and counts["refused"] == 0:
            fail(f"{name}: the cap of {a.limit} refused nothing: the check would not test out-of-memory")
        if a.vmm == "1" and counts.get("vmm_creates", 0) == 0:
            fail(f"{name}: the program made no VMM mapping")

        replay_env = dict(os.environ)
        replay_env.pop("LD_PRELOAD", None)
        r = subprocess.run([a.cupool, "replay", "--json", "--no-progress", "--policy", "recorded", traces[0]],
                           env=replay_env, capture_output=True, text=True, timeout=240)
        if r.returncode not in (0, 1):
            fail(f"{name}: cupool replay exited {r.returncode}: {r.stderr}")
        out = json.loads(r.stdout)
        recorded, replayed = out["recorded"], out["policies"][0]
        if out["policies"][0]["policy"] != "recorded":
            fail(f"{name}: replayed as {out['policies'][0]['policy']}")
        if replayed["config"]["policy"] != a.policy or replayed["config"]["free"] != a.free:
            fail(f"{name}: replayed under {replayed['config']}, not the recorded configuration")

        problems = []
        rec_dev = {d["device"]: d for d in recorded["devices"]}
        rep_dev = {d["device"]: d for d in replayed["devices"]}
        if sorted(rec_dev) != sorted(rep_dev):
            problems.append(f"devices {sorted(rec_dev)} recorded, {sorted(rep_dev)} replayed")
        for dev in rec_dev:
            for k in DEVICE_KEYS:
                got, want = rep_dev.get(dev, {}).get(k), rec_dev[dev][k]
                if got != want:
                    problems.append(f"device {dev} {k}: replayed {got}, recorded {want}")
        if recorded["oom_count"] != replayed["oom_count"]:
            problems.append(f"out-of-memory events: replayed {replayed['oom_count']}, recorded {recorded['oom_count']}")
        rf, pf = recorded["first_failure"], replayed["first_failure"]
        if (rf is None) != (pf is None):
            problems.append(f"first failure: replayed {pf}, recorded {rf}")
        elif rf is not None:
            for k in ("class", "size", "api"):
                if rf.get(k) != pf.get(k):
                    problems.append(f"first failure {k}: replayed {pf.get(k)}, recorded {rf.get(k)}")
        if a.limit and recorded["oom_count"] == 0:
            problems.append("the trace records no out-of-memory event under the cap")
        if problems:
            fail(f"{name}: the replay differs from the run:\n  " + "\n  ".join(problems))
        d0 = rec_dev[min(rec_dev)]
        print(f"ok: {name}: peak reserved {d0['peak_reserved']}, {d0['chunks_taken']} chunks taken, "
              f"{d0['failed_allocs']} failed allocations, {recorded['oom_count']} out-of-memory events, "
              f"{counts['allocs']} allocations: replayed exactly")


if __name__ == "__main__":
    main()
