#!/usr/bin/env python3
"""The vmm policy on allocation sequences recorded on the H200 (docs/gpu-runs): train_varlen.py
(150 steps, shapes varying every step; runR) and the reference transformer (runS), each under
`cupool run --takeover`, replayed by `cupool replay --policy vmm,growth` on the simulated device.
Holds the policy to issue 15's target (reserved at most 1.03 times the peak in use) and to the
little churn that made its step time level with the caching allocator's on the H200: the build
before (runO's library) unmapped 25.7 GiB over train_varlen.py's 150 steps to stay at 1.008, at
tens of microseconds per 2 MiB (docs/design.md, "The vmm policy").

  check_vmm_traces.py CUPOOL RUNS_DIR
"""
import json
import os
import subprocess
import sys

GiB = 1 << 30
cupool, runs = sys.argv[1], sys.argv[2]
# trace, the most its vmm replay may unmap, the most it may map
CASES = [("2026-12-02-runR-trace-varlen-vmm-deferred.jsonl.zst", 3 * GiB, 8 * GiB),
         ("2026-12-02-runS-trace-transformer-vmm.jsonl.zst", 1 * GiB, 4 * GiB)]
failed = []


def expect(name, ok, detail):
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        failed.append(name)


for trace, max_unmapped, max_mapped in CASES:
    p = subprocess.run([cupool, "replay", os.path.join(runs, trace), "--policy", "vmm,growth", "--json", "--no-progress"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        expect(trace, False, f"cupool replay exited {p.returncode}: {p.stderr[-500:]}")
        continue
    got = {pol["config"]["policy"]: pol["devices"][0] for pol in json.loads(p.stdout)["policies"]}
    vmm, growth = got["vmm"], got["growth"]
    expect(f"{trace}: vmm reserves at most 1.03 times its peak in use", vmm["reserved_ratio"] <= 1.03,
           f'{vmm["peak_reserved"]} / {vmm["peak_in_use"]} = {vmm["reserved_ratio"]:.4f}')
    expect(f"{trace}: vmm reserves less than chunked growth", vmm["peak_reserved"] < growth["peak_reserved"],
           f'{vmm["peak_reserved"]} against {growth["peak_reserved"]}')
    expect(f"{trace}: vmm unmaps at most {max_unmapped / GiB:g} GiB", vmm["chunk_bytes_returned"] <= max_unmapped,
           f'{vmm["chunk_bytes_returned"] / GiB:.2f} GiB in {vmm["chunks_returned"]} unmaps')
    expect(f"{trace}: vmm maps at most {max_mapped / GiB:g} GiB", vmm["chunk_bytes_taken"] <= max_mapped,
           f'{vmm["chunk_bytes_taken"] / GiB:.2f} GiB in {vmm["chunks_taken"]} maps')
    expect(f"{trace}: no out of memory", vmm["failed_allocs"] == 0 and growth["failed_allocs"] == 0,
           f'vmm {vmm["failed_allocs"]}, growth {growth["failed_allocs"]}')
sys.exit(1 if failed else 0)
