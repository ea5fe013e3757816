#!/usr/bin/env python3
"""The experiment behind docs/policies.md, "Several jobs, one budget": PyTorch trainings started
together on one GPU, each time under one of three ways of splitting the same total budget B:
  - preallocate-fixed: each job preallocates a fixed share and cannot grow past it;
  - growth-capped:     each job grows, with a per-process cap equal to its share;
  - growth-shared:     each job grows, all of them members of one shared budget of B
                       (CUPOOL_SHARE), waiting up to 30 s for room that the others give back.
A job's share is B split in proportion to what it reserved alone (the best split a user who had
measured every job could choose). Each job runs with cupool run --takeover (every tensor through
cupool). First every job runs alone, for its own peak; then each scenario at each budget.

Per job: exit status (finished or not), median step time, peak reserved (its trace), out-of-memory
events, and how often and how long it waited for room (its trace's footer). Per scenario: the
peak of the device's used memory (nvidia-smi, sampled every 100 ms, idle device subtracted).

  run_sharing.py BUILD_DIR WORKLOADS_DIR OUT      (BUILD_DIR holds shim/ and tools/cupool)
Writes OUT/sharing.json and prints a table; exits 1 if the experiment could not be run as claimed
(a job that failed alone, a trace without events, a shared run in which no job was a member).
"""
import glob
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import uuid

BUILD, WORKLOADS, OUT = (os.path.abspath(p) for p in sys.argv[1:4])
HERE = os.path.dirname(os.path.abspath(__file__))
CUPOOL = os.path.join(BUILD, "tools", "cupool")
PY = sys.executable
TRACES = os.environ.get("CUPOOL_SHARING_TRACES", "/tmp/cupool-sharing-traces")
os.makedirs(TRACES, exist_ok=True)
os.makedirs(OUT, exist_ok=True)
MiB = 1 << 20

# The jobs: the reference transformer of ../shared/workloads as it is, and the varying-shape
# training of examples/policies with two draws of lengths (so that their peaks do not coincide).
JOBS = {
    "transformer": ([PY, os.path.join(WORKLOADS, "transformer_step.py")], {}),
    "varlen-1": ([PY, os.path.join(HERE, "..", "policies", "train_varlen.py")], {"STEPS": "100", "SEED": "1"}),
    "varlen-2": ([PY, os.path.join(HERE, "..", "policies", "train_varlen.py")], {"STEPS": "100", "SEED": "2"}),
}
SCENARIOS = [  # (name, jobs, budgets as fractions of the sum of the jobs' peaks alone)
    ("three-transformers", ["transformer", "transformer", "transformer"], [1.0]),
    ("varlen-varlen-transformer", ["varlen-1", "varlen-2", "transformer"], [0.85, 0.7]),
]
WAYS = ["preallocate-fixed", "growth-capped", "growth-shared"]
# For the docs (test/gpu/run_all.sh --docs): SHARING_WAYS (also vmm-capped, vmm-shared: the same
# under the vmm policy), SHARING_SCENARIOS (name:fraction,...: only these), SHARING_ROUNDS (every
# scenario and way once per round, the ways' order reversed every other round).
WAYS = [w for w in os.environ.get("SHARING_WAYS", ",".join(WAYS)).split(",") if w]
if os.environ.get("SHARING_SCENARIOS"):
    keep = [x.split(":") for x in os.environ["SHARING_SCENARIOS"].split(",")]
    SCENARIOS = [(n, j, [f for f in fr if any(n == k and abs(f - float(v)) < 1e-9 for k, v in keep)])
                 for n, j, fr in SCENARIOS]
    SCENARIOS = [s for s in SCENARIOS if s[2]]
ROUNDS = int(os.environ.get("SHARING_ROUNDS", "1"))
failures = []


def fail(what):
    failures.append(what)
    print("FAIL:", what, flush=True)


class DeviceMemory:
    """nvidia-smi's used memory of GPU 0, sampled every 100 ms while a scenario runs."""

    def __init__(self):
        self.samples = []
        self.p = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                   "-i", "0", "-lms", "100"], stdout=subprocess.PIPE, text=True)
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            try:
                self.samples.append(int(line.strip()))
            except ValueError:
                pass

    def stop(self):
        self.p.terminate()
        self.p.wait()
        self.t.join(timeout=5)
        return max(self.samples) if self.samples else None


def idle_used_mib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True).stdout
    return int(out.strip().splitlines()[0])


def read_trace(pattern):
    """Peak reserved, out-of-memory events, allocations, and the footer's waits, of one job's trace."""
    s = {"files": 0, "peak_reserved": 0, "peak_in_use": 0, "ooms": 0, "oom_classes": [], "allocs": 0,
         "share_waits": None, "share_wait_ns": None, "shared": False}
    for f in glob.glob(pattern):
        s["files"] += 1
        for line in open(f, encoding="utf-8"):
            r = json.loads(line)
            t = r.get("type")
            if t == "header":
                s["shared"] = bool((r.get("config") or {}).get("share"))
            elif t == "footer":
                s["share_waits"] = r.get("share_waits")
                s["share_wait_ns"] = r.get("share_wait_ns")
            elif t == "event":
                if r.get("reserved") is not None:
                    s["peak_reserved"] = max(s["peak_reserved"], r["reserved"])
                    s["peak_in_use"] = max(s["peak_in_use"], r.get("in_use", 0))
                if r["ev"] == "alloc" and r.get("rc", 0) == 0:
                    s["allocs"] += 1
                if r["ev"] == "oom":
                    s["ooms"] += 1
                    s["oom_classes"].append(r.get("oom"))
    return s


