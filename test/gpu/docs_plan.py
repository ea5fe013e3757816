#!/usr/bin/env python3
"""What `test/gpu/run_all.sh BUILD CARRY OUT --docs --part K/4` runs: everything the measured pages
(README.md, docs/compatibility.md, docs/performance.md, docs/policies.md) quote, split in four
device calls that each finish inside one call's 600 s, and how a part's raw files are kept in
docs/gpu-runs/ (docs_run.py names the ones it reads). One home for the split: run_all.sh asks
this file for a part's groups and settings, docs_run.py for the parts.

  docs_plan.py groups K/N         the groups of part K (prints GROUPS, then the settings as VAR=value)
  docs_plan.py save OUT PREFIX    copy a part's OUT into docs/gpu-runs as PREFIX-FILE (folders
                                  flattened with '-'), e.g. docs/gpu-runs/2026-12-03-docs2

Times: the run times the H200 printed (the `[ 9.0s] name` lines of the raw logs), plus what the
call spends beside them. The first split (three parts, 2026-12-02) took its estimates from earlier
calls and was far too low: its part 1 ran about 450 s and was cut (at the call's limit) in its
pair-cost rounds; the likely cause, found afterwards, is that run_all.py parsed every event of the
trace-on benchmarks' traces (millions of lines) in Python. Those runs now only sample their
traces, and each part holds less. Measured on 2026-12-02/03
(the kept docs run, docs/gpu-runs/*-docsK-run.log; wall time of the whole device command):
  part 1: suite 76.0 s, contextless ~30 s (its call also ran other groups: ~120 s for these two).
  part 2: 339.5 s: compat 186 s (torch 103, jax 77, cupy and the workload 6), inflight 6 s,
    share 31 s of share-race plus the budget and hostile checks, rounds 89 s.
  part 3: 535.6 s: steps 249 s, defaultpolicy 263 s. The tightest part: 64 s under the limit.
  part 4: 467.1 s: policies 131 s, sharing the rest (the jobs alone, 15 ways, the start-up cost).
Total ~1460 s (24 min) of device time, plus the machine's start. run_all.py rewrites its results
file after every run, so a part cut at the limit keeps what it measured ("complete": false).
"""
import os
import shutil
import sys

ROUNDS = 3
PARTS = [
    {"groups": ["suite", "contextless"], "estimate_s": 120, "env": {}},
    {"groups": ["compat", "inflight", "share", "rounds"], "estimate_s": 340, "env": {}},
    {"groups": ["steps", "defaultpolicy"], "estimate_s": 536, "env": {}},
    {"groups": ["policies", "sharing"], "estimate_s": 467,
     "env": {"CUPOOL_GPU_POLICIES_ROUNDS_OF": "pt-caching-nocupool-1,pt-expandable-nocupool",
             "SHARING_WAYS": "preallocate-fixed,growth-capped,growth-shared,vmm-capped,vmm-shared",
             "SHARING_SCENARIOS": "varlen-varlen-transformer:0.7", "SHARING_ROUNDS": str(ROUNDS)}},
]
PART_NUMBERS = range(1, len(PARTS) + 1)
COMMON_ENV = {"CUPOOL_GPU_ROUNDS": str(ROUNDS)}

def part_of(arg):
    k, n = (int(x) for x in arg.split("/"))
    if n != len(PARTS) or not 1 <= k <= n:
        sys.exit(f"docs_plan.py: --part K/{len(PARTS)}, K from 1 to {len(PARTS)} (not {arg})")
    return k


def save(out, prefix):
    """Flattens OUT (a part's results) into PREFIX-FILE; the log is the caller's (run.log)."""
    for d, _, files in os.walk(out):
        for f in files:
            rel = os.path.relpath(os.path.join(d, f), out)
            if rel.endswith((".html", ".jsonl")):  # reports and traces stay out of the repository
                continue
            dest = f"{prefix}-{rel.replace(os.sep, '-')}"
            shutil.copyfile(os.path.join(d, f), dest)
            print(dest)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "groups":
        p = PARTS[part_of(sys.argv[2]) - 1]
        print(",".join(p["groups"]))
        for k, v in dict(COMMON_ENV, **p["env"]).items():
            print(f"{k}={v}")
    elif len(sys.argv) == 4 and sys.argv[1] == "save":
        save(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
