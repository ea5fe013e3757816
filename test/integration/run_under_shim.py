#!/usr/bin/env python3
"""Runs one test program on the simulated CUDA under LD_PRELOAD=libcupool.so, with a trace, and
checks the trace against what the program says it did: every allocation and free exactly once,
on the expected path, with sane fields. Used by meson test (test/integration/meson.build)."""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

# How each program reaches the allocation functions: the path its own allocations must show.
EXPECTED_PATHS = {
    "prog_runtime": {"symbol"},
    "prog_driver": {"symbol"},
    "prog_dlsym": {"dlsym"},
    "prog_procaddress": {"proc-address"},
    "prog_entrypoint": {"entry-point", "symbol"},
    "prog_static_runtime": {"proc-address"},
    "prog_inflight": {"symbol"},
    "prog_streams": {"symbol"},
    "prog_threads": {"symbol"},
    "prog_fork": {"symbol"},
    "prog_ipc": {"symbol"},
    "prog_vmm_cache": {"symbol"},
    "prog_stream_destroy": {"symbol"},
    "prog_per_thread": {"symbol"},
    "prog_last_error": {"symbol"},
    "prog_capture": {"symbol"},
    "prog_arrays": {"symbol", "proc-address"},  # the runtime's arrays come through the driver
    "prog_nvml": {"symbol"},
    "prog_nvml_dlopen": {"symbol"},
    "prog_peer": {"symbol"},
}

# Program counts of virtual-memory calls (successful ones) and the trace events that must match.
VMM_COUNTS = {"vmm_creates": "vmm_create", "vmm_releases": "vmm_release", "maps": "vmm_map", "unmaps": "vmm_unmap"}


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def shim_env(shim, sim_dir, sanitized):
    """This process's environment with libcupool.so preloaded and the simulated CUDA on the library
    path. Under the sanitizers, their runtime must come first in a preloaded process."""
    env = dict(os.environ)
    preload = [shim]
    if sanitized:
        asan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
        preload.insert(0, asan)
        env["ASAN_OPTIONS"] = "detect_leaks=0:" + env.get("ASAN_OPTIONS", "")
    env["LD_PRELOAD"] = ":".join(preload)
    env["LD_LIBRARY_PATH"] = sim_dir + ":" + env.get("LD_LIBRARY_PATH", "")
    return env


def read_trace(path):
    lines = open(path, encoding="utf-8").read().splitlines()
    if not lines:
        fail(f"{path}: empty trace")
    records = []
    for n, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            fail(f"{path}:{n}: not JSON ({e})")
    if records[0].get("type") != "header":
        fail(f"{path}: first line is not a header")
    if records[-1].get("type") != "footer":
        fail(f"{path}: last line is not a footer")
    header = records[0]
    if header.get("format") != "cupool-trace" or not str(header.get("version", "")).startswith("3."):
        fail(f"{path}: bad header {header}")
    events = [r for r in records if r.get("type") == "event"]
    # Threads write their own buffers: file order is not time order. `t` orders events (an
    # allocation when it returned, a free when it was called), so sorting by it is consistent.
    events.sort(key=lambda e: e["t"])
    footer = records[-1]
    if footer.get("events") != len(events):
        fail(f"{path}: footer counts {footer.get('events')} events, file has {len(events)}")
    if footer.get("dropped", 0) != 0:
        fail(f"{path}: {footer['dropped']} events dropped")
    return header, events, footer


