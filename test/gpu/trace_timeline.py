#!/usr/bin/env python3
"""Where a run's allocation time goes, over the run: the trace's events cut into BINS equal slices
of time, and per slice the pool's own driver calls (grow: chunks or granule runs mapped; release:
given back), their driver time, the program's allocations and frees, their host time, and how
many allocations took longer than SLOW_US (the miss path: a map, or a wait for a fence).

  trace_timeline.py TRACE [--bins N] [--slow-us U]

Issue 29 asks where the vmm policy's extra time on the reference transformer goes before anything
changes: this prints it for a trace of each policy, side by side in one call.
"""
import argparse
import glob
import json

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("trace", help="a trace file, or a pattern with %%p as cupool writes them")
ap.add_argument("--bins", type=int, default=10)
ap.add_argument("--slow-us", type=float, default=50.0)
a = ap.parse_args()

events = []
for path in sorted(glob.glob(a.trace.replace("%p", "*"))):
    for line in open(path, encoding="utf-8"):
        r = json.loads(line)
        if r.get("type") == "event":
            events.append(r)
if not events:
    raise SystemExit(f"trace_timeline.py: no events in {a.trace}")
events.sort(key=lambda e: e["t"])
t0, t1 = events[0]["t"], events[-1]["t"]
span = max(1, t1 - t0)
rows = [{"grow": 0, "grow_us": 0.0, "release": 0, "release_us": 0.0, "alloc": 0, "alloc_us": 0.0, "free": 0,
         "free_us": 0.0, "slow_allocs": 0} for _ in range(a.bins)]
for e in events:
    i = min(a.bins - 1, (e["t"] - t0) * a.bins // span)
    ev = e["ev"]
    us = e.get("dur", 0) * e.get("timed_for", 1) / 1e3
    if ev in ("grow", "release", "alloc", "free"):
        rows[i][ev] += 1
        rows[i][ev + "_us"] += us
    if ev == "alloc" and e.get("dur", 0) / 1e3 > a.slow_us:
        rows[i]["slow_allocs"] += 1
print(f"{a.trace}: {len(events)} events over {span / 1e9:.2f} s, {a.bins} slices of {span / a.bins / 1e6:.0f} ms")
print("| slice | grow | grow us | release | release us | allocs | alloc us | frees | free us | allocs > %g us |" % a.slow_us)
print("|---|---|---|---|---|---|---|---|---|---|")
for i, r in enumerate(rows):
    print(f'| {i} | {r["grow"]} | {r["grow_us"]:.0f} | {r["release"]} | {r["release_us"]:.0f} | {r["alloc"]} | '
          f'{r["alloc_us"]:.0f} | {r["free"]} | {r["free_us"]:.0f} | {r["slow_allocs"]} |')
