#!/usr/bin/env python3
"""What `test/gpu/run_all.sh BUILD CARRY OUT --docs --part K/2` runs: everything the measured pages
(README.md, docs/compatibility.md, docs/performance.md, docs/policies.md) quote, split in two
device calls that each finish inside one call's 600 s, and how a part's raw files are kept in
docs/gpu-runs/ (docs_run.py finds each table's file by name, whatever the split). One home for
the split: run_all.sh asks this file for a part's groups and settings.

  docs_plan.py groups K/N         the groups of part K (prints GROUPS, then the settings as VAR=value)
  docs_plan.py save OUT PREFIX    copy a part's OUT into docs/gpu-runs as PREFIX-FILE (folders
                                  flattened with '-'), e.g. docs/gpu-runs/2026-12-10-docs2

Times: the run times the H200 printed in the kept four-part run of 2026-12-02/03
(docs/gpu-runs/*-docsK-run.log, sums of the `[ Ns]` lines per group, per configuration where rows
are cut), plus what a call spends beside them: the header ~10 s, and the trace summaries of the
traced runs (~13 s in the old part 3, whose runs sum to 512.3 s of its 535.6 s wall; split ~7 s
defaultpolicy, ~6 s steps). The device call adds ~20-30 s (start, transfers) to each part.
Issue 38 asked for two calls under 10 minutes each and 15 minutes in all; cut for it:
  - steps: torch-caching-growth (37.1 s) and torch-nocache-growth-sync (43.2 s):
    249.5 - 80.3 = 169.2 s (6 configurations x 3 rounds: CUPOOL_GPU_STEPS_CONFIGS);
  - rounds (pair cost): growth-sync-trace-on (21.6 s): 89.1 - 21.6 = 67.5 s (6 x 3:
    CUPOOL_GPU_ROUNDS_CONFIGS);
  - sharing: the capped ways, growth-capped (37.9 s) and vmm-capped (38.9 s): scenario runs
    278.1 - 76.8 = 201.3 s (3 ways x 3 rounds: SHARING_WAYS), + the jobs alone and nvidia-smi
    ~47 s: ~248 s;
  - the compatibility suite (76.0 s, its RESULT line) runs beside group compat (185.2 s of runs:
    torch 103.1, jax 51.1, jaxmlp 25.5, cupy 2.7, workload 2.8), whose runs go 4 at a time
    (CUPOOL_GPU_SUITE_BESIDE_COMPAT, CUPOOL_GPU_COMPAT_JOBS: neither times anything the pages
    quote, and no timed group starts before both are done): at least max(76.0, 185.2 / 4) = 76 s,
    estimated ~110 s with the two sharing the host's 16 cores and the GPU (not yet measured).
  - defaultpolicy (262.8 s, and ~190 s more since issue 39 added CuPy and a Hugging Face model)
    is not part of the docs run: it is the default-policy decision, a GPU run of its own
    (`run_all.sh BUILD CARRY OUT --only defaultpolicy`, one call of ~480 s), kept as
    DATE-decision-FILE (`docs_plan.py save OUT docs/gpu-runs/DATE-decision`); its tables read the
    newest defaultpolicy.json of a docs run or a decision run.
Not cut: the suite's 10 runs a program (two without cupool and the 8 configurations are its
columns and its checks; run_compat.py has no setting for fewer).
  part 1 (suite + compat, steps, policies): 110 + 169.2 + 131.3 (policies: 2 x 3 runs) + 10 + 6
    = ~427 s;
  part 2 (rounds, sharing): 67.5 + 248.3 + 0.4 (share-startup) + 10 = ~326 s.
Total ~753 s of the two commands, ~800 s with the calls' ~25 s each: two calls under 10 minutes,
15 minutes in all (estimates from the old run's times, not yet a measured docs run). The next cuts,
if a part runs long, are the pages' decision: policies (131.3 s), steps' JAX rows (56.4 s), or
shorter workloads. run_all.py rewrites its results file after every run, so a part cut at the
limit keeps what it measured ("complete": false).

The kept files are named by the part's groups (results-<groups>.json; part 1's
results-compat-policies-steps.json, part 2's results-rounds-sharing.json) or by what
they hold (compat.json, defaultpolicy.json, policies-roundN-policies.json, sharing.json):
docs_run.py reads each table from the newest kept file of its name, in whichever part it lies.
"""
import os
import shutil
import sys

ROUNDS = 3
PARTS = [
    {"groups": ["suite", "compat", "steps", "policies"], "estimate_s": 427,
     "env": {"CUPOOL_GPU_SUITE_BESIDE_COMPAT": "1", "CUPOOL_GPU_COMPAT_JOBS": "4",
             "CUPOOL_GPU_POLICIES_ROUNDS_OF": "pt-caching-nocupool-1,pt-expandable-nocupool",
             "CUPOOL_GPU_STEPS_CONFIGS": "torch-caching-nocupool,torch-nocache-nocupool,"
                                         "torch-nocache-growth-deferred,jax-bfc-nocupool,jax-platform-nocupool,"
                                         "jax-platform-growth-deferred"}},
    {"groups": ["rounds", "sharing"], "estimate_s": 326,
     "env": {"CUPOOL_GPU_ROUNDS_CONFIGS": "driver,async,growth-deferred-trace-off,growth-deferred-trace-on,"
                                          "growth-sync-trace-off,vmm-deferred-trace-off",
             "SHARING_WAYS": "preallocate-fixed,growth-shared,vmm-shared",
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
