#!/usr/bin/env python3
"""Tests of the cupool command (tools/), run by meson (test/tools/meson.build).

  check_tools.py --cupool PATH [--gen gen_trace.py] [--golden DIR] CHECK [options]

CHECK:
  golden [--update]   report (text, JSON, HTML), replay and export on generated traces against
                      the files in golden/; --update rewrites them (the test then passes)
  replay              the hand-computable replay: numbers checked one by one
  replay-share        replay of several traces merged on the wall clock against one shared
                      budget (refusals, the wait's give-back), --min-budget and --min-capacity
  fuzz                malformed traces: a clear message with the line number, exit 3, no crash
  html                the HTML report rendered in headless Chromium: charts drawn, screenshot not
                      blank, no label cut off, no sideways scrolling at 950 and 800 px (exit 77,
                      skipped, when chromium is not installed)
  summed              figures summed over processes (report, the HTML charts, replay's recorded
                      column) count only the processes alive at each moment
  charts              the HTML page's charts and summary read from the page: fragmentation as each
                      bucket's mean with a min-max band, requested over in use, the headers
  run --shim LIB --sim-dir DIR --program PROG [--retry-program oom_retry]
                      cupool run on the simulated CUDA: preload, exit status and signal, takeover,
                      summary, and report/replay/export on the trace it wrote; a program that
                      retries a refused allocation thousands of times (rate-limited warnings)
  cli                 --help, --version, usage errors and exit codes; output files (no link
                      followed, never left half-written) and standard output errors (exit 4)
  input               compressed traces (gzip, zstd: recognised by their bytes) and traces holding
                      bytes that are not UTF-8: every output is valid UTF-8
  perf [--events N]   report's reading speed on a generated trace (CPU time of the child)
  formats --pickle-probe PATH
                      export --memory-viz (loaded with pickle, checked against the trace and for
                      the consistency memory_viz needs) and --rmm-csv; the pickle writer's values
"""
import argparse
import gzip
import importlib.util
import io
import json
import os
import random
import re
import resource
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = 77
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what, file=sys.stderr)
    return cond


def finish():
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        sys.exit(1)
    print("ok")
    sys.exit(0)


class Cupool:
    def __init__(self, path, cwd):
        self.path = path
        self.cwd = cwd

    def __call__(self, *args, env=None, check_rc=None):
        p = subprocess.run([self.path, *args], cwd=self.cwd, env=env, capture_output=True, text=True,
                           errors="replace", timeout=300)
        if check_rc is not None and p.returncode != check_rc:
            check(False, f"cupool {' '.join(args)}: exit {p.returncode}, expected {check_rc}\n{p.stderr}")
        return p


def gen(opts, scenario, out, *extra):
    subprocess.run([sys.executable, opts.gen, scenario, out, *extra], check=True)


def hand_trace(opts, path, build, policy="growth", cmdline=("prog",), raw=None):
    """A trace written by `build(writer)` with gen_trace.py's Writer; `raw` maps markers in the
    text to the bytes that replace them (bytes that are not UTF-8, which JSON text cannot hold)."""
    spec = importlib.util.spec_from_file_location("gen_trace", opts.gen)
    g = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(g)
    out = io.StringIO()
    w = g.Writer(out, 4242, list(cmdline), g.config(policy))
    build(w)
    w.footer()
    data = out.getvalue().encode()
    for marker, replacement in (raw or {}).items():
        data = data.replace(marker.encode(), replacement)
    with open(path, "wb") as f:
        f.write(data)


def run_bytes(cupool, *args, cwd=None, **kw):
    """cupool's output as bytes (to check that it is valid UTF-8)."""
    return subprocess.run([cupool, *args], cwd=cwd, capture_output=True, timeout=300, **kw)


def make_traces(opts, d):
    gen(opts, "training", os.path.join(d, "training.jsonl"))
    gen(opts, "passthrough", os.path.join(d, "passthrough.jsonl"))
    for i in (1, 2, 3):
        gen(opts, "rank", os.path.join(d, f"rank{i}.jsonl"), "--pid", str(100 + i), "--seed", str(i))
    gen(opts, "killed", os.path.join(d, "killed.jsonl"), "--pid", "999", "--seed", "9")
    gen(opts, "replay", os.path.join(d, "replay.jsonl"))


# What each golden file is made from: name -> (arguments, expected exit status, output file or None for stdout).
GOLDEN = {
    "report-training.txt": (["report", "training.jsonl"], 0, None),
    "report-training.json": (["report", "--json", "training.jsonl"], 0, None),
    "report-training.html": (["report", "training.jsonl", "--html", "out.html"], 0, "out.html"),
    "report-passthrough.txt": (["report", "passthrough.jsonl"], 0, None),
    "report-ranks.txt": (["report", "rank1.jsonl", "rank2.jsonl", "rank3.jsonl"], 0, None),
    "report-ranks.json": (["report", "--json", "rank1.jsonl", "rank2.jsonl", "rank3.jsonl"], 0, None),
    "report-killed.txt": (["report", "killed.jsonl"], 0, None),
    "replay-training.txt": (["replay", "training.jsonl", "--limit", "300MiB"], 1, None),
    "replay-training.json": (["replay", "--json", "training.jsonl", "--policy", "growth,preallocate,passthrough",
                              "--limit", "300MiB"], 1, None),
    # Three processes sharing a 1 GiB device: preallocate's 75% leaves the last one nothing.
    "replay-ranks.txt": (["replay", "rank1.jsonl", "rank2.jsonl", "rank3.jsonl", "--capacity", "1GiB"], 1, None),
    "export-training.json": (["export", "--perfetto", "training.jsonl", "-o", "out.json"], 0, "out.json"),
    "export-passthrough.json": (["export", "--perfetto", "passthrough.jsonl", "-o", "out.json", "--slow", "50us"], 0,
                                "out.json"),
    "export-ranks.json": (["export", "--perfetto", "rank1.jsonl", "rank2.jsonl", "rank3.jsonl", "-o", "out.json"], 0,
                          "out.json"),
}


def cmd_golden(opts):
    with tempfile.TemporaryDirectory() as d:
        make_traces(opts, d)
        cupool = Cupool(opts.cupool, d)
        for name, (args, rc, out_file) in GOLDEN.items():
            p = cupool(*args, "--no-progress" if args[0] != "export" else "--no-progress")
            check(p.returncode == rc, f"{name}: cupool {' '.join(args)} exited {p.returncode}, expected {rc}: {p.stderr}")
            got = open(os.path.join(d, out_file)).read() if out_file else p.stdout
            if name.startswith("export"):
                try:
                    doc = json.loads(got)
                    check(isinstance(doc.get("traceEvents"), list) and doc["traceEvents"], f"{name}: no traceEvents")
                except json.JSONDecodeError as e:
                    check(False, f"{name}: not JSON: {e}")
            path = os.path.join(opts.golden, name)
            if opts.update:
                with open(path, "w") as f:
                    f.write(got)
                print(f"updated {path}")
                continue
            if not os.path.exists(path):
                check(False, f"{name}: no golden file {path} (run with --update)")
                continue
            want = open(path).read()
            if got != want:
                import difflib
                diff = "".join(list(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "golden/" + name,
                                                         "now", n=2))[:60])
                check(False, f"{name}: differs from the golden file (check_tools.py golden --update to accept)\n{diff}")
    finish()


def cmd_replay(opts):
    MiB = 1 << 20
    with tempfile.TemporaryDirectory() as d:
        gen(opts, "replay", os.path.join(d, "replay.jsonl"))
        cupool = Cupool(opts.cupool, d)
        # alloc 1 MiB, alloc 3 MiB, free the first, alloc 2 MiB; growth chunks 4 MiB then 8 MiB.
        p = cupool("replay", "--json", "replay.jsonl", "--policy", "growth,passthrough", "--growth-chunk", "4MiB",
                   "--capacity", "64MiB", check_rc=0)
        r = json.loads(p.stdout)
        rec = r["recorded"]["devices"][0]
        check(rec["peak_requested"] == 5 * MiB and rec["peak_in_use"] == 5 * MiB, f"recorded peaks: {rec}")
        g = {x["policy"]: x for x in r["policies"]}
        gd = g["growth"]["devices"][0]
        # 1 MiB and 3 MiB fill the first 4 MiB chunk; the 2 MiB allocation fits in no free block
        # (1 MiB free) and takes the next, doubled, chunk of 8 MiB.
        check(gd["chunks_taken"] == 2, f"growth chunks taken {gd['chunks_taken']} != 2")
        check(gd["chunk_bytes_taken"] == 12 * MiB, f"growth chunk bytes {gd['chunk_bytes_taken']} != 12 MiB")
        check(gd["peak_reserved"] == 12 * MiB, f"growth peak reserved {gd['peak_reserved']} != 12 MiB")
        check(gd["peak_in_use"] == 5 * MiB, f"growth peak in use {gd['peak_in_use']} != 5 MiB")
        check(gd["chunks_returned"] == 0, "growth returned chunks")
        # At peak in use: free = 12 - 5 = 7 MiB, largest block 6 MiB (8 MiB chunk less 2 MiB).
        check(abs(gd["fragmentation"]["at_peak_in_use"] - (1 - 6 / 7)) < 1e-9,
              f"growth fragmentation at peak {gd['fragmentation']['at_peak_in_use']} != 1/7")
        check(g["growth"]["oom_count"] == 0 and g["growth"]["first_failure"] is None, "growth ran out of memory")
        pd = g["passthrough"]["devices"][0]
        # Passthrough, as the library runs it: each allocation held on its own at its exact size,
        # outside any pool (no chunks), so reserved is what is live: 1 + 3, then 3 + 2 MiB.
        check(pd["chunks_taken"] == 0 and pd["chunks_returned"] == 0, f"passthrough took chunks: {pd}")
        check(pd["peak_reserved"] == 5 * MiB and pd["peak_in_use"] == 5 * MiB, f"passthrough peaks: {pd}")
        check(r["out_of_memory"] is False, "out_of_memory should be false")

        # A 6 MiB device: growth still fits (4 + 2 MiB chunk when 8 does not fit? the pool
        # decides); preallocate takes 75% = 4.5 -> 4 MiB and cannot grow: the 2 MiB allocation
        # fails, and replay exits 1 naming it.
        p = cupool("replay", "--json", "replay.jsonl", "--policy", "preallocate", "--capacity", "6MiB", check_rc=1)
        r = json.loads(p.stdout)
        pre = r["policies"][0]
        check(pre["oom_count"] == 1, f"preallocate oom_count {pre['oom_count']} != 1")
        ff = pre["first_failure"] or {}
        check(ff.get("size") == 2 * MiB and ff.get("api") == "cudaMalloc", f"first failure: {ff}")
        check(ff.get("line") == 6, f"first failure line {ff.get('line')} != 6 (the 2 MiB alloc)")
        check(ff.get("pool", {}).get("reserved") == 4 * MiB, f"first failure pool: {ff.get('pool')}")
        p = cupool("replay", "replay.jsonl", "--policy", "preallocate", "--capacity", "6MiB", check_rc=1)
        check("preallocate: at" in p.stdout and "2.00 MiB refused" in p.stdout, "text names the first failure:\n" + p.stdout)
        # A limit under the 2 MiB step: passthrough refuses with class "limit".
        p = cupool("replay", "--json", "replay.jsonl", "--policy", "passthrough", "--limit", "4MiB", check_rc=1)
        ff = json.loads(p.stdout)["policies"][0]["first_failure"]
        check(ff and ff["class"] == "limit" and ff["size"] == 2 * MiB, f"passthrough limit failure: {ff}")
        # A free that comes before its allocation in the file (threads drained out of order).
        gen(opts, "interleaved", os.path.join(d, "interleaved.jsonl"))
        r = json.loads(cupool("report", "--json", "interleaved.jsonl", check_rc=0).stdout)
        dev = r["traces"][0]["devices"][0]
        check(dev["unmatched_frees"] == 0 and dev["peak_requested"] == 2 * MiB,
              f"interleaved report: {dev['unmatched_frees']} unmatched frees, peak requested {dev['peak_requested']}")
        r = json.loads(cupool("replay", "--json", "interleaved.jsonl", "--policy", "passthrough", check_rc=0).stdout)
        pd = r["policies"][0]["devices"][0]
        check(pd["peak_reserved"] == 2 * MiB and pd["failed_allocs"] == 0,
              f"interleaved replay: peak reserved {pd['peak_reserved']}, {pd['failed_allocs']} failed")
        # Bad options are usage errors.
        p = cupool("replay", "replay.jsonl", "--policy", "bogus", check_rc=2)
        check("CUPOOL_POLICY" in p.stderr, "bad policy message names CUPOOL_POLICY: " + p.stderr)
        cupool("replay", "replay.jsonl", "--capacity", "lots", check_rc=2)
        p = cupool("replay", "replay.jsonl", "--preallocate", "1", check_rc=2)
        check("CUPOOL_PREALLOCATE" in p.stderr and "2MiB" in p.stderr, "--preallocate 1 (one byte): " + p.stderr)

        # Memory the recorded pool did not serve (managed allocations: no pool fields), refused by
        # the replayed preallocate pool: each refusal is one out-of-memory, as the shim counts it.
        # A 64 MiB device: 48 MiB preallocated, 16 MiB left: two 8 MiB allocations fit, three do
        # not; then a cuMemCreate that does not fit either (an oom, no failed allocation).
        def managed(w):
            w.device(0, "Sim", 64 * MiB)
            w.t += 1000
            w.event("alloc", api="cudaMalloc", path="symbol", size=MiB, ptr=0x7F0000000000,
                    pool={"reserved": 48 * MiB, "in_use": MiB, "largest_free": 47 * MiB, "quarantined": 0,
                          "free_blocks": 1})
            for i in range(5):
                w.t += 1000
                w.event("alloc", api="cudaMallocManaged", path="symbol", size=8 * MiB, ptr=0x7E0000000000 + i * 8 * MiB)
            w.t += 1000
            w.event("vmm_create", api="cuMemCreate", path="symbol", size=8 * MiB, ptr=0x1000)

        hand_trace(opts, os.path.join(d, "managed.jsonl"), managed, policy="preallocate")
        r = json.loads(cupool("replay", "--json", "managed.jsonl", "--policy", "preallocate", check_rc=1).stdout)
        pre = r["policies"][0]
        check(pre["devices"][0]["failed_allocs"] == 3, f"managed replay: {pre['devices'][0]['failed_allocs']} failed, expected 3")
        check(pre["oom_count"] == 4, f"managed replay: {pre['oom_count']} out of memory, expected 4 (3 allocations, 1 cuMemCreate)")
    finish()


