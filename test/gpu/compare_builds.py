#!/usr/bin/env python3
"""Two builds of cupool side by side on one GPU, in one call: the pool-hit pair cost
(test/gpu/bench_alloc.cu, cudaMalloc+cudaFree, growth with deferred frees) with the trace off and
on, in alternating rounds, so that the host's drift falls on both alike.

  compare_builds.py BEFORE_BUILD AFTER_BUILD BIN_DIR OUT [--rounds N]

Each BUILD holds shim/libcupool.so and BUILD_ID (test/gpu/prepare.sh's). Every round runs, in
turn: before trace on, after trace on, before trace off, after trace off (the order flips every
other round). Writes OUT/compare-builds.json (the header, every run's rows) and prints, per
(trace, bytes, threads), the min / median / max over the rounds of each build and the ratio of the
medians (after / before). Exits 1 if a run failed or printed no rows: a comparison that did not
measure both builds is no comparison.
"""
import datetime
import hashlib
import json
import os
import statistics
import subprocess
import sys

import argparse

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("before")
ap.add_argument("after")
ap.add_argument("bin_dir")
ap.add_argument("out")
ap.add_argument("--rounds", type=int, default=3)
a = ap.parse_args()
before, after, bin_dir, out, rounds = a.before, a.after, a.bin_dir, a.out, a.rounds
os.makedirs(out, exist_ok=True)
bench = os.path.join(bin_dir, "bench_alloc")


def commit_of(build):
    path = os.path.join(build, "BUILD_ID")
    if not os.path.exists(path):
        return None
    for line in open(path):
        if line.startswith("commit="):
            return line.split("=", 1)[1].strip()
    return None


def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"unavailable ({e.__class__.__name__})"


builds = {"before": before, "after": after}
header = {
    "builds": {name: {"commit": commit_of(b),
                      "libcupool_sha256": hashlib.sha256(open(os.path.join(b, "shim", "libcupool.so"), "rb").read()).hexdigest()[:16]}
               for name, b in builds.items()},
    "programs": commit_of(os.path.dirname(os.path.abspath(bin_dir))),  # CARRY/BUILD_ID
    "gpu": sh(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]).splitlines()[0:1],
    "cuda": sh(["nvcc", "--version"]).splitlines()[-1:],
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
    "rounds": rounds,
}
for k, v in header.items():
    print(f"{k}: {v}", flush=True)
if any(b["commit"] is None for b in header["builds"].values()):
    sys.exit("compare_builds.py: a build has no BUILD_ID (build it with test/gpu/prepare.sh)")

base_env = {k: v for k, v in os.environ.items() if not k.startswith("CUPOOL_") and k != "LD_PRELOAD"}
runs, failed = [], False
for i in range(1, rounds + 1):
    order = ["before", "after"] if i % 2 else ["after", "before"]
    for trace in ("on", "off"):
        for name in order:
            env = dict(base_env, LD_PRELOAD=os.path.join(builds[name], "shim", "libcupool.so"),
                       CUPOOL_POLICY="growth", CUPOOL_FREE="deferred")
            if trace == "on":
                env.update(CUPOOL_TRACE=os.path.join(out, f"compare-{name}.jsonl"), CUPOOL_TRACE_BUFFER="1048576")
            label = f"round {i}: {name}, trace {trace}"
            p = subprocess.run([bench, "malloc", label], env=env, capture_output=True, text=True, timeout=300)
            rows = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
            if trace == "on":
                try:
                    os.remove(env["CUPOOL_TRACE"])
                except OSError:
                    pass
            if p.returncode != 0 or not rows:
                failed = True
                print(f"FAIL {label}: exit {p.returncode}, {len(rows)} rows\n{p.stderr[-2000:]}", flush=True)
            runs.append({"round": i, "build": name, "trace": trace, "rc": p.returncode, "rows": rows})
            print(f"  {label}: " + " ".join(f'{r["bytes"]}/{r["threads"]}:{r["median_ns"]}' for r in rows), flush=True)

table = []
keys = sorted({(r["trace"], row["bytes"], row["threads"]) for r in runs for row in r["rows"]})
for trace, nbytes, threads in keys:
    line = {"trace": trace, "bytes": nbytes, "threads": threads}
    for name in builds:
        v = [row["median_ns"] for r in runs if r["build"] == name and r["trace"] == trace
             for row in r["rows"] if row["bytes"] == nbytes and row["threads"] == threads]
        line[name] = {"min": min(v), "median": round(statistics.median(v), 1), "max": max(v), "n": len(v)} if v else None
    if line["before"] and line["after"]:
        line["ratio_of_medians"] = round(line["after"]["median"] / line["before"]["median"], 3)
    table.append(line)
json.dump({"header": header, "runs": runs, "table": table}, open(os.path.join(out, "compare-builds.json"), "w"), indent=1)
print(f"\npair cost, ns (min / median / max of {rounds} rounds); before {header['builds']['before']['commit']}, "
      f"after {header['builds']['after']['commit']}")
print("| trace | bytes | threads | before | after | after / before |")
print("|---|---|---|---|---|---|")
for t in table:
    fmt = lambda s: f'{s["min"]} / {s["median"]} / {s["max"]}' if s else "missing"
    print(f'| {t["trace"]} | {t["bytes"]} | {t["threads"]} | {fmt(t["before"])} | {fmt(t["after"])} | {t.get("ratio_of_medians", "-")} |')
sys.exit(1 if failed else 0)
