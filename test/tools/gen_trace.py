#!/usr/bin/env python3
"""Deterministic cupool traces for the tools' tests, in the format libcupool.so writes
(trace/trace_schema.h, docs/trace-format.md).

  gen_trace.py SCENARIO OUT [--events N] [--pid P] [--seed S]

Scenarios:
  training     growth pool on device 0: a warm-up then steps that allocate activations and free
               them, grow/release events, two APIs and paths, one fragmentation OOM near the end
  passthrough  the same program with no pool (no pool fields): in use = reserved = live bytes
  rank         a small growth run on device 0 (use --pid/--seed for several ranks of one job)
  replay       the hand-computable sequence of the replay test: 1 MiB, 3 MiB, free the first, 2 MiB
  interleaved  a free written before its allocation (two threads' buffers drained out of order)
  killed       like rank, without a footer (the process was killed)
  big          --events N allocation/free events of a growth pool, for the speed test
The pool model here only has to be self-consistent; the real pool is core/device_pool.cpp.
"""
import argparse
import json
import sys

MiB = 1 << 20
GiB = 1 << 30


class Lcg:
    """Same numbers on every Python version (random.Random's algorithms may change)."""

    def __init__(self, seed):
        self.x = seed & 0xFFFFFFFFFFFFFFFF

    def next(self):
        self.x = (self.x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        return self.x >> 33

    def below(self, n):
        return self.next() % n


class Pool:
    """A toy growth pool: chunks, in-use bytes (rounded to 512) and a made-up largest free block."""

    def __init__(self, chunk=32 * MiB):
        self.reserved = 0
        self.in_use = 0
        self.chunk = chunk
        self.base = 0x7F0000000000
        self.next_ptr = self.base
        self.holes = 0  # bytes freed in the middle: they fragment

    def state(self):
        free = self.reserved - self.in_use
        largest = max(free // 4, free - self.holes // 2)
        blocks = 1 + self.holes // (4 * MiB) if free else 0
        return {"reserved": self.reserved, "in_use": self.in_use, "largest_free": largest,
                "quarantined": 0, "free_blocks": blocks}


class Writer:
    def __init__(self, out, pid, cmdline, config, t0=1_000_000_000):
        self.out = out
        self.t = t0
        self.events = 0
        self.allocs = self.frees = self.ooms = 0
        self.pid = pid
        header = {"type": "header", "format": "cupool-trace", "version": "1.0", "cupool_version": "0.1.0",
                  "pid": pid, "ppid": 1, "host": "testhost", "cmdline": cmdline,
                  "start_unix_ns": 1_700_000_000_000_000_000, "start_mono_ns": t0, "config": config}
        self.devices = []
        self.line(header)

    def line(self, obj):
        self.out.write(json.dumps(obj, separators=(",", ":")) + "\n")

    def device(self, index, name, total):
        self.devices.append({"index": index, "name": name, "total_bytes": total})
        self.line({"type": "device", "t": self.t, "index": index, "name": name, "total_bytes": total})

    def event(self, ev, api="", path="none", dev=0, size=0, ptr=0, rc=0, dur=0, tid=None,
              pool=None, oom=None, stream=None):
        o = {"type": "event", "t": self.t, "tid": tid or self.pid, "ev": ev, "api": api, "path": path,
             "dev": dev, "size": size, "ptr": "0x%x" % ptr}
        if stream is not None:
            o["stream"] = "0x%x" % stream
        o["rc"] = rc
        o["dur"] = dur
        if oom:
            o["oom"] = oom
        if pool:
            o.update(pool)
        self.line(o)
        self.events += 1
        if ev == "alloc":
            self.allocs += 1
        elif ev == "free":
            self.frees += 1
        elif ev == "oom":
            self.ooms += 1

    def footer(self, dropped=0):
        self.line({"type": "footer", "events": self.events, "dropped": dropped, "allocs": self.allocs,
                   "frees": self.frees, "ooms": self.ooms, "end_mono_ns": self.t, "devices": self.devices})


def config(policy="growth", limit=None):
    return {"policy": policy, "free": "sync", "limit": limit, "preallocate": {"percent": 75},
            "preallocate_grow": False, "growth_chunk": 32 * MiB, "growth_chunk_max": 512 * MiB,
            "release_idle_ns": None, "trace": "/tmp/t.jsonl", "trace_flush_ns": 100000000,
            "trace_buffer_events": 16384, "log_level": "info"}


def rounded(size):
    return (size + 511) // 512 * 512


def training(w, pooled, rng, steps=40, oom_at_end=True):
    """Parameters once, then steps of activations allocated and freed."""
    pool = Pool()
    live = {}
    apis = [("cudaMalloc", "symbol", "cudaFree"), ("cuMemAlloc_v2", "proc-address", "cuMemFree_v2")]

    def alloc(size, which=0):
        api, path, _ = apis[which]
        ptr = pool.next_ptr
        pool.next_ptr += rounded(size)
        w.t += 2_000
        if pooled:
            need = pool.in_use + rounded(size)
            while need > pool.reserved:
                chunk = min(max(pool.chunk, rounded(size) + (2 * MiB - 1)) // (2 * MiB) * (2 * MiB), 512 * MiB)
                pool.reserved += chunk
                pool.chunk = min(pool.chunk * 2, 512 * MiB)
                w.event("grow", size=chunk, ptr=pool.base + pool.reserved - chunk, dur=40_000 + chunk // 4096,
                        pool=pool.state())
            pool.in_use += rounded(size)
            w.event("alloc", api=api, path=path, size=size, ptr=ptr, dur=600 + rng.below(400),
                    pool=pool.state(), stream=0)
        else:
            w.event("alloc", api=api, path=path, size=size, ptr=ptr, dur=30_000 + rng.below(20_000) + size // 65536)
        live[ptr] = (size, which)
        return ptr

    def free(ptr, hole=False):
        size, which = live.pop(ptr)
        w.t += 1_500
        if pooled:
            pool.in_use -= rounded(size)
            if hole:
                pool.holes += rounded(size)
            w.event("free", api=apis[which][2], path=apis[which][1], ptr=ptr, dur=300 + rng.below(200),
                    pool=pool.state())
        else:
            w.event("free", api=apis[which][2], path=apis[which][1], ptr=ptr, dur=25_000 + rng.below(10_000))

    params = [alloc((1 + rng.below(8)) * MiB + rng.below(4096), which=rng.below(2)) for _ in range(12)]
    for step in range(steps):
        w.t += 1_000_000
        acts = [alloc((1 + rng.below(32)) * 256 * 1024 + rng.below(1000), which=0) for _ in range(6 + rng.below(6))]
        if step % 10 == 9:
            big = alloc(64 * MiB + step * MiB, which=1)
            acts.append(big)
        for i, p in enumerate(acts):
            free(p, hole=(i % 3 == 1 and step < steps // 2))
        if pooled and step == steps // 2:
            # idle release of the last chunk
            w.t += 500_000
            chunk = 32 * MiB
            if pool.reserved - pool.in_use > chunk:
                pool.reserved -= chunk
                w.event("release", size=chunk, ptr=pool.base + pool.reserved, dur=90_000, pool=pool.state())
    if oom_at_end:
        w.t += 1_000_000
        size = 3 * GiB
        if pooled:
            w.event("oom", size=size, dur=5_000, oom="fragmentation", pool=pool.state(), rc=2)
            w.event("alloc", api="cudaMalloc", path="symbol", size=size, ptr=0, rc=2, dur=5_500,
                    pool=pool.state())
        else:
            w.event("alloc", api="cudaMalloc", path="symbol", size=size, ptr=0, rc=2, dur=80_000)
    for p in params:
        free(p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario")
    ap.add_argument("out")
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--pid", type=int, default=4242)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    out = sys.stdout if a.out == "-" else open(a.out, "w")
    rng = Lcg(a.seed)
    dev_name, dev_total = "Simulated GPU", 16 * GiB
    if a.scenario in ("training", "passthrough"):
        pooled = a.scenario == "training"
        w = Writer(out, a.pid, ["python3", "train.py", "--steps", "40"],
                   config("growth" if pooled else "passthrough", {"all": {"bytes": 4 * GiB}, "devices": {}} if pooled else None))
        w.device(0, dev_name, dev_total)
        training(w, pooled, rng)
        w.footer()
    elif a.scenario in ("rank", "killed"):
        w = Writer(out, a.pid, ["python3", "train.py", "--rank", str(a.seed)], config(), t0=1_000_000_000 + a.seed * 300_000)
        w.device(0, dev_name, dev_total)
        training(w, True, rng, steps=10, oom_at_end=False)
        if a.scenario == "rank":
            w.footer()
    elif a.scenario == "replay":
        w = Writer(out, a.pid, ["./replay_case"], config("passthrough"))
        w.device(0, dev_name, dev_total)
        base = 0x7F0000000000
        seq = [("alloc", 1 * MiB, base), ("alloc", 3 * MiB, base + MiB), ("free", 0, base),
               ("alloc", 2 * MiB, base + 4 * MiB)]
        for ev, size, ptr in seq:
            w.t += 1000
            if ev == "alloc":
                w.event("alloc", api="cudaMalloc", path="symbol", size=size, ptr=ptr, dur=1000, stream=0)
            else:
                w.event("free", api="cudaFree", path="symbol", ptr=ptr, dur=1000)
        w.footer()
    elif a.scenario == "interleaved":
        # Two threads: thread 2's buffer was drained first, so the free of a block comes before
        # its allocation by thread 1 in the file (t still orders them).
        w = Writer(out, a.pid, ["./interleaved"], config("passthrough"))
        w.device(0, dev_name, dev_total)
        base = 0x7F0000000000
        w.t = 2_000_000_000
        w.event("free", api="cudaFree", path="symbol", ptr=base, dur=1000, tid=2)
        w.t = 1_000_000_000
        w.event("alloc", api="cudaMalloc", path="symbol", size=MiB, ptr=base, dur=1000, tid=1)
        w.t = 3_000_000_000
        w.event("alloc", api="cudaMalloc", path="symbol", size=2 * MiB, ptr=base + MiB, dur=1000, tid=1)
        w.footer()
    elif a.scenario == "big":
        # A block of events that ends with everything freed, repeated with later times: fast to
        # write, and a valid trace of any length.
        w = Writer(out, a.pid, ["./big"], config())
        w.device(0, dev_name, 80 * GiB)
        block = []  # (dt, text after the time)
        live = []
        reserved = 64 * GiB
        in_use = 0
        base = 0x7F0000000000
        ptr = base
        n_block = min(a.events, 100_000)
        i = 0
        while len(block) < n_block:
            dt = 700 + (i * 7919) % 600
            if (len(live) < 1000 and (i % 3 != 2 or not live)) and len(block) + len(live) < n_block - 1:
                size = 512 * (1 + (i * 2654435761) % 8192)
                live.append((ptr, size))
                in_use += size
                block.append((dt, ',"tid":7,"ev":"alloc","api":"cudaMalloc","path":"symbol","dev":0,"size":%d,'
                              '"ptr":"0x%x","stream":"0x0","rc":0,"dur":%d,"reserved":%d,"in_use":%d,'
                              '"largest_free":%d,"quarantined":0,"free_blocks":%d}\n'
                              % (size, ptr, 500 + i % 700, reserved, in_use, (reserved - in_use) // 2,
                                 1 + len(live) // 8)))
                ptr += size
            else:
                if not live:
                    break
                p, size = live.pop((i * 31) % len(live))
                in_use -= size
                block.append((dt, ',"tid":7,"ev":"free","api":"cudaFree","path":"symbol","dev":0,"size":0,'
                              '"ptr":"0x%x","rc":0,"dur":%d,"reserved":%d,"in_use":%d,"largest_free":%d,'
                              '"quarantined":0,"free_blocks":%d}\n'
                              % (p, 300 + i % 300, reserved, in_use, (reserved - in_use) // 2, 1 + len(live) // 8)))
            i += 1
        t = 1_000_000_000
        written = 0
        while written < a.events:
            buf = []
            for dt, rest in block[: a.events - written]:
                t += dt
                buf.append('{"type":"event","t":%d%s' % (t, rest))
            out.write("".join(buf))
            written += len(buf)
        w.events = written
        w.allocs = written // 2
        w.t = t
        w.footer()
    else:
        ap.error("unknown scenario " + a.scenario)
    if out is not sys.stdout:
        out.close()


if __name__ == "__main__":
    main()
