#!/usr/bin/env python3
"""What `test/gpu/run_all.sh BUILD CARRY OUT --docs --part K/4` runs: everything the measured pages
(README.md, docs/compatibility.md, docs/performance.md, docs/policies.md) quote, split in four
device calls that each finish inside one call's 600 s, and where docs_tables.py finds the raw
files once they are kept in docs/gpu-runs/. One home for the split: run_all.sh asks this file for
a part's groups and settings, docs_run.py and docs_tables.py for the files' names.

  docs_plan.py groups K/N         the groups of part K (prints GROUPS, then the settings as VAR=value)
  docs_plan.py save OUT PREFIX    copy a part's OUT into docs/gpu-runs as PREFIX-FILE (folders
                                  flattened with '-'), e.g. docs/gpu-runs/2026-12-03-docs2

Estimates: the run times the H200 printed (the `[ 9.0s] name` lines of the raw logs), plus what
the call spends beside them. The first split (three parts, 2026-12-02) took these from earlier
calls and was far too low: its part 1 ran 450 s and was cut in its pair-cost rounds, because
run_all.py parsed every event of the trace-on benchmarks' traces (millions of lines) in Python.
Those runs now only sample their traces, and each part holds less.
  part 1 (~120 s): suite 76.0 s (docs1 of 2026-12-02: 25 programs x 10 runs), contextless ~30 s.
  part 2 (~330 s): compat ~170 s (torch 8 runs 85 s, jax 8 runs 74 s, cupy and the workload 5 s),
    inflight 6 s, share ~40 s (runZ4: budget and hostile ~9 s, share-race 30.8 s), rounds 3 x 7
    pair costs = ~100 s (2026-12-02: a round's runs 29.5 s).
  part 3 (~470 s): steps 3 rounds x 8 steps = 195 s (runA: the 8 step runs 65 s), defaultpolicy
    250 s (runZ5: 2 runs without cupool 21 s, 3 rounds of 6 runs 229 s).
  part 4 (~465 s): policies 3 rounds of pt-caching-nocupool-1 and pt-expandable-nocupool = 120 s
    (runB and runV: 19-23 s a run), sharing ~345 s: the three jobs alone 50 s (runH: transformer
    10 s, varlen 20 s each), then varlen-varlen-transformer at 70% in 3 rounds of 5 ways (fixed
    shares, caps and one shared budget under growth and vmm): a way whose jobs fail ~11 s, a
    shared one that finishes ~29 s (runH: 10.0-11.6 s and 27.6-29.2 s), 3 x 90 s = 270 s, and the
    start-up benchmark ~10 s.
Total ~1385 s (23 min) of device time, plus the machine's start. run_all.py rewrites its results
file after every run, so a part cut at the limit keeps what it measured ("complete": false).
"""
import os
import shutil
import sys

ROUNDS = 3
PARTS = [
    {"groups": ["suite", "contextless"], "estimate_s": 120, "env": {}},
    {"groups": ["compat", "inflight", "share", "rounds"], "estimate_s": 330, "env": {}},
    {"groups": ["steps", "defaultpolicy"], "estimate_s": 470, "env": {}},
    {"groups": ["policies", "sharing"], "estimate_s": 465,
     "env": {"CUPOOL_GPU_POLICIES_ROUNDS_OF": "pt-caching-nocupool-1,pt-expandable-nocupool",
             "SHARING_WAYS": "preallocate-fixed,growth-capped,growth-shared,vmm-capped,vmm-shared",
             "SHARING_SCENARIOS": "varlen-varlen-transformer:0.7", "SHARING_ROUNDS": str(ROUNDS)}},
]
PART_NUMBERS = range(1, len(PARTS) + 1)
COMMON_ENV = {"CUPOOL_GPU_ROUNDS": str(ROUNDS)}

# The raw files of each part, as `save` names them (PREFIX-NAME), that docs_tables.py reads.
FILES = {
    1: ["header.json", "run.log", "compat.json", "compat.md", "contextless.txt"],
    2: ["header.json", "run.log", "results-compat-inflight-rounds-share.json", "results-compat-inflight-rounds-share.md"],
    3: ["header.json", "run.log", "results-defaultpolicy-steps.json", "results-defaultpolicy-steps.md",
        "defaultpolicy.json"],
    4: ["header.json", "run.log", "results-policies-sharing.json", "results-policies-sharing.md", "sharing.json"]
       + [f"policies-round{i}-policies.json" for i in range(1, ROUNDS + 1)],
}


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