def check_vmm(name, events, report, policy, free):
    """Virtual-memory calls: one event per successful program call, whether the driver or cupool's
    mapping cache served it; the cache serves only when pooling."""
    # cupool's own give-backs of mappings its cache kept (api "cupool") are not program calls.
    given_back = [e for e in events if e["ev"] == "vmm_release" and e["api"] == "cupool"]
    if given_back and policy == "passthrough":
        fail(f"{name}: passthrough gave back a kept mapping: {given_back[0]}")
    ok = [e for e in events if e["rc"] == 0 and e["api"] != "cupool"]
    for key, ev in VMM_COUNTS.items():
        if key in report:
            n = sum(1 for e in ok if e["ev"] == ev)
            if n != report[key]:
                fail(f"{name}: program made {report[key]} successful {ev} calls, trace has {n}")
    if "vmm_bytes" in report:
        n = sum(e["size"] for e in ok if e["ev"] == "vmm_create")
        if n != report["vmm_bytes"]:
            fail(f"{name}: program created {report['vmm_bytes']} VMM bytes, trace has {n}")
    recycled = [e for e in events if e.get("recycled")]
    if policy == "passthrough" and recycled:
        fail(f"{name}: passthrough served VMM calls from the cache: {recycled[0]}")
    for e in recycled:
        if e["rc"] != 0:
            fail(f"recycled event with an error code: {e}")
    if "steady_vmm_driver_calls" in report:
        if report.get("cache_expected") != (policy != "passthrough"):
            fail(f"{name}: the program expected the cache {report.get('cache_expected')} under {policy}")
        if policy != "passthrough":
            # Sync mode reuses every freed mapping after its wait: no driver call at all in the
            # steady steps. Deferred mode creates a mapping when none of that size has retired yet
            # and the size has fewer than 32: how often depends on the device's pace against the
            # host's, that is on the machine's load, so no count is asserted there; that the
            # cache served calls of every kind is (below).
            if free == "sync" and report["steady_vmm_driver_calls"] != 0:
                fail(f"{name}: {report['steady_vmm_driver_calls']} VMM driver calls in the steady steps "
                     f"({report['steady_vmm_calls']} calls made), none expected")
            kinds = {e["ev"] for e in recycled}
            want = {"vmm_create", "va_reserve", "vmm_map", "vmm_unmap", "vmm_release", "va_free"}
            if not want <= kinds:
                fail(f"{name}: no recycled events of {sorted(want - kinds)}")


def check_events(name, events, expect_policy):
    live = {}
    allocs = frees = 0
    alloc_bytes = 0
    paths = set()
    for e in events:
        for key in ("t", "tid", "ev", "api", "path", "rc"):
            if key not in e:
                fail(f"event without '{key}': {e}")
        # Calls a thread's cache served are timed one in timed_for; the others have no "dur".
        if "dur" not in e and (e["ev"] not in ("alloc", "free") or "reserved" not in e):
            fail(f"event without 'dur' that no thread cache served: {e}")
        if "timed_for" in e and ("dur" not in e or e["timed_for"] < 2):
            fail(f"event with a bad 'timed_for': {e}")
        if e["ev"] == "va_reserve" and e["rc"] == 0 and e.get("ptr") == "0x0":
            fail(f"va_reserve event without the reserved address: {e}")
        if e["ev"] == "alloc" and e["rc"] == 0 and e.get("size", 0) > 0:
            ptr = e["ptr"]
            if ptr in live:
                fail(f"{ptr} handed out twice without a free in between: {e}")
            live[ptr] = e
            allocs += 1
            alloc_bytes += e["size"]
            paths.add(e["path"])
            if expect_policy != "passthrough" and e["api"] in ("cudaMalloc", "cuMemAlloc_v2") and not e.get("reserved"):
                fail(f"pool-served allocation without pool state: {e}")
        elif e["ev"] == "context_reset":
            # The context's memory went with it: its addresses may be handed out again. (The
            # trace does not say which context a block came from: every block of the device.)
            live = {p: a for p, a in live.items() if a.get("dev") != e.get("dev")}
        elif e["ev"] == "free" and e["rc"] == 0:
            if e["ptr"] not in live:
                fail(f"free of {e['ptr']} that the trace never saw allocated: {e}")
            del live[e["ptr"]]
            frees += 1
            paths.add(e["path"])
    expected = EXPECTED_PATHS.get(name)
    if expected and not paths <= expected:
        fail(f"{name}: events came by {sorted(paths)}, expected only {sorted(expected)}")
    return allocs, frees, alloc_bytes, live


