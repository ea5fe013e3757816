#!/usr/bin/env python3
"""Names the functions of a flat profile that test/gpu/pc_sampler.c wrote on the GPU machine.

  pc_profile.py PROFILE LIB [LIB...] [--top N]

Each LIB is a file the profiled process mapped (matched by its file name), with its debug
information when functions inlined into others are to be told apart: libcupool.so of a build with
-g (the same code as without it). Prints the share of samples per mapped file, then, within the
LIBs, per function (innermost inlined frame) and per function with what it was inlined into.
Addresses in files not given are counted by file only.
"""
import collections
import os
import subprocess
import sys


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 25
    if "--top" in sys.argv:
        args.remove(str(top))
    if len(args) < 2:
        sys.exit(__doc__)
    profile, libs = args[0], {os.path.basename(p): p for p in args[1:]}
    pcs, maps = [], []
    for line in open(profile):
        if line.startswith("pc "):
            _, pc, n = line.split()
            pcs.append((int(pc, 16), int(n)))
        elif line.startswith("map "):
            f = line[4:].split()
            if len(f) >= 6 and "x" in f[1]:
                lo, hi = (int(x, 16) for x in f[0].split("-"))
                maps.append((lo, hi, int(f[2], 16), f[5]))
    total = sum(n for _, n in pcs)
    by_file = collections.Counter()
    wanted = collections.defaultdict(list)  # lib -> [(offset, n)]
    for pc, n in pcs:
        m = next((m for m in maps if m[0] <= pc < m[1]), None)
        name = os.path.basename(m[3]) if m else "(unmapped: JIT, vdso or kernel)"
        by_file[name] += n
        if m and name in libs:
            wanted[name].append((pc - m[0] + m[2], n))
    print(f"{total} samples")
    print("\n| mapped file | samples | share |\n|---|---|---|")
    for name, n in by_file.most_common(12):
        print(f"| {name} | {n} | {100 * n / total:.1f}% |")
    inner, chain = collections.Counter(), collections.Counter()
    for name, rows in wanted.items():
        addrs = [f"{off:x}" for off, _ in rows]
        out = subprocess.run(["addr2line", "-f", "-i", "-C", "-a", "-e", libs[name]] + addrs,
                             capture_output=True, text=True).stdout.splitlines()
        frames, cur = {}, None
        it = iter(out)
        for l in it:
            if l.startswith("0x"):
                cur = int(l, 16)
                frames[cur] = []
            else:
                frames[cur].append(l)
                next(it, None)  # its file:line
        for off, n in rows:
            fns = frames.get(off, ["??"]) or ["??"]
            inner[f"{name}: {fns[0]}"] += n
            chain[f"{name}: {' < '.join(f.split('(')[0] for f in fns[:4])}"] += n
    for title, c in (("innermost function", inner), ("inlined into (innermost first)", chain)):
        print(f"\n| {title} | samples | share of all |\n|---|---|---|")
        for k, n in c.most_common(top):
            print(f"| {k[:150]} | {n} | {100 * n / total:.1f}% |")


if __name__ == "__main__":
    main()
