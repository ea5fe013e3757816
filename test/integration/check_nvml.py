#!/usr/bin/env python3
"""NVML's memory queries inside a process under libcupool.so say what cudaMemGetInfo says, on the
simulated CUDA with two devices (the simulated NVML numbers them in the reverse of CUDA's order).
prog_nvml (NVML linked, and dlopen + dlsym) and prog_nvml_dlopen (dlopen + dlsym only, as pynvml)
check that equality themselves, device by device; here they run:
- without cupool: NVML gives the whole device (total = the device's memory);
- under CUPOOL_LIMIT=1GiB: NVML's total is the cap, not the device;
- in a shared budget (CUPOOL_SHARE_LIMIT=512MiB) of which another member (prog_share) holds
  200 MiB: NVML's free is within what the budget leaves, on the device both use."""
import argparse
import json
import os
import subprocess
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_under_shim import fail, shim_env  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30


def run(program, env, what):
    proc = subprocess.run([program], env=env, capture_output=True, text=True, timeout=120)
    name = os.path.basename(program)
    if proc.returncode != 0:
        fail(f"{name} {what}: exit {proc.returncode}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"ok: {name} {what}: NVML total {report['nvml_total']} free {report['nvml_free']} "
          f"(ways: {report['nvml_ways']})")
    return report


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", required=True)
    ap.add_argument("--sim-dir", required=True)
    ap.add_argument("--share-member", required=True, help="prog_share, the other member of the budget")
    ap.add_argument("--sanitized", action="store_true")
    ap.add_argument("programs", nargs="+")
    a = ap.parse_args()
    common = {"CUPOOL_SIM_DEVICES": "2", "CUPOOL_LOG_LEVEL": "error"}

    for program in a.programs:
        bare = dict(os.environ, LD_LIBRARY_PATH=a.sim_dir + ":" + os.environ.get("LD_LIBRARY_PATH", ""), **common)
        r = run(program, bare, "without cupool")
        if r["nvml_total"] != r["device_total"] or r["nvml_free"] > r["device_total"]:
            fail(f"without cupool NVML must give the whole device: {r}")
        device_free = r["nvml_free"]

        capped = shim_env(a.shim, a.sim_dir, a.sanitized)
        capped.update(common, CUPOOL_LIMIT="1GiB", PROG_EXPECT_TOTAL=str(GiB))
        r = run(program, capped, "under CUPOOL_LIMIT=1GiB")
        if r["nvml_total"] != GiB or r["nvml_free"] >= device_free:
            fail(f"under a 1 GiB cap NVML still gives the device ({device_free} free): {r}")

        budget = "nvml-" + uuid.uuid4().hex[:12]
        segment = f"/dev/shm/cupool-share-{os.getuid()}-{budget}"
        shared = shim_env(a.shim, a.sim_dir, a.sanitized)
        shared.update(common, CUPOOL_SHARE=budget, CUPOOL_SHARE_LIMIT="512MiB")
        member = subprocess.Popen([a.share_member], env=shared, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        try:
            if not member.stdout.readline().startswith("ready"):
                fail(f"the other member did not start: {member.stderr.read()[-1500:]}")
            member.stdin.write("alloc 200\n")
            member.stdin.flush()
            if member.stdout.readline().split() != ["alloc", "0"]:
                fail("the other member could not take 200 MiB of the budget")
            # prog_share works on CUDA device 0: so does this member.
            left = 512 * MiB - 200 * MiB
            r = run(program, dict(shared, PROG_NVML_DEVICE="0", PROG_EXPECT_FREE_AT_MOST=str(left)),
                    "in a 512 MiB shared budget with 200 MiB held by another member")
            if r["nvml_free"] > left or r["nvml_total"] != r["device_total"]:
                fail(f"NVML's answer is not the budget's: {r}")
            member.stdin.write("quit\n")
            member.stdin.flush()
            member.communicate(timeout=60)
            if member.returncode != 0:
                fail(f"the other member exited with {member.returncode}")
        finally:
            if member.poll() is None:
                member.kill()
                member.wait()
            if os.path.exists(segment):
                os.unlink(segment)


if __name__ == "__main__":
    main()
