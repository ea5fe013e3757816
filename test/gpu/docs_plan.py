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
traces, and each part holds less. Measured on 2026-12-02/03 (the kept docs run,
docs/gpu-runs/*-docsK-run.log, sums of the `[ Ns]` lines per group; wall: the whole device command):
  part 1 (suite): the suite 76.0 s (its RESULT line); + header ~10 s: ~90 s.
  part 2 (compat, rounds): wall 339.5 s with inflight and share; compat 185.2 s (torch 103.1,
    jax 51.1, jaxmlp 25.5, cupy 2.7, workload 2.8), rounds 89.1 s (21 runs, 7 configurations x 3);
    cut: inflight 6.3 s, share-race 31.1 s and share-budget/share-hostile (~18 s, untimed: the rest
    of the wall beside the header): 339.5 - 6.3 - 31.1 - 18 = ~284 s.
  part 3 (steps, defaultpolicy): wall 535.6 s; steps 249.5 s (torch 193.1, jax 56.4; 8 x 3 runs),
    defaultpolicy 262.8 s of which its two transformer runs without cupool 26.9 s, cut (steps runs
    the transformer without cupool in both cache modes, three times each, in the same call:
    CUPOOL_GPU_DEFAULTPOLICY_REFS=0): 535.6 - 26.9 = ~509 s.
  part 4 (policies, sharing): wall 467.1 s: policies 131.3 s (2 x 3 runs), share-startup 0.4 s,
    sharing ~325 s (15 scenario runs 278.1 s by sharing.json's wall_s, the three jobs alone and
    nvidia-smi ~47 s); unchanged: ~467 s.
Total ~1350 s (was ~1460), plus the machine's start. run_all.py rewrites its results file after
every run, so a part cut at the limit keeps what it measured ("complete": false).

Not cut: every configuration these groups run is a row of a generated table (docs_run.py,
docs_tables.py: frameworks, pair cost, steps, defaultpolicy, policies, sharing, share-startup).
Two device calls cannot hold them at three rounds: the quoted runs alone sum to ~1280 s of run
time (76 + 185 + 89 + 250 + 236 + 131 + 325), against 2 x ~540 s a call can safely take and the
900 s the issue asks for. Two calls need ~200 s (900 s: ~400 s) of quoted rows cut, a table
dropped, or shorter workloads (train_varlen.py's STEPS); settings that would do it without code:
CUPOOL_GPU_STEPS_CONFIGS and CUPOOL_GPU_ROUNDS_CONFIGS (rows of the steps and pair-cost tables),
SHARING_WAYS (rows of the sharing table). Which to cut is the pages' decision, not this file's.

The names of the kept files are the pages' generator's (docs_run.py, docs_tables.py read
DATE-docsK-results-compat-inflight-rounds-share.json): part 2 keeps that name with
CUPOOL_GPU_RESULTS_TAG though it no longer runs inflight and share (run_all.sh --verify does).
"""
import os
import shutil
import sys

ROUNDS = 3
PARTS = [
    {"groups": ["suite"], "estimate_s": 90, "env": {}},
    {"groups": ["compat", "rounds"], "estimate_s": 284,
     "env": {"CUPOOL_GPU_RESULTS_TAG": "compat-inflight-rounds-share"}},
    {"groups": ["steps", "defaultpolicy"], "estimate_s": 509, "env": {"CUPOOL_GPU_DEFAULTPOLICY_REFS": "0"}},
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