def gen_module(opts):
    spec = importlib.util.spec_from_file_location("gen_trace", opts.gen)
    g = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(g)
    return g


def timed_trace(opts, path, pid, t0, build, end=None, footer=True, cfg=None, version="1.0"):
    """A trace of process `pid` opened at monotonic `t0` (ns), all of one boot (the wall clock
    moves with it), written by `build(writer)`; its footer ends at `end` (default: the last
    event), none when `footer` is false (the process was killed)."""
    g = gen_module(opts)
    with open(path, "w") as f:
        w = g.Writer(f, pid, ["./prog", str(pid)], cfg or g.config("growth"), t0=t0,
                     start_unix=1_700_000_000_000_000_000 + t0, version=version)
        build(w)
        if footer:
            last = w.t
            w.t = end if end is not None else last
            w.footer()


def path_vertices(d_attr):
    """The vertices of an SVG path made of M, H, V and L commands: [(x, y)]."""
    pts = []
    x = y = 0.0
    for cmd, args in re.findall(r"([MHVLZ])([^MHVLZ]*)", d_attr):
        nums = [float(v) for v in re.findall(r"-?[\d.]+", args)]
        if cmd in "ML":
            x, y = nums[0], nums[1]
        elif cmd == "H":
            x = nums[0]
        elif cmd == "V":
            y = nums[0]
        else:
            continue
        pts.append((x, y))
    return pts


def chart_paths(html):
    """Each chart's paths in drawing order: [(kind, caption, [(class, series, d, attrs)])]."""
    charts = []
    for cap, kind, body in re.findall(r'<figcaption>(.*?)</figcaption>\s*<svg class="chart" data-chart="(\w+)"(.*?)</svg>',
                                      html, re.S):
        paths = re.findall(r'<path class="([^"]+)" data-series="([^"]+)" data-points="\d+" d="([^"]*)"([^>]*)>', body)
        charts.append((kind, cap, paths))
    return charts


# The charts' geometry (tools/html.cpp): the plot's left edge and width, top and height.
CHART_LEFT, CHART_WIDTH, CHART_TOP, CHART_HEIGHT = 78.0, 786.0, 14.0, 192.0


def chart_value(y, top):
    """The value a y coordinate stands for on an axis from 0 to `top`."""
    return (CHART_TOP + CHART_HEIGHT - y) / CHART_HEIGHT * top