def step_ms(out):
    m = re.search(r"step=([\d.]+) ms", out or "")
    if m:
        return float(m.group(1))
    for line in reversed((out or "").splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line).get("median_step_ms")
            except json.JSONDecodeError:
                pass
    return None


def launch(tag, job, way, share_mib=None, budget_name=None, budget_mib=None):
    cmd, env_extra = JOBS[job]
    trace = os.path.join(TRACES, f"{tag}.%p.jsonl")
    args = [CUPOOL, "run", "--takeover", "--no-summary", "--trace", trace]
    env = dict(os.environ, CUPOOL_LOG_LEVEL="warn", **env_extra)
    if way == "preallocate-fixed":
        args += ["--policy", "preallocate", "--preallocate", f"{share_mib}MiB"]
        env["CUPOOL_PREALLOCATE_GROW"] = "false"
    elif way in ("growth-capped", "vmm-capped"):
        args += ["--policy", way.split("-")[0], "--limit", f"{share_mib}MiB"]
    elif way in ("growth-shared", "vmm-shared"):
        args += ["--policy", way.split("-")[0]]
        env.update(CUPOOL_SHARE=budget_name, CUPOOL_SHARE_LIMIT=f"0:{budget_mib}MiB", CUPOOL_SHARE_WAIT="30s")
    else:  # alone: growth, no cap
        args += ["--policy", "growth"]
    p = subprocess.Popen(args + ["--"] + cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p, trace.replace("%p", "*")


def finish(p, pattern, job):
    try:
        out, err = p.communicate(timeout=400)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        rc = "timeout"
    t = read_trace(pattern)
    return {"job": job, "rc": rc, "finished": rc == 0, "step_ms": step_ms(out),
            "peak_reserved_mib": round(t["peak_reserved"] / MiB, 1), "peak_in_use_mib": round(t["peak_in_use"] / MiB, 1),
            "allocs": t["allocs"], "ooms": t["ooms"], "oom_classes": sorted(set(c for c in t["oom_classes"] if c)),
            "share_member": t["shared"], "share_waits": t["share_waits"],
            "share_wait_s": None if t["share_wait_ns"] is None else round(t["share_wait_ns"] / 1e9, 3),
            "stderr_tail": "" if rc == 0 else err[-800:]}


results = {"header": json.load(open(os.environ["CUPOOL_RUN_HEADER"])) if os.environ.get("CUPOOL_RUN_HEADER") else None,
           "alone": {}, "scenarios": []}
idle = idle_used_mib()
results["idle_used_mib"] = idle

# 1. Each job alone: its own peak, for the shares.
for job in JOBS:
    p, pattern = launch(f"alone-{job}", job, "alone")
    r = finish(p, pattern, job)
    results["alone"][job] = r
    print(f"alone {job}: rc {r['rc']} step {r['step_ms']} ms, peak reserved {r['peak_reserved_mib']} MiB, "
          f"in use {r['peak_in_use_mib']} MiB", flush=True)
    if not r["finished"] or r["allocs"] == 0:
        fail(f"{job} alone: rc {r['rc']}, {r['allocs']} allocations traced {r['stderr_tail'][-300:]}")

# 2. The scenarios, ROUNDS times.
for rnd, name, jobs, fractions in [(r, *s) for r in range(1, ROUNDS + 1) for s in SCENARIOS]:
    peaks = [results["alone"][j]["peak_reserved_mib"] for j in jobs]
    if not all(peaks):
        continue
    for fraction in fractions:
        budget = int(math.ceil(fraction * sum(peaks) / 64) * 64)  # MiB, a multiple of 64
        shares = [int(budget * pk / sum(peaks)) for pk in peaks]
        for way in (WAYS if rnd % 2 else WAYS[::-1]):
            tag = f"{name}-{int(fraction * 100)}pct-{way}" + (f"-round{rnd}" if ROUNDS > 1 else "")
            budget_name = "sharing-" + uuid.uuid4().hex[:10]
            mem = DeviceMemory()
            started = time.time()
            launched = [launch(f"{tag}-{i}-{j}", j, way, share_mib=shares[i], budget_name=budget_name,
                               budget_mib=budget) for i, j in enumerate(jobs)]
            done = [finish(p, pattern, j) for (p, pattern), j in zip(launched, jobs)]
            wall = time.time() - started
            peak = mem.stop()
            try:
                os.unlink(f"/dev/shm/cupool-share-{os.getuid()}-{budget_name}")
            except FileNotFoundError:
                pass
            for d, s in zip(done, shares):
                d["share_mib"] = s
            row = {"round": rnd, "scenario": name, "fraction": fraction, "budget_mib": budget, "way": way, "wall_s": round(wall, 1),
                   "finished": sum(d["finished"] for d in done), "jobs": done,
                   "peak_device_used_mib": None if peak is None else peak - idle,
                   "sum_peak_reserved_mib": round(sum(d["peak_reserved_mib"] for d in done), 1)}
            results["scenarios"].append(row)
            print(f"{tag}: budget {budget} MiB, {row['finished']}/{len(jobs)} finished, device peak "
                  f"{row['peak_device_used_mib']} MiB over idle; " + "; ".join(
                      f"{d['job']} rc {d['rc']} step {d['step_ms']} waits {d['share_waits']} ({d['share_wait_s']} s) "
                      f"reserved {d['peak_reserved_mib']} ooms {d['ooms']}{d['oom_classes']}" for d in done), flush=True)
            for d in done:
                if d["allocs"] == 0:
                    fail(f"{tag} {d['job']}: its trace saw no allocation")
                if way.endswith("-shared") and not d["share_member"]:
                    fail(f"{tag} {d['job']}: not a member of the shared budget")

with open(os.path.join(OUT, "sharing.json"), "w") as f:
    json.dump(results, f, indent=1)
sys.exit(1 if failures else 0)
