#!/usr/bin/env python3
"""`cupool export --memory-viz` read by PyTorch's own tools (torch.cuda._memory_viz).

  memviz_check.py --cupool build/tools/cupool [--trace TRACE]... [--out DIR] [--frames-like TEXT]

Exports each trace (default: one made by test/tools/gen_trace.py's `pool` scenario) and hands
the loaded snapshot to torch.cuda._memory_viz: segment_plot, trace_plot (allocations and
segments) must return the page's HTML; segsum (which asserts that every segment's blocks add up)
and trace (the text listing) must run. With --frames-like (a trace recorded with
CUPOOL_TRACE_STACKS=all): every `alloc` entry has frames as PyTorch writes them (filename, line,
name), and some frame names TEXT (a library of the framework). Prints one JSON line; exits 1 on
any failure. No GPU work is done: torch is only imported.
"""
import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cupool", required=True)
    ap.add_argument("--trace", action="append", default=[])
    ap.add_argument("--out", help="keep the snapshots and pages here")
    ap.add_argument("--frames-like", help="every alloc entry has frames, and some frame's file or name holds this")
    a = ap.parse_args()
    result = {"check": "memviz", "ok": False, "traces": []}
    try:
        import torch
        from torch.cuda import _memory_viz as mv
        result["torch"] = torch.__version__
        with tempfile.TemporaryDirectory() as tmp:
            out = a.out or tmp
            os.makedirs(out, exist_ok=True)
            traces = a.trace
            if not traces:
                gen = os.path.join(HERE, "..", "tools", "gen_trace.py")
                traces = [os.path.join(tmp, "pool.jsonl")]
                subprocess.run([sys.executable, gen, "pool", traces[0]], check=True)
            failures = []
            for i, trace in enumerate(traces):
                snap_path = os.path.join(out, f"snapshot{i}.pickle")
                p = subprocess.run([a.cupool, "export", "--memory-viz", trace, "-o", snap_path, "--no-progress"],
                                   capture_output=True, text=True)
                entry = {"trace": trace, "export_rc": p.returncode}
                result["traces"].append(entry)
                if p.returncode != 0:
                    failures.append(f"{trace}: export exited {p.returncode}: {p.stderr.strip()}")
                    continue
                with open(snap_path, "rb") as f:
                    snap = pickle.load(f)
                if a.frames_like:
                    allocs = [e for t in snap["device_traces"] for e in t if e["action"] == "alloc"]
                    framed = [e for e in allocs if e["frames"]]
                    shapes_ok = all(set(fr) == {"filename", "line", "name"} for e in framed for fr in e["frames"])
                    like = sum(1 for e in framed if any(a.frames_like in fr["filename"] or a.frames_like in fr["name"]
                                                        for fr in e["frames"]))
                    entry["frames"] = {"allocs": len(allocs), "with_frames": len(framed), "naming": like,
                                       "example": [fr["name"] for fr in (framed[-1]["frames"] if framed else [])][:12]}
                    if not allocs or len(framed) != len(allocs) or not shapes_ok or like == 0:
                        failures.append(f"{trace}: frames: {entry['frames']}, PyTorch's keys: {shapes_ok}")
                entry["segments"] = len(snap["segments"])
                entry["entries"] = [len(t) for t in snap["device_traces"]]
                pages = {"segment_plot": mv.segment_plot(snap), "trace_plot": mv.trace_plot(snap),
                         "trace_plot_segments": mv.trace_plot(snap, plot_segments=True)}
                for name, html in pages.items():
                    ok = isinstance(html, str) and "<html>" in html and "add_local_files" in html
                    entry[name] = len(html) if ok else None
                    if not ok:
                        failures.append(f"{trace}: {name} did not return the page")
                    elif a.out:
                        with open(os.path.join(out, f"snapshot{i}.{name}.html"), "w") as f:
                            f.write(html)
                entry["segsum_lines"] = len(mv.segsum(snap).splitlines())
                entry["trace_lines"] = len(mv.trace(snap).splitlines())
            result["failures"] = failures
            result["ok"] = not failures
    except Exception as e:  # any failure is reported on the one line, never as a traceback only
        result["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