def cmd_summed(opts):
    """Figures summed over processes count only the processes alive at each moment: a process's
    memory ends at its footer's end time, else (killed) at its last event (issue 27)."""
    MiB = 1 << 20
    S = 1_000_000_000
    with tempfile.TemporaryDirectory() as d:
        cupool = Cupool(opts.cupool, d)

        def holds_480(start, keep=True):
            """grow a 480 MiB chunk, allocate all of it, free it (the pool keeps its chunk)."""
            def build(w):
                w.device(0, "Sim", 16 << 30)
                base = 0x7F0000000000
                for dt, ev, size, in_use in ((1, "grow", 480 * MiB, 0), (2, "alloc", 480 * MiB, 480 * MiB),
                                             (3, "free", 0, 0)):
                    w.t = start + dt * 1_000_000
                    api = {"alloc": "cudaMalloc", "free": "cudaFree"}.get(ev, "")
                    w.event(ev, api=api, path="symbol" if api else "none", size=size, ptr=base, dur=1000,
                            pool={"reserved": 480 * MiB, "in_use": in_use, "largest_free": 480 * MiB - in_use,
                                  "quarantined": 0, "free_blocks": 1 if in_use == 0 else 0})
            return build

        # Four processes of 480 MiB one after the other, a second apart: each exits (its footer)
        # 0.1 s after it began; the third was killed (no footer: its memory ends at its last event).
        names = []
        for i in range(4):
            name = f"seq{i}.jsonl"
            names.append(name)
            start = (1 + i) * S
            timed_trace(opts, os.path.join(d, name), 11 + i, start, holds_480(start), end=start + S // 10, footer=i != 2)
        r = json.loads(cupool("report", "--json", "--no-progress", *names, check_rc=0).stdout)
        total = r["devices"][0]
        check(total["peak_reserved"] == 480 * MiB and total["peak_in_use"] == 480 * MiB,
              f"report --json: summed peak reserved {total['peak_reserved'] / MiB} MiB, in use "
              f"{total['peak_in_use'] / MiB} MiB of processes that never overlapped; expected 480 MiB each")
        text = cupool("report", "--no-progress", *names, check_rc=0).stdout
        row = re.search(r"^  peak reserved .*$", text.split(": side by side")[-1], re.M)
        check(row is not None and row.group(0).split()[-2:] == ["480.0", "MiB"],
              f"report: the summed column of peak reserved: {row and row.group(0)!r}, expected 480.0 MiB")

        # The page: the summed chart says 480 MiB, and each process's chart drops to nothing at its
        # exit and stays there (the last vertices at 0 from the exit on).
        cupool("report", "--no-progress", *names, "--html", "seq.html", check_rc=0)
        html = open(os.path.join(d, "seq.html")).read()
        charts = chart_paths(html)
        summed = [c for c in charts if "processes summed" in c[1]]
        check(len(summed) == 1 and "peak reserved 480.0 MiB" in summed[0][1],
              f"the summed chart's caption: {summed and summed[0][1]!r}")
        x_max = r["duration_ns"]
        own = [c for c in charts if c[0] == "memory" and "processes summed" not in c[1]]
        check(len(own) == 4, f"{len(own)} per-process memory charts, expected 4")
        for i, (kind, cap, paths) in enumerate(own):
            reserved = [p for p in paths if p[1] == "reserved"]
            if not check(reserved, f"process {i}: no reserved line"):
                continue
            exit_ns = (1 + i) * S + (S // 10 if i != 2 else 3_000_000) - (S + 1_000_000)  # since the first event
            after = CHART_LEFT + CHART_WIDTH * (exit_ns + 1_000_000) / x_max
            vertices = path_vertices(reserved[0][2])
            late = [y for x, y in vertices if x >= after] + [vertices[-1][1]]
            check(all(abs(chart_value(y, 1)) < 1e-6 for y in late),
                  f"process {i}: its reserved line is not at 0 after it exited (y {sorted(set(late))[:5]})")

        # Replay's recorded column is the same sum.
        r = json.loads(cupool("replay", "--json", "--no-progress", *names, "--policy", "passthrough", check_rc=0).stdout)
        rec = r["recorded"]["devices"][0]
        check(rec["peak_reserved"] == 480 * MiB,
              f"replay: the recorded column's peak reserved {rec['peak_reserved'] / MiB} MiB, expected 480 MiB")

        # A footer later than the last event: the process holds its memory until then. Here it
        # exits at 2.5 s, and the other allocates at 2 s: 960 MiB at once.
        timed_trace(opts, os.path.join(d, "late.jsonl"), 21, S, holds_480(S), end=2 * S + S // 2)
        timed_trace(opts, os.path.join(d, "next.jsonl"), 22, 2 * S, holds_480(2 * S))
        r = json.loads(cupool("report", "--json", "--no-progress", "late.jsonl", "next.jsonl", check_rc=0).stdout)
        check(r["devices"][0]["peak_reserved"] == 960 * MiB,
              f"a process exits at its footer, not its last event: summed {r['devices'][0]['peak_reserved'] / MiB} MiB, "
              "expected 960 MiB")
    finish()


def cmd_charts(opts):
    """The HTML page's charts and summary, read from the page itself (no browser): fragmentation
    as each time bucket's mean with its min-max band, requested drawn over in use, the summary's
    headers (issue 27)."""
    MiB = 1 << 20
    with tempfile.TemporaryDirectory() as d:
        cupool = Cupool(opts.cupool, d)

        # Fragmentation 90% for 1 us out of every 100 us, else 0: the buckets (32 us over 20 ms)
        # each hold at most one spike, so their means are under 4% while their maxima are 90%.
        def spikes(w):
            w.device(0, "Sim", 16 << 30)
            base = 0x7F0000000000
            free = 90 * MiB
            for k in range(200):
                for dt, largest in ((0, free), (1000, free // 10), (2000, free)):
                    w.t = 1_000_000_000 + k * 100_000 + dt
                    w.event("alloc", api="cudaMalloc", path="symbol", size=512, ptr=base + (3 * k + dt // 1000) * 512,
                            dur=100, pool={"reserved": 100 * MiB, "in_use": 10 * MiB, "largest_free": largest,
                                           "quarantined": 0, "free_blocks": 2})

        hand_trace(opts, os.path.join(d, "spikes.jsonl"), spikes)
        r = json.loads(cupool("report", "--json", "--no-progress", "spikes.jsonl", check_rc=0).stdout)
        frag = r["traces"][0]["devices"][0]["fragmentation"]
        check(abs(frag["max"] - 0.9) < 1e-9 and frag["mean"] < 0.02, f"spikes: fragmentation {frag}")
        cupool("report", "--no-progress", "spikes.jsonl", "--html", "spikes.html", check_rc=0)
        html = open(os.path.join(d, "spikes.html")).read()
        charts = [c for c in chart_paths(html) if c[0] == "fragmentation"]
        if check(len(charts) == 1, f"{len(charts)} fragmentation charts"):
            paths = {series: (cls, d_attr) for cls, series, d_attr, _ in charts[0][2]}
            line = paths.get("fragmentation")
            band = next((v for k, v in paths.items() if v[0] == "band"), None)
            if check(line is not None, "no fragmentation line"):
                values = [chart_value(y, 1) for _, y in path_vertices(line[1])]
                check(max(values) < 0.1, f"the fragmentation line reaches {max(values):.0%}: it draws each bucket's "
                      "maximum, not its mean (the trace's mean over time is under 2%)")
            if check(band is not None, "no min-max band under the fragmentation line"):
                values = [chart_value(y, 1) for _, y in path_vertices(band[1])]
                check(max(values) > 0.85 and min(values) < 0.01, f"the band spans {min(values):.0%} to {max(values):.0%}")
            legend = html[html.index('data-chart="fragmentation"'):]
            legend = legend[legend.index('<div class="legend">'):legend.index("</div>")]
            check("mean" in legend and "min to max" in legend, f"the fragmentation legend does not say what is drawn: {legend}")

        # Requested, often equal to in use, is drawn over it and dashed (else it hides under it).
        gen(opts, "passthrough", os.path.join(d, "passthrough.jsonl"))
        cupool("report", "--no-progress", "passthrough.jsonl", "--html", "pass.html", check_rc=0)
        html = open(os.path.join(d, "pass.html")).read()
        for kind, cap, paths in chart_paths(html):
            if kind != "memory":
                continue
            order = [series for _, series, _, _ in paths]
            attrs = {series: a for _, series, _, a in paths}
            check("requested" in order and "in_use" in order and order.index("requested") > order.index("in_use")
                  and "stroke-dasharray" in attrs["requested"],
                  f"{cap}: requested is drawn before in use, or not dashed: {order}")

        # The summary's headers say which fragmentation figure each column is.
        head = html[html.index('<table class="summary">'):]
        head = head[:head.index("</tr>", head.index("</tr>") + 1)]
        check("<th>mean</th>" not in head and "mean over time" in head and ">fragmentation<" in head,
              f"the summary's header: {head}")
    finish()


def cmd_fuzz(opts):
    with tempfile.TemporaryDirectory() as d:
        gen(opts, "training", os.path.join(d, "good.jsonl"))
        cupool = Cupool(opts.cupool, d)
        lines = open(os.path.join(d, "good.jsonl")).read().splitlines(True)

        def run_on(text, name="bad.jsonl", cmd=("report", "--no-progress")):
            mode = "wb" if isinstance(text, bytes) else "w"
            with open(os.path.join(d, name), mode) as f:
                f.write(text)
            return cupool(*cmd, name)

        def expect_error(text, pattern, what):
            p = run_on(text)
            check(p.returncode == 3, f"{what}: exit {p.returncode}, expected 3; stderr: {p.stderr[:300]}")
            check(re.search(pattern, p.stderr) is not None, f"{what}: message {p.stderr.strip()!r} !~ {pattern!r}")

        # Known cases: the message says where and what.
        expect_error("", r"bad\.jsonl: the file is empty", "empty file")
        expect_error(lines[0].replace('"version":"1.0"', '"version":"4.0"') + "".join(lines[1:]),
                     r"version 4\.0 is newer than this cupool understands", "newer major version")
        expect_error("hello\n", r"bad\.jsonl:1: ", "not a trace")
        n = 10
        expect_error("".join(lines[:n - 1]) + lines[n - 1][:40] + "\n" + "".join(lines[n:]), rf"bad\.jsonl:{n}: ",
                     "line cut in the middle")
        expect_error("".join(lines[:n - 1]) + lines[n - 1].replace('"t":', '"t":-') + "".join(lines[n:]),
                     rf"bad\.jsonl:{n}: .*\"t\"", "negative time")
        expect_error("".join(lines[:n - 1]) + lines[n - 1].replace('"ev":"', '"ev":"x') + "".join(lines[n:]),
                     rf"bad\.jsonl:{n}: .*unknown value", "unknown event kind")
        expect_error("".join(lines[:n - 1]) + '{"type":"event","t":1}\n' + "".join(lines[n:]),
                     rf"bad\.jsonl:{n}: event has no", "missing fields")
        expect_error("".join(lines[:n - 1]) + "\x00\xff\xfe garbage\n" + "".join(lines[n:]), rf"bad\.jsonl:{n}: ",
                     "binary garbage")
        p = cupool("report", "--no-progress", "no-such-file.jsonl")
        check(p.returncode == 3 and "no-such-file.jsonl" in p.stderr, f"missing file: {p.returncode} {p.stderr}")
        # The same errors reach replay and export.
        for cmd in (("replay", "--no-progress"), ("export", "--perfetto", "-o", "x.json", "--no-progress")):
            p = run_on("hello\n", cmd=cmd)
            check(p.returncode == 3 and "bad.jsonl:1:" in p.stderr, f"{cmd[0]} on a broken trace: {p.returncode} {p.stderr}")
        # A trace cut short (the process was killed while writing): everything before it counts,
        # and the report says the last line was ignored.
        p = run_on("".join(lines[:-1])[:-30])
        check(p.returncode == 0 and re.search(r"bad\.jsonl:\d+: the last line is cut short.*: ignored", p.stdout),
              f"cut last line: {p.returncode} {p.stdout[:400]} {p.stderr}")

        # Format 2.0: calls without "dur" (untimed) are read; in 1.x "dur" is required.
        untimed = [re.sub(r',"dur":\d+', "", l) if '"api":"cudaFree"' in l else l for l in lines]
        p = run_on("".join(untimed).replace('"version":"1.0"', '"version":"2.0"', 1))
        row = re.search(r"^\s+cudaFree\s+[\d,]+\s+-\s+-\s+-\s*$", p.stdout, re.M)
        check(p.returncode == 0 and row is not None, f"2.0 trace with untimed frees: {p.returncode} {p.stdout[:600]} {p.stderr}")
        expect_error("".join(untimed), r'bad\.jsonl:\d+: event has no "dur"', "1.0 trace without dur")

        # Random damage: any outcome but a crash. 0 (the damage was harmless) or 3 with a line number.
        rng = random.Random(1234)
        body = "".join(lines).encode()
        for i in range(opts.iterations):
            data = bytearray(body)
            for _ in range(rng.randint(1, 4)):
                pos = rng.randrange(len(data))
                op = rng.randrange(6)
                if op == 0:
                    del data[pos:pos + rng.randint(1, 40)]
                elif op == 1:
                    data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
                elif op == 2:
                    data[pos] = rng.choice(b'{}[]":,0123456789-.eE\\\n ')
                elif op == 3:
                    data = data[:pos]
                elif op == 4:
                    data[pos:pos] = b"9" * rng.randint(1, 30)
                else:
                    data[pos:pos] = b"\n"
            p = run_on(bytes(data), name=f"fuzz.jsonl")
            ok = p.returncode in (0, 3) and "runtime error:" not in p.stderr and "Sanitizer" not in p.stderr
            if p.returncode == 3:
                ok = re.match(r"cupool report: fuzz\.jsonl(:\d+)?: \S", p.stderr) is not None
            if not check(ok, f"fuzz case {i}: exit {p.returncode}, stderr {p.stderr[:300]!r}"):
                with open(os.path.join(opts.keep or d, f"fuzz-fail-{i}.jsonl"), "wb") as f:
                    f.write(bytes(data))
    finish()


def cmd_input(opts):
    MiB = 1 << 20
    with tempfile.TemporaryDirectory() as d:
        gen(opts, "training", os.path.join(d, "plain.jsonl"))
        cupool = Cupool(opts.cupool, d)
        plain = open(os.path.join(d, "plain.jsonl"), "rb").read()

        def same_report(name, what):
            """report --json of `name` says what plain.jsonl's does (but for its path)."""
            p = cupool("report", "--json", "--no-progress", name)
            if not check(p.returncode == 0, f"{what}: exit {p.returncode}: {p.stderr}"):
                return
            want = json.loads(cupool("report", "--json", "--no-progress", "plain.jsonl").stdout)
            got = json.loads(p.stdout)
            got["traces"][0]["path"] = "plain.jsonl"
            check(got == want, f"{what}: the report differs from the uncompressed trace's")

        # gzip, found by its magic bytes whatever the name; several members (cat a.gz b.gz).
        with gzip.open(os.path.join(d, "t.jsonl.gz"), "wb") as f:
            f.write(plain)
        same_report("t.jsonl.gz", "gzip")
        shutil.copy(os.path.join(d, "t.jsonl.gz"), os.path.join(d, "gzip-named.jsonl"))
        same_report("gzip-named.jsonl", "gzip named .jsonl")
        half = len(plain) // 2 + 7  # mid-line
        with open(os.path.join(d, "members.gz"), "wb") as f:
            f.write(gzip.compress(plain[:half]) + gzip.compress(plain[half:]))
        same_report("members.gz", "gzip in two members")
        # From standard input; through replay and export too.
        p = subprocess.run([opts.cupool, "report", "--no-progress", "-"], stdin=open(os.path.join(d, "t.jsonl.gz"), "rb"),
                           capture_output=True, text=True)
        check(p.returncode == 0 and "peak in use" in p.stdout, f"gzip on standard input: {p.returncode} {p.stderr}")
        want = cupool("replay", "--json", "--no-progress", "plain.jsonl", "--limit", "300MiB").stdout
        got = cupool("replay", "--json", "--no-progress", "t.jsonl.gz", "--limit", "300MiB").stdout
        check(got.replace("t.jsonl.gz", "plain.jsonl") == want, "replay of the gzip trace differs")
        cupool("export", "--perfetto", "plain.jsonl", "-o", "plain.json", check_rc=0)
        if cupool("export", "--perfetto", "t.jsonl.gz", "-o", "gz.json", check_rc=0).returncode == 0:
            check(open(os.path.join(d, "gz.json")).read().replace("t.jsonl.gz", "plain.jsonl") ==
                  open(os.path.join(d, "plain.json")).read(), "export of the gzip trace differs")
        # A compressed file cut short is an error that says so, not a silent end.
        with open(os.path.join(d, "cut.gz"), "wb") as f:
            f.write(gzip.compress(plain)[:-100])
        p = cupool("report", "--no-progress", "cut.gz")
        check(p.returncode == 3 and "cut.gz" in p.stderr and "cut short" in p.stderr, f"cut gzip: {p.returncode} {p.stderr}")

        # zstd, when the command is there to make one.
        if shutil.which("zstd"):
            subprocess.run(["zstd", "-q", "-f", os.path.join(d, "plain.jsonl"), "-o", os.path.join(d, "t.jsonl.zst")],
                           check=True)
            same_report("t.jsonl.zst", "zstd")
            shutil.copy(os.path.join(d, "t.jsonl.zst"), os.path.join(d, "zstd-named.jsonl"))
            same_report("zstd-named.jsonl", "zstd named .jsonl")
        else:
            print("zstd is not installed: the zstd case is skipped (apt-get install zstd)")

        # Bytes that are not UTF-8, in the command line, the host, a device name, an API name and
        # the trace's own file name: every output is valid UTF-8, with U+FFFD in their place.
        def bad_bytes(w):
            w.device(0, "GPU@BAD2@", 1 << 30)
            pool = {"reserved": 32 * MiB, "in_use": MiB, "largest_free": 31 * MiB, "quarantined": 0, "free_blocks": 1}
            w.t += 1000
            w.event("grow", size=32 * MiB, ptr=0x7F0000000000, pool=pool)
            w.event("alloc", api="cudaMalloc@BAD3@", path="symbol", size=MiB, ptr=0x7F0000000000, pool=pool, dur=200_000)
            w.t += 1000
            w.event("oom", size=64 * MiB, oom="limit", pool=pool)
            w.event("alloc", api="cudaMalloc@BAD3@", path="symbol", size=64 * MiB, rc=2, pool=pool)

        everywhere = {"@BAD1@": b"\xff\xfe", "@BAD2@": b"\xe2\x82", "@BAD3@": b"\xc0\xaf"}
        in_events = {"@BAD1@": b"", "@BAD2@": b"", "@BAD3@": b"\xc0\xaf"}  # only lines the event parser reads
        for name, raw in ((b"bad\xff.jsonl", everywhere), (b"bad-api.jsonl", in_events)):
            hand_trace(opts, os.path.join(d.encode(), name), bad_bytes, cmdline=("python@BAD1@", "train.py"), raw=raw)
            outputs = {
                "report": (["report", name], None),
                "report --json": (["report", "--json", name], None),
                "report --html": (["report", name, "--html", "bad.html"], "bad.html"),
                "replay": (["replay", name, "--policy", "growth"], None),
                "replay --json": (["replay", "--json", name, "--policy", "growth"], None),
                "export --perfetto": (["export", "--perfetto", name, "-o", "bad.json", "--slow", "0"], "bad.json"),
            }
            for kind, (args, out_file) in outputs.items():
                what = f"{kind} {name.decode(errors='replace')}"
                p = run_bytes(opts.cupool, *args, "--no-progress", cwd=d)
                if not check(p.returncode == 0, f"{what}: exit {p.returncode}: {p.stderr[-400:]}"):
                    continue
                data = open(os.path.join(d, out_file), "rb").read() if out_file else p.stdout
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError as e:
                    check(False, f"{what}: the output is not valid UTF-8: {e}")
                    continue
                check("\ufffd" in text, f"{what}: no U+FFFD in place of the bad bytes")
                if "json" in kind or "export" in kind:
                    try:
                        doc = json.loads(text)
                    except json.JSONDecodeError as e:
                        check(False, f"{what}: not JSON: {e}")
                        continue
                    if kind == "report --json":
                        t = doc["traces"][0]
                        check(t["apis"][0]["api"] == "cudaMalloc\ufffd\ufffd", f"api: {t['apis'][0]['api']!r}")
                        if raw is everywhere:
                            check(t["cmdline"][0] == "python\ufffd\ufffd", f"cmdline: {t['cmdline']!r}")
                            check(t["devices"][0]["name"] == "GPU\ufffd\ufffd", f"device name: {t['devices'][0]['name']!r}")
                            check(t["path"] == "bad\ufffd.jsonl", f"path: {t['path']!r}")

        # Per-API bytes saturate at 2^64 - 1 instead of wrapping around.
        def huge(w):
            w.device(0, "Sim", 1 << 63)
            for i in range(3):
                w.t += 1000
                w.event("alloc", api="cudaMalloc", path="symbol", size=1 << 63, ptr=0x1000 + i)
        hand_trace(opts, os.path.join(d, "huge.jsonl"), huge, policy="passthrough")
        r = json.loads(cupool("report", "--json", "huge.jsonl", check_rc=0).stdout)
        api = r["traces"][0]["apis"][0]
        check(api["bytes"] == (1 << 64) - 1, f"cudaMalloc bytes {api['bytes']}, expected 2^64 - 1 (saturated)")
    finish()


def png_pixels(path):
    """(width, height, rows of RGB tuples) of an 8-bit RGB/RGBA PNG, without dependencies."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            w, h, depth, color = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and color in (2, 6), f"unexpected PNG format {depth} {color}"
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[i:i + 3]) for i in range(0, stride, bpp)])
        prev = line
    return w, h, rows


def cmd_html(opts):
    chromium = next((shutil.which(c) for c in ("chromium", "chromium-browser", "google-chrome") if shutil.which(c)), None)
    if not chromium:
        print("chromium is not installed: skipped (apt-get install chromium)")
        sys.exit(SKIP)
    with tempfile.TemporaryDirectory() as d:
        make_traces(opts, d)
        cupool = Cupool(opts.cupool, d)
        cupool("report", "--no-progress", "training.jsonl", "--html", "training.html", check_rc=0)
        cupool("report", "--no-progress", "rank1.jsonl", "rank2.jsonl", "rank3.jsonl", "--html", "ranks.html", check_rc=0)
        for page, charts, ooms in (("training.html", 3, 1), ("ranks.html", 1 + 3 * 3, 0)):
            url = "file://" + os.path.join(d, page)
            base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                    "--user-data-dir=" + tempfile.mkdtemp(dir=d)]
            p = subprocess.run(base + ["--dump-dom", url], capture_output=True, text=True, timeout=120)
            dom = p.stdout
            check(p.returncode == 0 and "<svg" in dom, f"{page}: chromium --dump-dom failed: {p.stderr[-500:]}")
            svgs = re.findall(r'<svg class="chart" data-chart="(\w+)"', dom)
            check(len(svgs) >= charts, f"{page}: {len(svgs)} charts in the DOM, expected at least {charts}")
            for kind in ("memory", "fragmentation", "latency"):
                check(kind in svgs, f"{page}: no {kind} chart")
            # Every series has data: a path with several points.
            paths = re.findall(r'<path class="series[^"]*" data-series="([^"]+)" data-points="(\d+)" d="([^"]*)"', dom)
            check(len(paths) >= charts, f"{page}: {len(paths)} series paths")
            for series, npts, d_attr in paths:
                if series == "cap":
                    continue
                check(int(npts) >= 2 and len(re.findall(r"[MLHV]", d_attr)) >= 3,
                      f"{page}: series {series} has no data ({npts} points, d={d_attr[:60]!r})")
            check(len(re.findall(r'<g class="oom">', dom)) >= ooms, f"{page}: out-of-memory markers missing")
            # What a person sees: a screenshot with the chart colours in it.
            shot = os.path.join(d, page + ".png")
            p = subprocess.run(base + ["--window-size=1900,2400", "--screenshot=" + shot, url], capture_output=True,
                               text=True, timeout=120)
            if not check(os.path.exists(shot), f"{page}: no screenshot: {p.stderr[-500:]}"):
                continue
            if opts.keep:
                shutil.copy(shot, opts.keep)
            w, h, rows = png_pixels(shot)
            colours = {}
            for row in rows[::2]:
                for px in row[::2]:
                    colours[px] = colours.get(px, 0) + 1
            background = max(colours.values())
            check(background < 0.97 * sum(colours.values()), f"{page}: the screenshot is blank")

            def near(c, ref, tol=40):
                return all(abs(a - b) <= tol for a, b in zip(c, ref))

            for name, ref in (("in use (green)", (0x2C, 0xA0, 0x2C)), ("reserved (orange)", (0xFF, 0x7F, 0x0E)),
                              ("fragmentation (purple)", (0x94, 0x67, 0xBD))):
                n = sum(cnt for c, cnt in colours.items() if near(c, ref))
                check(n > 50, f"{page}: the {name} series is not visible in the screenshot ({n} pixels)")

        # Laid out by the browser, at a wide and two narrow windows: no text of a chart runs past
        # its edge (where it is cut off), and nothing makes the page scroll sideways, a long
        # command line in the summary included.
        lines = open(os.path.join(d, "training.jsonl")).read().splitlines(True)
        header = json.loads(lines[0])
        header["cmdline"] = ["python3", "/workspace/experiments/llm-pretraining/scripts/train_transformer_model.py",
                             "--config=/workspace/experiments/configs/llama-7b-fsdp-activation-checkpointing.yaml"]
        with open(os.path.join(d, "long.jsonl"), "w") as f:
            f.write(json.dumps(header) + "\n" + "".join(lines[1:]))
        cupool("report", "--no-progress", "long.jsonl", "--html", "long.html", check_rc=0)
        measure = """<script>addEventListener('load', () => {
  const out = {scroll: document.documentElement.scrollWidth, inner: innerWidth, cut: []};
  for (const svg of document.querySelectorAll('svg.chart')) {
    const box = svg.viewBox.baseVal;
    for (const t of svg.querySelectorAll('text')) {
      const b = t.getBBox();
      if (b.x < box.x - 0.5 || b.x + b.width > box.x + box.width + 0.5) out.cut.push(t.textContent);
    }
  }
  const pre = document.createElement('pre'); pre.id = 'measured'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});</script>"""
        for page in ("training.html", "ranks.html", "long.html"):
            with open(os.path.join(d, "measured-" + page), "w") as f:
                f.write(open(os.path.join(d, page)).read().replace("</body>", measure + "</body>"))
            for width in (1400, 950, 800):
                p = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                    "--user-data-dir=" + tempfile.mkdtemp(dir=d), f"--window-size={width},900",
                                    "--dump-dom", "file://" + os.path.join(d, "measured-" + page)],
                                   capture_output=True, text=True, timeout=120)
                m = re.search(r'<pre id="measured">(.*?)</pre>', p.stdout)
                if not check(m is not None, f"{page} at {width} px: not measured: {p.stderr[-300:]}"):
                    continue
                got = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
                check(not got["cut"], f"{page} at {width} px: chart labels cut off at the edge: {got['cut']}")
                check(got["scroll"] <= got["inner"],
                      f"{page} at {width} px: the page scrolls sideways ({got['scroll']} px wide in {got['inner']})")
    finish()


def cmd_run(opts):
    with tempfile.TemporaryDirectory() as d:
        cupool = Cupool(opts.cupool, d)
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = opts.sim_dir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        env["CUPOOL_LIBRARY"] = opts.shim
        env.pop("LD_PRELOAD", None)
        env.pop("CUPOOL_TRACE", None)
        asan = []
        if opts.sanitized:
            # The sanitizer runtime must come first in a preloaded process; cupool run keeps it there.
            asan = [subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()]
            env["LD_PRELOAD"] = asan[0]
            env["ASAN_OPTIONS"] = "detect_leaks=0:" + env.get("ASAN_OPTIONS", "")
        env["TMPDIR"] = d
        trace = os.path.join(d, "run.jsonl")

        # The program under the shim: its own counts against the trace's.
        p = cupool("run", "--policy", "growth", "--trace", trace, "--", opts.program, env=env)
        check(p.returncode == 0, f"run: exit {p.returncode}: {p.stderr}")
        counts = json.loads(p.stdout.strip().splitlines()[-1])
        one = re.search(r"cupool: device 0: peak in use [\d.]+ \w+, peak reserved ([\d.]+ \w+);.* out of memory; trace " +
                        re.escape(trace), p.stderr)
        check(one is not None, "summary line missing:\n" + p.stderr)
        check(os.path.exists(trace), "no trace written")
        r = json.loads(cupool("report", "--json", "--no-progress", trace, check_rc=0).stdout)
        dev = r["traces"][0]["devices"][0]
        check(dev["allocs"] == counts["allocs"], f"report counts {dev['allocs']} allocs, the program {counts['allocs']}")
        check(dev["frees"] == counts["frees"], f"report counts {dev['frees']} frees, the program {counts['frees']}")
        check(r["traces"][0]["oom_count"] == counts.get("failed_allocs", 0), "out-of-memory count differs")
        check(r["traces"][0]["complete"] is True, "trace has no footer")
        p = cupool("replay", "--no-progress", trace)
        check(p.returncode in (0, 1) and "peak reserved" in p.stdout, f"replay of the run's trace: {p.returncode} {p.stderr}")

        # Issue 27: the simulated CUDA one flag away (no LD_LIBRARY_PATH), a shared budget from
        # options, and a program that never reaches CUDA said to be one.
        bare = {k: v for k, v in env.items() if k != "LD_LIBRARY_PATH"}
        budget = f"tools-run-{os.getpid()}"
        sim_trace = os.path.join(d, "sim.jsonl")
        p = cupool("run", "--sim", "--share", budget, "--share-limit", "4GiB", "--share-wait", "1s", "--trace", sim_trace,
                   "--", opts.program, env=bare)
        check(p.returncode == 0, f"run --sim --share: exit {p.returncode}: {p.stderr}")
        config = json.loads(open(sim_trace).readline()).get("config", {})
        check(config.get("share") == budget and config.get("share_wait_ns") == 1_000_000_000,
              f"run --share: the trace's configuration is {config}")
        p = cupool("run", "--", "true", env=env)
        check(p.returncode == 0 and "never reached CUDA" in p.stderr and "device -1" not in p.stderr,
              f"run of a program without CUDA: {p.stderr}")
        # Replaying growth with the recorded settings gives back what the shim's pool did.
        p = cupool("replay", "--json", "--no-progress", trace, "--policy", "growth", "--capacity",
                   str(r["traces"][0]["devices"][0]["total_bytes"]))
        rp = json.loads(p.stdout)
        rec, grown = rp["recorded"]["devices"][0], rp["policies"][0]["devices"][0]
        for key in ("peak_in_use", "peak_reserved", "chunks_taken", "chunk_bytes_taken"):
            check(rec[key] == grown[key], f"growth replay of a growth run: {key} {grown[key]} != recorded {rec[key]}")
        cupool("export", "--perfetto", trace, "-o", os.path.join(d, "run.perfetto.json"), check_rc=0)
        json.load(open(os.path.join(d, "run.perfetto.json")))
        cupool("export", "--memory-viz", trace, "-o", os.path.join(d, "run.pickle"), check_rc=0)
        import pickle
        with open(os.path.join(d, "run.pickle"), "rb") as f:
            check_snapshot(pickle.load(f), "memory-viz of the run's trace")
        cupool("export", "--rmm-csv", trace, "-o", os.path.join(d, "run.csv"), check_rc=0)
        rows = open(os.path.join(d, "run.csv")).read().splitlines()
        check(sum(1 for r in rows if ",allocate," in r) == counts.get("allocs", -1),
              f"rmm-csv of the run's trace: {sum(1 for r in rows if ',allocate,' in r)} allocations, "
              f"the program made {counts.get('allocs')}")

        # Default trace path: $TMPDIR/cupool-<uid>/run<cupool pid>-<pid>.jsonl, named in the
        # summary: a private directory (0700, ours), a private file (0600) whatever the umask.
        private = os.path.join(d, f"cupool-{os.geteuid()}")
        p = subprocess.run([opts.cupool, "run", "--", opts.program], env=env, capture_output=True, text=True,
                           timeout=300, preexec_fn=lambda: os.umask(0))
        m = re.search(r"trace (\S+)$", p.stderr.strip())
        check(p.returncode == 0 and m and os.path.exists(m.group(1)), "default trace path:\n" + p.stderr)
        if m and os.path.exists(m.group(1)):
            check(re.fullmatch(re.escape(private) + r"/run\d+-\d+\.jsonl", m.group(1)) is not None,
                  f"default trace {m.group(1)} is not in {private}/")
            st = os.lstat(private) if os.path.lexists(private) else None
            check(st and stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid(),
                  f"{private}: not a directory of mode 700 and ours: {st}")
            mode = stat.S_IMODE(os.stat(m.group(1)).st_mode)
            check(mode == 0o600, f"the trace's mode is {mode:o} under umask 0, expected 600")
        # A directory at that place that is not safe (a link another user planted, one open to
        # others) is refused, and the program is not run.
        for kind in ("link", "open"):
            tmp = os.path.join(d, "tmp-" + kind)
            os.mkdir(tmp)
            target = os.path.join(tmp, f"cupool-{os.geteuid()}")
            if kind == "link":
                os.mkdir(os.path.join(tmp, "elsewhere"))
                os.symlink(os.path.join(tmp, "elsewhere"), target)
            else:
                os.mkdir(target)
                os.chmod(target, 0o777)
            p = cupool("run", "--", "sh", "-c", "echo ran", env=dict(env, TMPDIR=tmp))
            check(p.returncode == 4 and target in p.stderr and "ran" not in p.stdout,
                  f"an unsafe trace directory ({kind}): exit {p.returncode}, {p.stderr}")

        # The trace is not written through a symbolic link: the victim's file stays as it was.
        victim = os.path.join(d, "victim.txt")
        with open(victim, "w") as f:
            f.write("precious\n")
        link = os.path.join(d, "link.jsonl")
        os.symlink(victim, link)
        p = cupool("run", "--trace", link, "--", opts.program, env=env)
        check(p.returncode != 0 and link in p.stderr and "symbolic link" in p.stderr,
              f"a trace path that is a link: exit {p.returncode}: {p.stderr}")
        check(open(victim).read() == "precious\n", "the trace was written through a symbolic link")
        if os.geteuid() == 0:
            # Nor into another user's file (root can make one here).
            theirs = os.path.join(d, "theirs.jsonl")
            with open(theirs, "w") as f:
                f.write("theirs\n")
            os.chown(theirs, 65534, 65534)
            p = cupool("run", "--trace", theirs, "--", opts.program, env=env)
            check(p.returncode != 0 and "another user" in p.stderr, f"another user's file: {p.returncode} {p.stderr}")
            check(open(theirs).read() == "theirs\n", "the trace was written into another user's file")

        # Every process of the run is summarised: a shell that runs the program twice writes
        # three traces (its own, with no allocation, and one per program).
        p = cupool("run", "--", "sh", "-c", f"'{opts.program}'; '{opts.program}'; true", env=env)
        m = re.search(r"cupool: (\d+) processes traced; device 0: peak in use [\d.]+ \w+, peak reserved ([\d.]+ \w+) "
                      r"\(all processes\).* traces (.+)$", p.stderr.strip())
        if check(p.returncode == 0 and m, "summary of a run of several processes:\n" + p.stderr):
            traces = m.group(3).split(" ")
            # One after the other, the two never held memory at once: the sum's peak is one's.
            check(one is None or m.group(2) == one.group(1),
                  f"peak reserved of two runs one after the other: {m.group(2)}, one run's {one and one.group(1)}")
            check(int(m.group(1)) == len(traces) >= 2 and all(os.path.exists(t) for t in traces),
                  f"the traces named do not exist: {traces}")
            counts = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
            r = json.loads(cupool("report", "--json", "--no-progress", *traces, check_rc=0).stdout)
            allocs = sum(dev["allocs"] for t in r["traces"] for dev in t["devices"])
            check(len(counts) == 2 and allocs == sum(c["allocs"] for c in counts),
                  f"the run's traces hold {allocs} allocations, the programs made {[c['allocs'] for c in counts]}")

        # LD_PRELOAD: libcupool first, what was there kept.
        # The sanitized cupool itself starts with the sanitizer runtime after libm here: tell the
        # runtime not to insist on coming first (what cupool does with the list is the test).
        env2 = dict(env, LD_PRELOAD=":".join(["libm.so.6"] + asan),
                    ASAN_OPTIONS=env.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0")
        p = cupool("run", "--no-summary", "--", "sh", "-c", 'echo "$LD_PRELOAD"', env=env2, check_rc=0)
        want = ":".join(asan + [os.path.realpath(opts.shim), "libm.so.6"])
        check(p.stdout.strip() == want, f"LD_PRELOAD is {p.stdout.strip()!r}, expected {want!r}")
        p = cupool("run", "--no-summary", "--", "sh", "-c", 'echo "$LD_PRELOAD"',
                   env=dict(env2, LD_PRELOAD=want), check_rc=0)
        check(p.stdout.strip() == want, f"LD_PRELOAD already holding the library: {p.stdout.strip()!r}")
        p = cupool("run", "--no-summary", "--limit", "1GiB", "--free", "deferred", "--preallocate", "50%", "--",
                   "sh", "-c", 'echo "$CUPOOL_LIMIT $CUPOOL_FREE $CUPOOL_PREALLOCATE"', env=env, check_rc=0)
        check(p.stdout.strip() == "1GiB deferred 50%", f"CUPOOL_* variables: {p.stdout.strip()!r}")
        p = cupool("run", "--no-summary", "--stacks", "on", "--", "sh", "-c", 'echo "$CUPOOL_TRACE_STACKS"', env=env,
                   check_rc=0)
        check(p.stdout.strip() == "on", f"--stacks: CUPOOL_TRACE_STACKS is {p.stdout.strip()!r}")
        p = cupool("run", "--stacks", "often", "--", "true", env=env, check_rc=2)
        check("CUPOOL_TRACE_STACKS" in p.stderr and "one allocation in N" in p.stderr, "bad --stacks message: " + p.stderr)

        # --takeover: says what it set, and sets it.
        p = cupool("run", "--takeover", "--no-summary", "--", "sh", "-c",
                   'echo "$PYTORCH_NO_CUDA_MEMORY_CACHING $XLA_PYTHON_CLIENT_ALLOCATOR $XLA_PYTHON_CLIENT_PREALLOCATE '
                   '$TF_GPU_ALLOCATOR"', env=env, check_rc=0)
        check(p.stdout.strip() == "1 platform false cuda_malloc", f"takeover variables: {p.stdout.strip()!r}")
        for var in ("PYTORCH_NO_CUDA_MEMORY_CACHING=1", "XLA_PYTHON_CLIENT_ALLOCATOR=platform",
                    "XLA_PYTHON_CLIENT_PREALLOCATE=false", "TF_GPU_ALLOCATOR=cuda_malloc"):
            check(var in p.stderr, f"takeover does not say it set {var}: {p.stderr}")

        # Exit status and signals.
        cupool("run", "--no-summary", "--", "sh", "-c", "exit 7", env=env, check_rc=7)
        p = cupool("run", "--", "sh", "-c", "kill -TERM $$", env=env, check_rc=128 + 15)
        check("signal 15" in p.stderr, "killed by a signal is not said: " + p.stderr)
        # A program that cannot be run: said once, and nothing about preloading (nothing ran).
        p = cupool("run", "--", "/no/such/program", env=env, check_rc=127)
        check("cannot run /no/such/program" in p.stderr and "cannot be preloaded" not in p.stderr
              and "no trace" not in p.stderr, "a program that does not exist: " + p.stderr)
        if opts.retry_program:
            # A program that retries a refused allocation 3000 times: the first warnings in full,
            # then a count at 10, 100 and 1000; the trace has every one.
            retry_trace = os.path.join(d, "retry.jsonl")
            p = cupool("run", "--limit", "64MiB", "--trace", retry_trace, "--", opts.retry_program, "3000", "128", env=env,
                       check_rc=0)
            full = [l for l in p.stderr.splitlines() if "warning: out of memory on device 0" in l]
            counts = re.findall(r"warning: (\d+) out-of-memory warnings so far", p.stderr)
            check(p.stdout.strip() == "3000" and len(full) == 5 and counts == ["10", "100", "1000"],
                  f"3000 refusals: {len(full)} warnings in full (expected 5), counts {counts}; stderr has "
                  f"{len(p.stderr.splitlines())} lines:\n" + "\n".join(p.stderr.splitlines()[:12]))
            check(len(p.stderr.splitlines()) < 20, f"3000 refusals: stderr has {len(p.stderr.splitlines())} lines")
            r = json.loads(cupool("report", "--json", "--no-progress", retry_trace, check_rc=0).stdout)
            check(r["traces"][0]["oom_count"] == 3000, f"the trace holds {r['traces'][0]['oom_count']} out-of-memory, not 3000")
            # Run once, then twice one after the other (each keeps its pool's chunk to the end): the
            # second never held memory beside the first, so the summed peak reserved is one's.
            p = cupool("run", "--trace", os.path.join(d, "once.%p.jsonl"), "--", opts.retry_program, "1", "16", env=env,
                       check_rc=0)
            once = re.search(r"device 0: peak in use [\d.]+ \w+, peak reserved ([\d.]+ \w+);", p.stderr)
            p = cupool("run", "--trace", os.path.join(d, "twice.%p.jsonl"), "--", "sh", "-c",
                       f"'{opts.retry_program}' 1 16; '{opts.retry_program}' 1 16", env=env, check_rc=0)
            twice = re.search(r"device 0: peak in use [\d.]+ \w+, peak reserved ([\d.]+ \w+) \(all processes\)", p.stderr)
            check(once and twice and once.group(1) == twice.group(1),
                  f"peak reserved of one run {once and once.group(1)}, of two one after the other "
                  f"{twice and twice.group(1)} (all processes): they never overlapped\n{p.stderr}")
        p = cupool("run", "--policy", "bogus", "--", "true", env=env, check_rc=2)
        check("CUPOOL_POLICY" in p.stderr, "bad --policy message: " + p.stderr)
        cupool("run", env=env, check_rc=2)
        p = cupool("run", "--", "true", env=dict(env, CUPOOL_LIBRARY="/no/libcupool.so"), check_rc=4)
        check("CUPOOL_LIBRARY" in p.stderr, "missing library message: " + p.stderr)
    finish()


def cmd_cli(opts):
    with tempfile.TemporaryDirectory() as d:
        cupool = Cupool(opts.cupool, d)
        p = cupool("--version", check_rc=0)
        check(re.match(r"cupool \d+\.\d+", p.stdout) is not None, "--version: " + p.stdout)
        cupool("--help", check_rc=0)
        for sub in ("run", "report", "replay", "export"):
            p = cupool(sub, "--help", check_rc=0)
            check(p.stdout.startswith("usage: cupool " + sub), f"{sub} --help: {p.stdout[:80]!r}")
            check("exit status" in p.stdout, f"{sub} --help does not document exit status")
            # Only the statuses this command returns: no other command's.
            at = p.stdout.rfind("\nexit status")
            statuses = p.stdout[at:] if at >= 0 else ""
            others = [c for c in ("run:", "replay:") if c in statuses]
            check(not others, f"{sub} --help lists other commands' exit statuses ({others}):\n{statuses}")
            if sub in ("report", "export"):
                check(re.search(r"^\s+1\s", statuses, re.M) is None, f"{sub} --help lists exit status 1:\n{statuses}")
            if sub != "run":
                listed = re.findall(r"^\s+(\d)\s", statuses, re.M)
                want = ["0", "1", "2", "3", "4"] if sub == "replay" else ["0", "2", "3", "4"]
                check(listed == want, f"{sub} --help: exit statuses {listed}, expected {want}")
        p = cupool("replay", "--help", check_rc=0)
        policy = re.search(r"^  --policy P.*?\n(?=  --)", p.stdout, re.S | re.M)
        check(policy is not None and "vmm" in policy.group(0), "replay --help: --policy does not list vmm:\n" +
              (policy.group(0) if policy else p.stdout))
        cupool(check_rc=2)
        cupool("frobnicate", check_rc=2)
        cupool("report", check_rc=2)
        p = cupool("report", "--bogus", "x", check_rc=2)
        check("unknown option --bogus" in p.stderr, "unknown option message: " + p.stderr)
        cupool("export", "x.jsonl", "-o", "y", check_rc=2)  # no --perfetto
        cupool("export", "--perfetto", "x.jsonl", check_rc=2)  # no -o
        cupool("report", "missing.jsonl", check_rc=3)
        gen(opts, "replay", os.path.join(d, "t.jsonl"))
        p = cupool("report", "t.jsonl", "--html", "/no/such/dir/x.html", check_rc=4)
        # Standard input.
        p = subprocess.run([opts.cupool, "report", "-"], stdin=open(os.path.join(d, "t.jsonl")), capture_output=True,
                           text=True)
        check(p.returncode == 0 and "peak in use" in p.stdout, "report - (stdin): " + p.stderr)

        # Values: "--trace -- prog" is a missing value, not a trace named "--"; an empty value is
        # an error, not "unset" (an empty CUPOOL_TRACE turns tracing off).
        for args in (["run", "--trace", "--", "true"], ["run", "--trace=", "--", "true"], ["run", "--trace", "", "true"],
                     ["run", "--policy", "--trace", "t.jsonl", "--", "true"], ["report", "--html=", "t.jsonl"]):
            p = cupool(*args)
            check(p.returncode == 2 and "needs a value" in p.stderr and "--help" in p.stderr,
                  f"cupool {' '.join(args)}: exit {p.returncode}, expected a usage error (2): {p.stderr}")
        # A preallocation under the pool's 2 MiB granularity would reserve nothing.
        p = cupool("run", "--preallocate", "1", "--", "true", check_rc=2)
        check("CUPOOL_PREALLOCATE" in p.stderr and "2MiB" in p.stderr, "--preallocate 1: " + p.stderr)

        # Standard output that cannot be written: exit 4 with a message, for every command.
        full = open("/dev/full", "w")
        for args in (["report", "t.jsonl"], ["report", "--json", "t.jsonl"], ["replay", "t.jsonl"],
                     ["replay", "--json", "t.jsonl"], ["export", "--perfetto", "t.jsonl", "-o", "-"], ["report", "--help"]):
            p = subprocess.run([opts.cupool, *args], cwd=d, stdout=full, stderr=subprocess.PIPE, text=True)
            check(p.returncode == 4 and "standard output" in p.stderr,
                  f"cupool {' '.join(args)} >/dev/full: exit {p.returncode}, expected 4: {p.stderr}")

        # Output files: never through a symbolic link (another user's link in /tmp would have us
        # overwrite the victim's file), and private (mode 0600: they hold command lines).
        victim = os.path.join(d, "victim.txt")
        with open(victim, "w") as f:
            f.write("precious\n")
        os.symlink(victim, os.path.join(d, "link.out"))
        for args in (["report", "t.jsonl", "--html", "link.out"], ["export", "--perfetto", "t.jsonl", "-o", "link.out"]):
            p = cupool(*args)
            check(p.returncode == 4 and "link.out" in p.stderr and "symbolic link" in p.stderr,
                  f"cupool {' '.join(args)} (a link): exit {p.returncode}, expected 4 naming the link: {p.stderr}")
            check(open(victim).read() == "precious\n", f"cupool {' '.join(args)} wrote through the link")
            check(os.path.islink(os.path.join(d, "link.out")), "the link was replaced")
        old_umask = os.umask(0)
        try:
            cupool("report", "t.jsonl", "--html", "page.html", check_rc=0)
            cupool("export", "--perfetto", "t.jsonl", "-o", "perfetto.json", check_rc=0)
        finally:
            os.umask(old_umask)
        for name in ("page.html", "perfetto.json"):
            mode = stat.S_IMODE(os.stat(os.path.join(d, name)).st_mode)
            check(mode == 0o600, f"{name}: mode {mode:o}, expected 600")

        # An export that fails on the way leaves the file that was there, and no temporary file.
        lines = open(os.path.join(d, "t.jsonl")).read().splitlines(True)
        with open(os.path.join(d, "broken.jsonl"), "w") as f:
            f.write("".join(lines[:3]) + "{broken\n" + "".join(lines[3:]))
        with open(os.path.join(d, "out.json"), "w") as f:
            f.write("the previous export\n")
        before = sorted(os.listdir(d))
        p = cupool("export", "--perfetto", "broken.jsonl", "-o", "out.json")
        check(p.returncode == 3, f"export of a broken trace: exit {p.returncode}, expected 3")
        out_json = os.path.join(d, "out.json")
        check(os.path.exists(out_json) and open(out_json).read() == "the previous export\n",
              "a failed export truncated or removed the file it was to replace")
        check(sorted(os.listdir(d)) == before, f"a failed export left files behind: {set(os.listdir(d)) - set(before)}")
    finish()


def cmd_perf(opts):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "big.jsonl")
        gen(opts, "big", path, "--events", str(opts.events))
        best = None
        for _ in range(3):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.monotonic()
            p = subprocess.run([opts.cupool, "report", "--no-progress", path], capture_output=True, text=True)
            wall = time.monotonic() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            check(p.returncode == 0, "report failed: " + p.stderr)
            best = min(best or cpu, cpu)
            print(f"{opts.events} events: {cpu:.2f} s CPU ({opts.events / cpu / 1e6:.2f} M events/s), {wall:.2f} s wall")
        rate = opts.events / best
        check(rate >= opts.min_rate, f"report read {rate / 1e6:.2f} M events/s of CPU, below {opts.min_rate / 1e6:.1f} M")
    finish()


def check_snapshot(snap, what):
    """The structure PyTorch's snapshot has, and the consistency memory_viz relies on: each
    device's entries, applied from an empty device, give exactly the segments and blocks of the
    snapshot, and every block lies inside a live segment at every step. Returns the final state
    rebuilt, {device: {segment address: (size, {block address: (requested size, pending)})}}."""
    ok = check(isinstance(snap, dict) and isinstance(snap.get("segments"), list)
               and isinstance(snap.get("device_traces"), list), f"{what}: not a snapshot: {type(snap)}")
    if not ok:
        return {}
    seg_keys = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
    for seg in snap["segments"]:
        check(set(seg) == seg_keys, f"{what}: segment keys {sorted(seg)}")
        check(seg["segment_pool_id"] == (0, 0) and seg["segment_type"] in ("small", "large"), f"{what}: {seg}")
        at = seg["address"]
        for b in seg["blocks"]:
            check(set(b) == {"address", "size", "requested_size", "state", "frames"}, f"{what}: block keys {sorted(b)}")
            check(b["address"] == at and b["size"] > 0 and b["requested_size"] <= b["size"],
                  f"{what}: block {b} does not follow at {at:#x}")
            check(b["state"] in ("active_allocated", "active_pending_free", "inactive"), f"{what}: state {b['state']}")
            at += b["size"]
        check(at == seg["address"] + seg["total_size"], f"{what}: blocks of {seg['address']:#x} do not fill it")
        alloc = [b for b in seg["blocks"] if b["state"] == "active_allocated"]
        check(seg["allocated_size"] == sum(b["size"] for b in alloc)
              and seg["requested_size"] == sum(b["requested_size"] for b in alloc)
              and seg["active_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] != "inactive"),
              f"{what}: segment sums {seg['address']:#x}")
    state = {}
    for dev, entries in enumerate(snap["device_traces"]):
        segs = {}  # address -> [size, {block: [requested, pending]}]

        def seg_of(addr):
            return next((a for a, (size, _) in segs.items() if a <= addr < a + size), None)

        for i, e in enumerate(entries):
            act = e["action"]
            where = f"{what}: device {dev} entry {i} {e}"
            check(set(e) == {"action", "addr" if act != "oom" else "device_free", "size", "stream", "time_us", "frames"},
                  where + ": keys")
            if act in ("segment_alloc", "segment_map"):
                check(all(not (a < e["addr"] + e["size"] and e["addr"] < a + sz) for a, (sz, _) in segs.items()),
                      where + ": overlaps a live segment")
                segs[e["addr"]] = [e["size"], {}]
            elif act in ("segment_free", "segment_unmap"):
                ok = check(e["addr"] in segs and not segs[e["addr"]][1], where + ": not a live, empty segment")
                if ok:
                    del segs[e["addr"]]
            elif act == "alloc":
                s_addr = seg_of(e["addr"])
                if check(s_addr is not None, where + ": outside every segment"):
                    segs[s_addr][1][e["addr"]] = [e["size"], False]
            elif act in ("free_requested", "free_completed"):
                s_addr = seg_of(e["addr"])
                blocks = segs[s_addr][1] if s_addr is not None else {}
                if check(e["addr"] in blocks and blocks[e["addr"]][0] == e["size"], where + ": no such block"):
                    if act == "free_requested":
                        check(not blocks[e["addr"]][1], where + ": freed twice")
                        blocks[e["addr"]][1] = True
                    else:
                        check(blocks[e["addr"]][1], where + ": completed before it was requested")
                        del blocks[e["addr"]]
            elif act == "oom":
                check(e["device_free"] >= 0 and e["size"] > 0, where)
            else:
                check(False, where + ": unknown action")
        want = {s["address"]: (s["total_size"], {b["address"]: (b["requested_size"], b["state"] == "active_pending_free")
                                                 for b in s["blocks"] if b["state"] != "inactive"})
                for s in snap["segments"] if s["device"] == dev}
        got = {a: (sz, {b: tuple(v) for b, v in blocks.items()}) for a, (sz, blocks) in segs.items()}
        check(got == want, f"{what}: device {dev}: the entries do not lead to the snapshot's segments")
        state[dev] = got
    return state


def trace_lines(path):
    return [json.loads(line) for line in open(path)]


def cmd_formats(opts):
    """export --memory-viz and --rmm-csv, checked against the traces they come from."""
    import pickle
    MiB = 1 << 20
    # The pickle writer: every kind of value, under protocols 2, 3 and 4.
    for proto in (2, 3, 4):
        raw = subprocess.run([opts.pickle_probe, str(proto)], capture_output=True, check=True).stdout
        check(raw[:2] == bytes([0x80, proto]), f"pickle protocol {proto}: header {raw[:2]!r}")
        v = pickle.loads(raw)
        check(v["ints"] == [0, 1, 255, 256, 65535, 65536, -1, -128, -129, 2**31 - 1, -2**31, 2**31, -2**31 - 1,
                            2**63 - 1, -2**63, 2**40, -2**40], f"protocol {proto}: ints {v['ints']}")
        check(v["unsigned"] == [0, 2**63 - 1, 2**63, 2**64 - 1, 0x7f0000000000], f"protocol {proto}: {v['unsigned']}")
        check(v["floats"] == [0.0, -1.5, 3.141592653589793, 1e300], f"protocol {proto}: floats {v['floats']}")
        check(v["other"] == [True, False, None, (1, 2), "", "h\u00e9llo \u20ac", "x" * 300],
              f"protocol {proto}: {v['other'][:6]}")
        check(len(v["many"]) == 2500 and all(d == {"key%d" % (i % 300): i, "same": "value"}
                                              for i, d in enumerate(v["many"])), f"protocol {proto}: many")

    with tempfile.TemporaryDirectory() as d:
        cupool = Cupool(opts.cupool, d)
        gen(opts, "pool", os.path.join(d, "pool.jsonl"))
        gen(opts, "training", os.path.join(d, "training.jsonl"))
        gen(opts, "passthrough", os.path.join(d, "passthrough.jsonl"))
        gen(opts, "interleaved", os.path.join(d, "interleaved.jsonl"))
        for i in (1, 2, 3):
            gen(opts, "rank", os.path.join(d, f"rank{i}.jsonl"), "--pid", str(100 + i), "--seed", str(i))

        def export(fmt, *traces, extra=()):
            out = os.path.join(d, "out." + fmt)
            cupool("export", "--" + fmt, *traces, "-o", out, "--no-progress", *extra, check_rc=0)
            return out

        def snapshot(*traces, extra=()):
            with open(export("memory-viz", *traces, extra=extra), "rb") as f:
                return pickle.load(f)

        # The vmm policy's granules: maps joined into one expandable segment (a block over two
        # maps lies in it), an unmap cuts it; no chunk segments, nothing outside.
        gen(opts, "vmm", os.path.join(d, "vmm.jsonl"))
        snap = snapshot("vmm.jsonl")
        check_snapshot(snap, "vmm")
        base = 0x100000000000
        acts = [(e["action"], e["addr"] - base, e["size"] // MiB) for e in snap["device_traces"][0]]
        check(acts == [("segment_map", 0, 2), ("alloc", 0, 1), ("segment_map", 2 * MiB, 2), ("alloc", MiB, 3),
                       ("free_requested", MiB, 3), ("free_completed", MiB, 3), ("segment_unmap", 2 * MiB, 2),
                       ("free_requested", 0, 1), ("free_completed", 0, 1)], f"vmm: trace entries {acts}")
        segs = [(x["address"] - base, x["total_size"], x["is_expandable"]) for x in snap["segments"]]
        check(segs == [(0, 2 * MiB, True)], f"vmm: segments {segs}, expected the first map's 2 MiB, expandable")

        # A refused request of SIZE_MAX bytes: MemoryViz.js reads no integer over 8 bytes, so the
        # page gets 2^63 - 1 (and no LONG1 of 9 bytes), or it could not open the snapshot at all.
        with open(os.path.join(d, "pool.jsonl")) as f, open(os.path.join(d, "huge.jsonl"), "w") as out:
            for line in f:
                if '"ev":"oom"' in line:
                    line = line.replace('"size":6442450944', '"size":18446744073709551615')
                out.write(line)
        raw = open(export("memory-viz", "huge.jsonl"), "rb").read()
        ooms = [e for t in pickle.loads(raw)["device_traces"] for e in t if e["action"] == "oom"]
        long1 = b"\x8a\x09" in raw
        check(not long1 and [e["size"] for e in ooms] == [2**63 - 1],
              f"a SIZE_MAX request: oom entries {ooms}, LONG1 of 9 bytes {long1}")

        # The pool scenario, whose blocks lie in its chunks: numbers against the trace.
        lines = trace_lines(os.path.join(d, "pool.jsonl"))
        events = [x for x in lines if x["type"] == "event"]
        snap = snapshot("pool.jsonl")
        state = check_snapshot(snap, "pool")
        check(len(snap["device_traces"]) == 2, f"pool: {len(snap['device_traces'])} device traces, expected 2")
        for dev in (0, 1):
            ev = [x for x in events if x["dev"] == dev]
            entries = snap["device_traces"][dev]
            count = lambda act: sum(1 for e in entries if e["action"] == act)
            allocs = [x for x in ev if x["ev"] == "alloc" and x["rc"] == 0]
            maps = [x for x in ev if x["ev"] == "vmm_map"]
            frees = [x for x in ev if x["ev"] == "free"]
            unmaps = [x for x in ev if x["ev"] == "vmm_unmap"]
            check(count("alloc") == len(allocs) + len(maps), f"pool device {dev}: {count('alloc')} alloc entries, "
                  f"expected {len(allocs)} allocations + {len(maps)} mappings")
            check([(e["addr"], e["size"]) for e in entries if e["action"] == "alloc"]
                  == [(int(x["ptr"], 16), x["size"]) for x in ev if (x["ev"] == "alloc" and x["rc"] == 0) or x["ev"] == "vmm_map"],
                  f"pool device {dev}: alloc entries differ from the trace's allocations")
            check(count("free_requested") == len(frees) + len(unmaps), f"pool device {dev}: free_requested")
            # The pool's reserved bytes at the end, and what it does not serve, are the segments.
            last_pool = [x for x in ev if "reserved" in x][-1]
            live_outside = {int(x["ptr"], 16): x["size"] for x in allocs if "reserved" not in x}
            for x in frees:
                live_outside.pop(int(x["ptr"], 16), None)
            mapped = sum(x["size"] for x in maps) - sum(x["size"] for x in unmaps)
            total = sum(s["total_size"] for s in snap["segments"] if s["device"] == dev)
            check(total == last_pool["reserved"] + sum(live_outside.values()) + mapped,
                  f"pool device {dev}: segments hold {total}, the trace {last_pool['reserved']} reserved + "
                  f"{sum(live_outside.values())} outside + {mapped} mapped")
            in_use = sum(b["size"] for s in snap["segments"] if s["device"] == dev and not s["is_expandable"]
                         and s["address"] not in live_outside for b in s["blocks"] if b["state"] == "active_allocated")
            check(in_use == last_pool["in_use"], f"pool device {dev}: blocks in use {in_use} != {last_pool['in_use']}")
            pending = sum(b["size"] for s in snap["segments"] if s["device"] == dev for b in s["blocks"]
                          if b["state"] == "active_pending_free")
            check(pending == last_pool["quarantined"], f"pool device {dev}: pending {pending} != {last_pool['quarantined']}")
            check(count("segment_alloc") == sum(1 for x in ev if x["ev"] == "grow") + sum(1 for x in allocs if "reserved" not in x)
                  and count("segment_free") == sum(1 for x in ev if x["ev"] == "release") + sum(
                      1 for x in frees if int(x["ptr"], 16) in {int(a["ptr"], 16) for a in allocs if "reserved" not in a}),
                  f"pool device {dev}: segment entries")
            check(count("segment_map") == len(maps) and count("segment_unmap") == len(unmaps), f"pool device {dev}: maps")
        # Deferred frees: requested, completed later, one still waiting at the end.
        e0 = snap["device_traces"][0]
        apart = sum(1 for i, e in enumerate(e0) if e["action"] == "free_requested"
                    and not (i + 1 < len(e0) and e0[i + 1]["action"] == "free_completed" and e0[i + 1]["addr"] == e["addr"]))
        check(apart == 17, f"pool: {apart} frees waited for a fence, expected 17 (16 in 4 steps and the last)")
        check(sum(1 for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_pending_free") == 1,
              "pool: one block should wait for its fence at the end")
        check(any(s["is_expandable"] and s["total_size"] == 2 * MiB for s in snap["segments"]), "pool: no mapping left")
        oom = [e for e in e0 if e["action"] == "oom"]
        reserved_at_oom = [x for x in events if x["ev"] == "oom"][0]["reserved"] + 3 * MiB + 100 + 2 * MiB * 2 - 2 * MiB
        check(len(oom) == 1 and oom[0]["size"] == 6 << 30 and oom[0]["device_free"] == (4 << 30) - reserved_at_oom,
              f"pool: oom {oom}, expected 6 GiB with {(4 << 30) - reserved_at_oom} free under the 4 GiB cap")
        header = lines[0]
        first = events[0]
        check(e0[0]["time_us"] == (header["start_unix_ns"] + first["t"] - header["start_mono_ns"]) // 1000,
              f"pool: time_us {e0[0]['time_us']} is not the wall-clock time in microseconds")
        check(snap["cupool"]["devices"][0]["trace"] == "pool.jsonl", f"pool: {snap['cupool']}")

        # --max-entries keeps the last entries: the page undoes them from the same end state.
        short = snapshot("pool.jsonl", extra=("--max-entries", "20"))
        check(len(short["device_traces"][0]) == 20 and short["device_traces"][0] == e0[-20:]
              and short["segments"] == snap["segments"], "pool --max-entries 20: not the last 20 entries")
        check(short["cupool"]["devices"][0]["entries_left_out"] == len(e0) - 20, "pool --max-entries: count left out")

        # A trace without pool (passthrough): every allocation is a segment of its own.
        snap = snapshot("passthrough.jsonl")
        check_snapshot(snap, "passthrough")
        e0 = snap["device_traces"][0]
        allocs = sum(1 for x in trace_lines(os.path.join(d, "passthrough.jsonl")) if x.get("ev") == "alloc" and x["rc"] == 0)
        check(sum(1 for e in e0 if e["action"] == "segment_alloc") == allocs == sum(1 for e in e0 if e["action"] == "alloc"),
              "passthrough: one segment per allocation")
        check(not snap["segments"] and sum(1 for e in e0 if e["action"] == "segment_free") == allocs,
              "passthrough: everything was freed")
        check(sum(1 for e in e0 if e["action"] == "oom") == 1, "passthrough: the driver's refusal is an oom entry")

        # Refused by a shared budget (class share): the oom entry's free bytes are what cupool's
        # memory info answers, the budget's room (less every member's holdings that the traces
        # exported together record) plus the process's own free pool memory; not the device
        # less its own holdings. Budget 8 MiB on a 64 MiB device; a holds a 6 MiB chunk with
        # 4 MiB in use and is refused 4 MiB.
        share_cfg = gen_module(opts).config("growth")
        share_cfg.update({"share": "job", "share_limit": {"all": {"bytes": 8 * MiB}, "devices": {}},
                          "share_wait_ns": 0, "share_access": "user"})

        def member(steps):
            def build(w):
                w.device(0, "Sim", 64 * MiB)
                for ms, ev, size, reserved, in_use, extra in steps:
                    w.t = 1_000_000_000 + ms * 1_000_000
                    api = {"alloc": "cudaMalloc"}.get(ev, "")
                    w.event(ev, api=api, path="symbol" if api else "none", size=size, ptr=0x7F0000000000 if ev != "oom" else 0,
                            rc=2 if extra == "refused" else 0, oom="share" if ev == "oom" else None, dur=1000,
                            pool={"reserved": reserved, "in_use": in_use, "largest_free": reserved - in_use,
                                  "quarantined": 0, "free_blocks": 1})
            return build

        timed_trace(opts, os.path.join(d, "share-a.jsonl"), 31, 1_000_000_000, member(
            [(1, "grow", 6 * MiB, 6 * MiB, 0, None), (2, "alloc", 4 * MiB, 6 * MiB, 4 * MiB, None),
             (5, "oom", 4 * MiB, 6 * MiB, 4 * MiB, None), (5, "alloc", 4 * MiB, 6 * MiB, 4 * MiB, "refused")]),
            cfg=share_cfg, version="3.0")
        # b, a member too, holds a 2 MiB chunk at the time (it exits later): the budget has no room left.
        timed_trace(opts, os.path.join(d, "share-b.jsonl"), 32, 1_000_000_000, member(
            [(3, "grow", 2 * MiB, 2 * MiB, 0, None), (4, "alloc", MiB, 2 * MiB, MiB, None)]), end=1_010_000_000,
            cfg=share_cfg, version="3.0")
        for traces, want in ((["share-a.jsonl"], 4 * MiB), (["share-a.jsonl", "share-b.jsonl"], 2 * MiB)):
            snap = snapshot(*traces)
            check_snapshot(snap, f"share {traces}")
            ooms = [e for e in snap["device_traces"][0] if e["action"] == "oom"]
            check(len(ooms) == 1 and ooms[0]["device_free"] == want,
                  f"share {traces}: the oom's device_free {[e['device_free'] / MiB for e in ooms]} MiB, expected "
                  f"{want / MiB} MiB (the budget's room and the process's own free memory)")

        # The toy pool of the other scenarios places blocks outside its chunks: still consistent.
        check_snapshot(snapshot("training.jsonl"), "training")
        snap = snapshot("interleaved.jsonl")
        check_snapshot(snap, "interleaved")
        acts = [e["action"] for e in snap["device_traces"][0]]
        check(acts.count("alloc") == 2 and acts.count("free_completed") == 1, f"interleaved: {acts}")
        # Several processes: one snapshot device per process and device.
        snap = snapshot("rank1.jsonl", "rank2.jsonl", "rank3.jsonl")
        check_snapshot(snap, "ranks")
        check(len(snap["device_traces"]) == 3 and [x["pid"] for x in snap["cupool"]["devices"]] == [101, 102, 103],
              f"ranks: {snap['cupool']}")

        # RMM's log: header, formats, every free after its allocation with the same size.
        time_re = re.compile(r"\d\d:\d\d:\d\d\.\d{6}")
        for traces in (["pool.jsonl"], ["training.jsonl"], ["interleaved.jsonl"], ["rank1.jsonl", "rank2.jsonl"]):
            text = open(export("rmm-csv", *traces)).read()
            rows = text.splitlines()
            check(rows[0] == "Thread,Time,Action,Pointer,Size,Stream", f"rmm {traces}: header {rows[0]}")
            live = {}
            counts = {"allocate": 0, "free": 0, "allocate failure": 0}
            for row in rows[1:]:
                f = row.split(",")
                if not check(len(f) == 6 and f[2] in counts and time_re.fullmatch(f[1]) and f[0].isdigit()
                             and re.fullmatch(r"0|0x[0-9a-f]+", f[5]) and f[4].isdigit(), f"rmm {traces}: row {row!r}"):
                    continue
                counts[f[2]] += 1
                if f[2] == "allocate":
                    check(re.fullmatch(r"0x[0-9a-f]+", f[3]) and f[3] not in live, f"rmm {traces}: {row}")
                    live[f[3]] = f[4]
                elif f[2] == "free":
                    check(live.pop(f[3], None) == f[4], f"rmm {traces}: free without its allocation: {row}")
                else:
                    check(f[3] == "(nil)", f"rmm {traces}: {row}")
            ev = [x for t in traces for x in trace_lines(os.path.join(d, t)) if x["type"] == "event"]
            allocs = sum(1 for x in ev if x["ev"] in ("alloc", "vmm_create") and x["rc"] == 0)
            failed = sum(1 for x in ev if x["ev"] == "alloc" and x["rc"] != 0)
            check(counts["allocate"] == allocs and counts["allocate failure"] == failed,
                  f"rmm {traces}: {counts}, expected {allocs} allocations, {failed} failed")
            frees = sum(1 for x in ev if x["ev"] in ("free", "vmm_release") and x["rc"] == 0)
            check(counts["free"] == frees, f"rmm {traces}: {counts['free']} frees, expected {frees}")
        pool_rows = open(export("rmm-csv", "pool.jsonl")).read().splitlines()
        check("4242,22:13:20.000002,allocate,0x7f0000000000,%d,0" % [x for x in trace_lines(
            os.path.join(d, "pool.jsonl")) if x.get("ev") == "alloc"][0]["size"] == pool_rows[1],
            f"rmm pool: first row {pool_rows[1]}")
        check(any(r.endswith(",0x5000") for r in pool_rows), "rmm pool: the stream of the second stream's allocations")

        # Usage: one format at a time, options of other formats refused.
        cupool("export", "--memory-viz", "--rmm-csv", "pool.jsonl", "-o", "x", check_rc=2)
        cupool("export", "--rmm-csv", "pool.jsonl", "-o", "x", "--slow", "1ms", check_rc=2)
        cupool("export", "--perfetto", "pool.jsonl", "-o", "x", "--max-entries", "5", check_rc=2)
        cupool("export", "--memory-viz", "pool.jsonl", "-o", "x", "--max-entries", "0", check_rc=2)
        # A broken line: FILE:LINE named, exit 3, the previous file kept.
        with open(os.path.join(d, "broken.jsonl"), "w") as f:
            f.writelines(open(os.path.join(d, "pool.jsonl")).readlines()[:10])
            f.write('{"type":"event","t":oops}\n')
            f.write(open(os.path.join(d, "pool.jsonl")).readlines()[-1])
        for fmt in ("memory-viz", "rmm-csv"):
            with open(os.path.join(d, "kept"), "w") as f:
                f.write("before\n")
            p = cupool("export", "--" + fmt, "broken.jsonl", "-o", "kept")
            check(p.returncode == 3 and "broken.jsonl:11:" in p.stderr, f"{fmt} of a broken trace: {p.returncode} {p.stderr}")
            check(open(os.path.join(d, "kept")).read() == "before\n", f"{fmt}: a failed export replaced the file")
    finish()


def cmd_replay_share(opts):
    """replay --share-limit / --share-wait / --min-budget / --min-capacity on hand-computable
    traces (gen_trace.py share-a, share-b, frag); every number derived in the comments."""
    MiB = 1 << 20
    with tempfile.TemporaryDirectory() as d:
        for scenario, pid in (("share-a", "1"), ("share-b", "2"), ("frag", "3")):
            gen(opts, scenario, os.path.join(d, scenario + ".jsonl"), "--pid", pid)
        cupool = Cupool(opts.cupool, d)
        # Growth chunks of exactly what is asked (2 MiB steps that never double).
        chunks = ("--growth-chunk", "2MiB", "--growth-chunk-max", "2MiB")
        two = ("share-a.jsonl", "share-b.jsonl")

        def policies(*args, rc):
            r = json.loads(cupool("replay", "--json", "--no-progress", *two, *chunks, *args, check_rc=rc).stdout)
            return {x["policy"]: x for x in r["policies"]}

        # On the wall clock: a allocates 6 MiB at 1 ms and frees it at 3 (growth keeps its chunk),
        # b allocates 4 MiB at 5 and frees it at 7 (and exits), a allocates 6 MiB again at 9.
        # Under growth, b's 4 MiB comes while a's pool holds its free 6 MiB chunk: 6 + 4 = 10 > 8,
        # refused, with a holding 6 MiB and b nothing. a then reuses its chunk: the peak held is 6.
        # (Merged by the monotonic `t`, of another boot in each trace, b would come after a exited.)
        g = policies("--policy", "growth,passthrough", "--share-limit", "8MiB", rc=1)
        share = g["growth"]["share"]
        first = share["first_refusal"]
        check(share["refusals"] == 1, f"growth, budget 8 MiB: {share['refusals']} refusals, expected 1")
        check(share["peak"] == {"0": 6 * MiB}, f"growth, budget 8 MiB: peak held {share['peak']}, expected 6 MiB")
        check(first is not None and first["trace"] == "share-b.jsonl" and first["size"] == 4 * MiB
              and first["class"] == "share" and first["t"] == 4_000_000 and first["line"] == 3,
              f"growth, budget 8 MiB: first refusal {first}")
        check(first is not None and first.get("held") == [{"trace": "share-a.jsonl", "bytes": 6 * MiB},
                                                          {"trace": "share-b.jsonl", "bytes": 0}],
              f"growth, budget 8 MiB: held at the first refusal {first and first.get('held')}")
        # Passthrough holds only what is live: 6, then 4, then 6 MiB: never refused.
        check(g["passthrough"]["share"]["refusals"] == 0 and g["passthrough"]["share"]["peak"] == {"0": 6 * MiB},
              f"passthrough, budget 8 MiB: {g['passthrough']['share']}")

        # With a wait, b's refusal makes a give its wholly free chunk back: b gets its 4 MiB.
        g = policies("--policy", "growth", "--share-limit", "8MiB", "--share-wait", "1s", rc=0)
        check(g["growth"]["share"]["refusals"] == 0 and g["growth"]["share"]["first_refusal"] is None,
              f"growth, budget 8 MiB with a wait: {g['growth']['share']}")

        # The smallest budget. Growth with no wait: a's idle 6 MiB and b's 4 MiB at once, 10 MiB
        # (the sum of their peaks); at 8 MiB b is refused as above. With a wait: 6 MiB, the larger
        # peak (a gives back for b; b has exited when a allocates again); at 4 MiB a's first 6 MiB
        # is refused, with nobody to give back. Passthrough: 6 MiB either way (the peaks do not
        # coincide), refused at 4 MiB likewise.
        g = policies("--policy", "growth,passthrough", "--min-budget", rc=0)
        for name, want, below, size in (("growth", 10, 8, 4), ("passthrough", 6, 4, 6)):
            m = g[name]["min_budget"]
            check(m["bytes"] == want * MiB and m["below"] and m["below"]["bytes"] == below * MiB
                  and m["below"]["failure"]["size"] == size * MiB and m["below"]["failure"]["class"] == "share",
                  f"{name}: smallest budget {m}, expected {want} MiB, {size} MiB refused at {below} MiB")
        check(g["growth"]["min_budget"]["upper"] == 10 * MiB, f"growth: peak held {g['growth']['min_budget']['upper']}")
        g = policies("--policy", "growth", "--min-budget", "--share-wait", "1s", rc=0)
        m = g["growth"]["min_budget"]
        check(m["bytes"] == 6 * MiB and m["below"]["bytes"] == 4 * MiB and m["below"]["failure"]["trace"] == "share-a.jsonl",
              f"growth with a wait: smallest budget {m}, expected 6 MiB (a's 6 MiB refused at 4)")
        p = cupool("replay", "--no-progress", *two, *chunks, "--policy", "growth", "--min-budget", check_rc=0)
        check("growth: 10.0 MiB (peak held with no limit 10.0 MiB)" in p.stdout, f"min-budget text:\n{p.stdout}")

        # The smallest device (frag: 1 MiB a, 1 MiB b, free b, 2 MiB c; peak live a + c = 3 MiB),
        # on its recorded 3 MiB device. Passthrough fits: a, then c right after it, 3 MiB; at
        # 2 MiB c does not fit. Growth takes a 2 MiB chunk for a and b; b's free leaves 1 MiB in
        # it, not the 2 MiB c needs, and a second chunk does not fit in 3 MiB: growth does not
        # fit the recorded device (exit 1). On a 16 MiB device it needs 4 MiB, 1 MiB more than
        # the live bytes: what fragmentation costs it.
        r = json.loads(cupool("replay", "--json", "--no-progress", "frag.jsonl", *chunks, "--policy",
                              "growth,passthrough", "--min-capacity", check_rc=1).stdout)
        g = {x["policy"]: x["min_capacity"] for x in r["policies"]}
        check(g["passthrough"]["fits"] and g["passthrough"]["bytes"] == 3 * MiB
              and g["passthrough"]["peak_requested"] == 3 * MiB and g["passthrough"]["below"]["bytes"] == 2 * MiB
              and g["passthrough"]["below"]["failure"]["size"] == 2 * MiB,
              f"passthrough smallest device {g['passthrough']}, expected 3 MiB")
        check(not g["growth"]["fits"] and g["growth"]["bytes"] is None and g["growth"]["failure"]["size"] == 2 * MiB
              and g["growth"]["failure"]["class"] == "device" and g["growth"]["failure"]["line"] == 6,
              f"growth on the recorded 3 MiB device: {g['growth']}")
        p = cupool("replay", "--no-progress", "frag.jsonl", *chunks, "--policy", "growth", "--min-capacity", check_rc=1)
        check("growth: does not fit the recorded 3 MiB" in p.stdout, f"min-capacity text:\n{p.stdout}")
        r = json.loads(cupool("replay", "--json", "--no-progress", "frag.jsonl", *chunks, "--policy", "growth",
                              "--capacity", "16MiB", "--min-capacity", check_rc=0).stdout)
        m = r["policies"][0]["min_capacity"]
        check(m["fits"] and m["bytes"] == 4 * MiB and m["peak_requested"] == 3 * MiB and m["below"]["bytes"] == 2 * MiB
              and m["below"]["failure"]["size"] == 2 * MiB, f"growth smallest device on 16 MiB: {m}, expected 4 MiB")
        # The text gives the sizes in MiB, as the search steps, and the difference to the peak live
        # bytes for what it is (here under one step), not a cost of fragmentation. Preallocate
        # with no limit set: its used-up preallocation at 4 MiB is refused as the device's, not
        # as a limit's.
        p = cupool("replay", "--no-progress", "frag.jsonl", *chunks, "--policy", "growth,preallocate", "--capacity",
                   "16MiB", "--min-capacity", check_rc=0)
        check("growth: 4 MiB, 1 MiB above the peak live 3 MiB (less than one step)\n      at 2 MiB: " in p.stdout
              and "preallocate: 6 MiB, 3 MiB above the peak live 3 MiB\n      at 4 MiB: " in p.stdout
              and "fragmentation costs" not in p.stdout and "4.00 MiB," not in p.stdout,
              f"min-capacity text:\n{p.stdout}")
        check("refused: limit" not in p.stdout, f"min-capacity with no limit set names class limit:\n{p.stdout}")
        r = json.loads(cupool("replay", "--json", "--no-progress", "frag.jsonl", *chunks, "--policy", "preallocate",
                              "--capacity", "16MiB", "--min-capacity", check_rc=0).stdout)
        below = r["policies"][0]["min_capacity"]["below"]
        check(below and below["bytes"] == 4 * MiB and below["failure"]["class"] == "device",
              f"preallocate with no limit, one step below: {below}, expected class device at 4 MiB")
        # With a limit, a refusal at the cap is the limit's.
        r = json.loads(cupool("replay", "--json", "--no-progress", "frag.jsonl", *chunks, "--policy", "preallocate",
                              "--capacity", "16MiB", "--limit", "3MiB", check_rc=1).stdout)
        ff = r["policies"][0]["first_failure"]
        check(ff and ff["class"] == "limit", f"preallocate under a 3 MiB limit: first failure {ff}, expected class limit")

        # Peak live is the recording's: the pool scenario's 6 GiB allocation, refused by its cap when
        # recorded, is granted by the replay on the recorded device, and must not count.
        subprocess.run([sys.executable, opts.gen, "pool", os.path.join(d, "pool.jsonl")], check=True)
        r = json.loads(cupool("replay", "--json", "--no-progress", "pool.jsonl", "--policy", "growth",
                              "--min-capacity", check_rc=0).stdout)
        m = r["policies"][0]["min_capacity"]
        live = max(x["peak_requested"] for x in r["recorded"]["devices"])
        check(m["peak_requested"] == live and live < (1 << 30) and m["fits"] and m["bytes"] >= live,
              f"pool: smallest device {m}, recorded peak live {live}")

        # Usage errors.
        cupool("replay", "frag.jsonl", "--share-wait", "1s", check_rc=2)
        cupool("replay", "frag.jsonl", "--share-limit", "lots", check_rc=2)
        p = subprocess.run([opts.cupool, "replay", "-", "--min-capacity"], cwd=d, capture_output=True, text=True,
                           stdin=open(os.path.join(d, "frag.jsonl")), timeout=300)
        check(p.returncode == 2, f"--min-capacity from standard input: exit {p.returncode}, expected 2")
    finish()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cupool", required=True)
    ap.add_argument("--gen", default=os.path.join(HERE, "gen_trace.py"))
    ap.add_argument("--golden", default=os.path.join(HERE, "golden"))
    ap.add_argument("--keep", help="copy screenshots and failing fuzz cases here")
    ap.add_argument("check", choices=["golden", "replay", "fuzz", "html", "run", "cli", "input", "perf", "formats",
                                       "replay-share", "summed", "charts"])
    ap.add_argument("--pickle-probe", help="formats: test/tools/pickle_probe, built")
    ap.add_argument("--update", action="store_true")
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--shim")
    ap.add_argument("--sim-dir")
    ap.add_argument("--program")
    ap.add_argument("--retry-program", help="run: test/tools/oom_retry, built")
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--min-rate", type=float, default=2e6)
    ap.add_argument("--sanitized", action="store_true", help="the build uses AddressSanitizer")
    opts = ap.parse_args()
    opts.cupool = os.path.abspath(opts.cupool)
    for name in ("shim", "sim_dir", "program", "retry_program", "keep"):
        if getattr(opts, name):
            setattr(opts, name, os.path.abspath(getattr(opts, name)))
    {"golden": cmd_golden, "replay": cmd_replay, "fuzz": cmd_fuzz, "html": cmd_html, "run": cmd_run, "cli": cmd_cli,
     "input": cmd_input, "perf": cmd_perf, "formats": cmd_formats,
     "replay-share": cmd_replay_share, "summed": cmd_summed, "charts": cmd_charts}[opts.check](opts)


if __name__ == "__main__":
    main()