def check_streams(events, policy, free):
    """prog_streams: two stream_create events; with pools and deferred frees, nothing is quarantined
    while only one blocking stream exists, and the frees after the second one are."""
    creates = [e for e in events if e["ev"] == "stream_create"]
    destroys = [e for e in events if e["ev"] == "stream_destroy"]
    if len(creates) != 2 or len(destroys) != 2:
        fail(f"prog_streams: expected 2 stream_create and 2 stream_destroy events, got {len(creates)} and {len(destroys)}")
    for e in creates:
        if e.get("flags") != 0 or not e.get("stream", "").startswith("0x") or e["api"] != "cudaStreamCreate":
            fail(f"prog_streams: bad stream_create event {e}")
    if policy == "passthrough" or free != "deferred":
        return
    second = creates[1]["t"]
    pool_frees = [e for e in events if e["ev"] == "free" and "quarantined" in e]
    before = [e for e in pool_frees if e["t"] < second]
    after = [e for e in pool_frees if e["t"] > second]
    if not before or any(e["quarantined"] != 0 for e in before):
        fail(f"prog_streams: frees with one blocking stream were quarantined: {before}")
    if not after or after[0]["quarantined"] == 0:
        fail(f"prog_streams: the free after a second blocking stream was not quarantined: {after[:1]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", required=True)
    ap.add_argument("--sim-dir", required=True)
    ap.add_argument("--policy", default="passthrough")
    ap.add_argument("--free", default="sync")
    ap.add_argument("--sanitized", action="store_true")
    # The device has no virtual memory (CUPOOL_SIM_NO_VMM=1), or its driver refuses the granules
    # (=create): the vmm policy must grow in chunks, as growth does, and say so in one line, which
    # names the reason (the text given).
    ap.add_argument("--expect-no-vmm", metavar="REASON", default=None)
    ap.add_argument("program")
    ap.add_argument("args", nargs="*")
    a = ap.parse_args()

    name = os.path.basename(a.program)
    with tempfile.TemporaryDirectory() as tmp:
        env = shim_env(a.shim, a.sim_dir, a.sanitized)
        env["CUPOOL_TRACE"] = os.path.join(tmp, "trace.%p.jsonl")
        env["CUPOOL_POLICY"] = a.policy
        env["CUPOOL_FREE"] = a.free
        env.setdefault("CUPOOL_LOG_LEVEL", "warn")
        proc = subprocess.run([a.program] + a.args, env=env, capture_output=True, text=True, timeout=300)
        sys.stderr.write(proc.stderr)
        if proc.returncode != 0:
            print(proc.stdout)
            fail(f"{name} exited with {proc.returncode} under policy={a.policy} free={a.free}")
        # Each process that did CUDA work (a forked or re-executed child too) prints its count.
        report = {}
        extra = {}
        for line in proc.stdout.splitlines():
            try:
                counts = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(counts, dict):
                for k in ("allocs", "frees", "bytes"):
                    if k in counts:
                        report[k] = report.get(k, 0) + counts[k]
                extra.update({k: v for k, v in counts.items() if k not in ("allocs", "frees", "bytes")})
        if not report:
            fail(f"{name}: no JSON count in the program's output: {proc.stdout[-500:]!r}")

        traces = sorted(glob.glob(os.path.join(tmp, "trace.*.jsonl")))
        if not traces:
            fail("no trace written")
        own = traces  # a forked child writes its own file: both count
        totals = [0, 0, 0]
        leftover = {}
        for t in own:
            header, events, footer = read_trace(t)
            allocs, frees, nbytes, live = check_events(name, events, a.policy)
            if len(own) == 1:
                check_vmm(name, events, extra, a.policy, a.free)
            totals[0] += allocs
            totals[1] += frees
            totals[2] += nbytes
            leftover.update(live)
            if name == "prog_streams":
                check_streams(events, a.policy, a.free)
        if "allocs" in report and report["allocs"] != totals[0]:
            fail(f"{name}: program made {report['allocs']} allocations, trace has {totals[0]}")
        if "frees" in report and report["frees"] != totals[1]:
            fail(f"{name}: program made {report['frees']} frees, trace has {totals[1]}")
        if report.get("skipped"):  # the simulated CUDA has what every program needs: nothing may skip
            fail(f"{name} skipped its check: {report}")
        if "mappings" in report:  # prog_peer: every block reachable from the peer device
            want = 3 if a.policy == "vmm" else 0  # under the vmm policy, blocks are cuMemCreate mappings
            if report["mappings"] != want or report["reachable"] != 3:
                fail(f"{name}: {report['mappings']} blocks were mappings (expected {want}), "
                     f"{report['reachable']} of 3 reachable from device 1")
        if "bytes" in report and report["bytes"] > totals[2]:
            fail(f"{name}: program asked for {report['bytes']} bytes, trace has {totals[2]}")
        if a.expect_no_vmm:
            said = [l for l in proc.stderr.splitlines() if "the vmm policy grows in chunks here, as growth does" in l]
            if len(said) != 1 or a.expect_no_vmm not in said[0]:
                fail(f"{name}: expected one line saying the vmm policy grows in chunks, and why; stderr had {said}")
            for t in own:
                grows = [e for e in read_trace(t)[1] if e["ev"] == "grow"]
                if not grows or any(e.get("granules") for e in grows):
                    fail(f"{name}: expected chunks, not granules, without virtual memory: {grows[:3]}")
        print(f"ok: {name} policy={a.policy} free={a.free}: {totals[0]} allocs, {totals[1]} frees in {len(own)} trace(s)")


if __name__ == "__main__":
    main()
