#!/usr/bin/env python3
"""CUPOOL_TRACE_STACKS on the simulated CUDA, with prog_stacks (its allocating functions exported):
- `all`: every allocation has a stack, defined by a `stack` line before its first use; the
  program's functions name its frames, innermost first, and no frame is cupool's own; the
  recursive allocation shows its nine frames of recursion; a thread's allocation its own stack;
- `4`: about one allocation in four has one; `1000000`: next to none, but the refused allocation
  still has its stack;
- `cupool report` shows the stacks beside the largest allocations and the out-of-memory, and
  `--json` carries them;
- `cupool export --memory-viz`: the blocks and the trace entries carry the frames;
- a bad value is refused with what is accepted."""
import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_under_shim import fail, shim_env  # noqa: E402

MiB = 1 << 20


def run(args, every, trace):
    env = shim_env(args.shim, args.sim_dir, args.sanitized)
    env["CUPOOL_TRACE"] = trace
    env["CUPOOL_TRACE_STACKS"] = every
    proc = subprocess.run([args.program], env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        fail(f"prog_stacks with CUPOOL_TRACE_STACKS={every}: exit {proc.returncode}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}")
    stacks, allocs = {}, []
    for n, line in enumerate(open(trace, encoding="utf-8"), 1):
        r = json.loads(line)
        if r["type"] == "stack":
            if r["id"] in stacks:
                fail(f"{trace}:{n}: stack {r['id']} written twice")
            stacks[r["id"]] = r["frames"]
        elif r["type"] == "event" and r["ev"] == "alloc" and r["api"] == "cudaMalloc":
            if "stack" in r and r["stack"] not in stacks:
                fail(f"{trace}:{n}: stack {r['stack']} used before its line")
            allocs.append(r)
    return stacks, allocs


def names(frames):
    return [f.get("symbol", "") for f in frames]


def check_frames(frames, where):
    for f in frames:
        if not f["pc"].startswith("0x") or ("module" in f and "offset" in f and not f["offset"].startswith("0x")):
            fail(f"{where}: malformed frame {f}")
        if "libcupool" in f.get("module", ""):
            fail(f"{where}: a frame of cupool's own: {f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", required=True)
    ap.add_argument("--sim-dir", required=True)
    ap.add_argument("--cupool", required=True)
    ap.add_argument("--program", required=True)
    ap.add_argument("--sanitized", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cupool-stacks-")

    # Every allocation.
    trace = os.path.join(tmp, "all.jsonl")
    stacks, allocs = run(args, "all", trace)
    ok = [a for a in allocs if a["rc"] == 0]
    if len(ok) != 402:
        fail(f"{len(ok)} successful cudaMalloc events, expected 402")
    missing = [a for a in allocs if "stack" not in a]
    if missing:
        fail(f"{len(missing)} allocations without a stack under CUPOOL_TRACE_STACKS=all, e.g. {missing[0]}")
    for sid, frames in stacks.items():
        check_frames(frames, f"stack {sid}")
    for a in allocs:
        top = names(stacks[a["stack"]])
        want = "stacks_allocate_too_much" if a["rc"] != 0 else "stacks_allocate_weights"
        if not top or top[0] != want:
            fail(f"allocation of {a['size']} bytes (rc {a['rc']}): innermost frame {top[:1]}, expected {want}")
        module = stacks[a["stack"]][0].get("module", "")
        if os.path.basename(module) != os.path.basename(args.program):
            fail(f"innermost frame's module {module!r}, expected the program")
    by_size = {a["size"]: names(stacks[a["stack"]]) for a in ok}
    deep = by_size[64 * MiB]
    if deep.count("stacks_recurse") != 9 or "main" not in deep:
        fail(f"the recursive allocation's stack: {deep}")
    if "main" in by_size[32 * MiB]:
        fail(f"the thread's allocation has main on its stack: {by_size[32 * MiB]}")
    # The 400 small allocations come from one call site: one stack, written once.
    if len({a["stack"] for a in ok if a["size"] == MiB}) != 1:
        fail("the 400 allocations of one call site have several stacks")
    print(f"ok: all: {len(allocs)} allocations, {len(stacks)} stacks; the recursive one {len(deep)} frames deep")

    # The report: stacks beside the largest allocations, and the out-of-memory's.
    rep = subprocess.run([args.cupool, "report", trace], capture_output=True, text=True, timeout=120)
    if rep.returncode != 0:
        fail(f"cupool report: exit {rep.returncode}\n{rep.stderr}")
    text = rep.stdout
    section = text.split("stacks of the largest allocations", 1)
    if len(section) != 2 or "stacks_recurse+0x" not in section[1] or "stacks_allocate_weights+0x" not in section[1]:
        fail(f"cupool report shows no stacks of the largest allocations:\n{text}")
    if "stacks_allocate_too_much+0x" not in text.split("out of memory:", 1)[1]:
        fail(f"cupool report shows no stack for the out-of-memory:\n{text}")
    rep = subprocess.run([args.cupool, "report", "--json", trace], capture_output=True, text=True, timeout=120)
    j = json.loads(rep.stdout)
    largest = j["traces"][0]["largest"][0]
    if largest["size"] != 64 * MiB or not largest["stack"][0]["name"].startswith("stacks_allocate_weights+0x"):
        fail(f"cupool report --json: the largest allocation {largest}")
    if not j["traces"][0]["ooms"] or "stack" not in j["traces"][0]["ooms"][0]:
        fail(f"cupool report --json: the out-of-memory has no stack: {j['traces'][0]['ooms']}")
    print("ok: cupool report shows the stacks (text and --json)")

    # memory_viz: frames on blocks and trace entries.
    snap = os.path.join(tmp, "snap.pickle")
    ex = subprocess.run([args.cupool, "export", "--memory-viz", trace, "-o", snap], capture_output=True, text=True, timeout=120)
    if ex.returncode != 0:
        fail(f"cupool export --memory-viz: exit {ex.returncode}\n{ex.stderr}")
    with open(snap, "rb") as f:
        s = pickle.load(f)
    entries = [e for dev in s["device_traces"] for e in dev]
    allocs_viz = [e for e in entries if e["action"] == "alloc"]
    if len(allocs_viz) != 402 or any(not e["frames"] for e in allocs_viz):
        fail(f"memory_viz: {len(allocs_viz)} alloc entries, {sum(1 for e in allocs_viz if not e['frames'])} without frames")
    big = [e for e in allocs_viz if e["size"] == 64 * MiB][0]
    if [fr["name"].split("+")[0] for fr in big["frames"]].count("stacks_recurse") != 9 or \
            any(set(fr) != {"filename", "line", "name"} for fr in big["frames"]):
        fail(f"memory_viz frames of the largest allocation: {big['frames']}")
    frees = [e for e in entries if e["action"] in ("free_requested", "free_completed")]
    if not frees or any(not e["frames"] for e in frees):
        fail(f"memory_viz: frees without their allocation's frames: {sum(1 for e in frees if not e['frames'])} of {len(frees)}")
    ooms = [e for e in entries if e["action"] == "oom"]
    if not ooms or not ooms[0]["frames"] or not ooms[0]["frames"][0]["name"].startswith("stacks_allocate_too_much"):
        fail(f"memory_viz: the oom entry's frames: {ooms}")
    live = [b for seg in s["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"]
    if live:
        fail(f"memory_viz: blocks still live at the end: {live[:2]}")
    print("ok: export --memory-viz carries the frames")

    # Sampled: one in four; one in a million (the refused allocation still has its stack).
    _, allocs = run(args, "4", os.path.join(tmp, "quarter.jsonl"))
    sampled = sum(1 for a in allocs if a["rc"] == 0 and "stack" in a)
    # Binomial(402, 1/4): mean 100.5, standard deviation 8.7; the bounds are 6 deviations away.
    if not 48 <= sampled <= 153:
        fail(f"CUPOOL_TRACE_STACKS=4: {sampled} of 402 allocations have a stack")
    _, allocs = run(args, "1000000", os.path.join(tmp, "rare.jsonl"))
    sampled = sum(1 for a in allocs if a["rc"] == 0 and "stack" in a)
    refused = [a for a in allocs if a["rc"] != 0]
    if sampled > 3 or len(refused) != 1 or "stack" not in refused[0]:
        fail(f"CUPOOL_TRACE_STACKS=1000000: {sampled} sampled, refused {refused}")
    print(f"ok: sampled: one in 4 and one in a million ({sampled}); the refused allocation always")

    # A bad value: refused, naming what is accepted.
    env = shim_env(args.shim, args.sim_dir, args.sanitized)
    env["CUPOOL_TRACE_STACKS"] = "sometimes"
    proc = subprocess.run([args.program], env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode == 0 or "CUPOOL_TRACE_STACKS" not in proc.stderr or "one allocation in N" not in proc.stderr:
        fail(f"CUPOOL_TRACE_STACKS=sometimes: exit {proc.returncode}, stderr {proc.stderr!r}")
    print("ok: a bad value is refused")


if __name__ == "__main__":
    main()
