#!/usr/bin/env python3
"""Runs a group of tests many times, several at once, so that races show up as failures: the
loop issue 38 asks to be rerunnable by anyone (`./dev.sh stress share`).

  stress.py BUILD_DIR GROUP [--runs N] [--jobs J]

GROUP is `share` (the shared budget: its unit tests, the integration tests, the two-jobs example,
the command's budget tests) or `trace` (the trace writer's unit tests and the traced integration
tests), or a comma-separated list of meson test names. Every test runs N times (default 200),
J at a time (default 3: on a 2-core machine that is the load under which the budget's races were
seen), each with the command, environment and timeout meson gives it. The output of every failed
run is kept in BUILD_DIR/stress/. Ends with one line "N passed, M failed".
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time

GROUPS = {
    # The unit tests' exhaustive model checks ([model]) are deterministic: no load changes them.
    "share": ["share-budget", "share-hostile", "examples-share-two-jobs", "tools-share", "unit:[share]~[model]"],
    "trace": ["trace-of-started-processes", "trace-stacks", "unit:[trace]"],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("group")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=3)
    a = ap.parse_args()
    tests = {t["name"]: t for t in json.loads(subprocess.run(
        ["meson", "introspect", a.build, "--tests"], capture_output=True, text=True, check=True).stdout)}
    names = GROUPS.get(a.group, a.group.split(","))
    plan = []  # (label, cmd, env, timeout, cwd)
    for name in names:
        if name.startswith("unit:"):
            t = tests["unit"]
            plan.append((name, t["cmd"] + [name[len("unit:"):]], t["env"], t["timeout"], t.get("workdir")))
        elif name in tests:
            t = tests[name]
            plan.append((name, t["cmd"], t["env"], t["timeout"], t.get("workdir")))
        else:
            sys.exit(f"stress.py: no test named {name} in {a.build} (meson introspect --tests)")
    keep = os.path.join(a.build, "stress")
    os.makedirs(keep, exist_ok=True)

    def one(job):
        (label, cmd, env, timeout, cwd), i = job
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, env=dict(os.environ, **env), cwd=cwd or a.build, capture_output=True,
                               text=True, timeout=timeout if timeout and timeout > 0 else None)
            ok, out = p.returncode in (0, 77), f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
        except subprocess.TimeoutExpired as e:
            ok, out = False, f"timed out after {timeout} s\n{e.stdout or ''}\n{e.stderr or ''}"
        if not ok:
            safe = label.replace(":", "-").replace("[", "").replace("]", "")
            with open(os.path.join(keep, f"{safe}-{i}.log"), "w") as f:
                f.write(out if isinstance(out, str) else str(out))
        return label, ok, time.monotonic() - t0

    # Interleaved: the runs of different tests overlap, as they do in a loaded CI.
    jobs = [(p, i) for i in range(a.runs) for p in plan]
    counts = {p[0]: [0, 0] for p in plan}
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        for n, (label, ok, secs) in enumerate(pool.map(one, jobs), 1):
            counts[label][0 if ok else 1] += 1
            if not ok:
                print(f"FAIL {label} ({secs:.1f} s), output in {keep}/", flush=True)
            if n % 50 == 0:
                print(f"stress: {n} of {len(jobs)} runs", flush=True)
    for label, (good, bad) in counts.items():
        print(f"{label}: {good} passed, {bad} failed")
    passed, failed = sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values())
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
