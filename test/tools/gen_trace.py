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
  share-a      with share-b: two processes whose clocks are of different boots (they meet by
  share-b      the wall clock), each allocating and freeing in turn (replay --share-limit)
  frag         1 MiB, 1 MiB, free the second, 2 MiB, on a device of 3 MiB (replay --min-capacity)
  pool         a growth pool that places its blocks in its chunks (first fit, 512-byte blocks) on
               two devices: deferred frees held for fences once a second stream exists, a chunk
               given back, allocations outside the pool (managed memory), virtual-memory
               mappings, an out-of-memory; some blocks live and one waiting for its fence at the
               end (for the exports that rebuild the pool's chunks: export --memory-viz)
The pool model here only has to be self-consistent; the real pool is policy/context_pool.cpp.
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
    def __init__(self, out, pid, cmdline, config, t0=1_000_000_000, version="1.0",
                 start_unix=1_700_000_000_000_000_000):
        self.out = out
        self.t = t0
        self.events = 0
        self.allocs = self.frees = self.ooms = 0
        self.pid = pid
        header = {"type": "header", "format": "cupool-trace", "version": version, "cupool_version": "0.1.0",
                  "pid": pid, "ppid": 1, "host": "testhost", "cmdline": cmdline,
                  "start_unix_ns": start_unix, "start_mono_ns": t0, "config": config}
        self.devices = []
        self.line(header)

    def line(self, obj):
        self.out.write(json.dumps(obj, separators=(",", ":")) + "\n")

    def device(self, index, name, total):
        self.devices.append({"index": index, "name": name, "total_bytes": total})
        self.line({"type": "device", "t": self.t, "index": index, "name": name, "total_bytes": total})

    def event(self, ev, api="", path="none", dev=0, size=0, ptr=0, rc=0, dur=0, tid=None,
              pool=None, oom=None, stream=None, extra=None):
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
        if extra:
            o.update(extra)
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


class ChunkPool:
    """A growth pool that places blocks inside its chunks, first fit, in 512-byte units, with
    deferred frees held until a fence retires (in batches, oldest first)."""

    def __init__(self, w, dev, base):
        self.w, self.dev = w, dev
        self.chunks = []  # [addr, size]
        self.free = []  # [addr, size] free ranges
        self.live = {}  # addr -> (rounded, requested)
        self.held = []  # addresses waiting for a fence, oldest first
        self.next_base = base
        self.step = 2 * MiB
        self.fences = False  # a second stream exists: frees wait for fences

    def state(self):
        reserved = sum(c[1] for c in self.chunks)
        in_use = sum(r for a, (r, q) in self.live.items() if a not in self.held)
        quarantined = sum(self.live[a][0] for a in self.held)
        largest = max((f[1] for f in self.free), default=0)
        return {"reserved": reserved, "in_use": in_use, "largest_free": largest, "quarantined": quarantined,
                "free_blocks": len(self.free)}

    def _take(self, size):
        for f in sorted(self.free):
            if f[1] >= size:
                addr = f[0]
                self.free.remove(f)
                if f[1] > size:
                    self.free.append([addr + size, f[1] - size])
                return addr
        return 0

    def _give(self, addr, size):
        self.free.append([addr, size])
        self.free.sort()
        merged = []
        for f in self.free:  # coalesce neighbours (within a chunk: chunks are never adjacent here)
            if merged and merged[-1][0] + merged[-1][1] == f[0]:
                merged[-1][1] += f[1]
            else:
                merged.append(f)
        self.free = merged

    def alloc(self, size, api="cudaMalloc", stream=0):
        w = self.w
        rounded = max(1, (size + 511) // 512) * 512
        w.t += 2_000
        addr = self._take(rounded)
        if not addr:
            chunk = max(self.step, (rounded + 2 * MiB - 1) // (2 * MiB) * (2 * MiB))
            self.step = min(self.step * 2, 64 * MiB)
            base = self.next_base
            self.next_base += chunk + 2 * MiB  # a gap: chunks are never adjacent
            self.chunks.append([base, chunk])
            self._give(base, chunk)
            w.event("grow", dev=self.dev, size=chunk, ptr=base, dur=50_000, pool=self.state())
            addr = self._take(rounded)
        self.live[addr] = (rounded, size)
        w.event("alloc", api=api, path="symbol", dev=self.dev, size=size, ptr=addr, dur=700, pool=self.state(),
                stream=stream)
        return addr

    def free_(self, addr):
        w = self.w
        w.t += 1_500
        if self.fences:
            self.held.append(addr)
        else:
            rounded, _ = self.live.pop(addr)
            self._give(addr, rounded)
        w.event("free", api="cudaFree", path="symbol", dev=self.dev, ptr=addr, dur=400, pool=self.state())

    def retire(self, n):
        """A fence retired: the n oldest held blocks are free again."""
        w = self.w
        w.t += 1_000
        batch, self.held = self.held[:n], self.held[n:]
        size = 0
        for a in batch:
            rounded, _ = self.live.pop(a)
            size += rounded
            self._give(a, rounded)
        w.event("fence_retired", dev=self.dev, size=size, dur=2_000, pool=self.state())

    def release_empty(self):
        """Give back the last chunk when it is wholly free."""
        w = self.w
        for c in reversed(self.chunks):
            if [c[0], c[1]] in self.free:
                self.free.remove([c[0], c[1]])
                self.chunks.remove(c)
                w.t += 1_000
                w.event("release", dev=self.dev, size=c[1], ptr=c[0], dur=30_000, pool=self.state())
                return c
        return None


def pool_scenario(w, rng):
    pools = [ChunkPool(w, 0, 0x7F0000000000), ChunkPool(w, 1, 0x7E0000000000)]
    p0, p1 = pools
    params = [p0.alloc((1 + rng.below(4)) * MiB + rng.below(5000)) for _ in range(6)]
    for step in range(8):
        w.t += 100_000
        acts = [p0.alloc((1 + rng.below(16)) * 64 * 1024 + rng.below(999)) for _ in range(5 + rng.below(4))]
        for i, a in enumerate(acts):
            if i % 2 == 0:
                p0.free_(a)
        for i, a in enumerate(acts):
            if i % 2 == 1:
                p0.free_(a)
    # A large block in a chunk of its own, then freed: the chunk is given back.
    big = p0.alloc(40 * MiB)
    p0.free_(big)
    released = p0.release_empty()
    assert released is not None
    # Managed memory: not served by the pool (no pool fields), held outside it.
    w.t += 5_000
    managed = 0x7D0000000000
    w.event("alloc", api="cudaMallocManaged", path="symbol", dev=0, size=3 * MiB + 100, ptr=managed, dur=9_000)
    w.t += 5_000
    w.event("alloc", api="cudaMallocManaged", path="symbol", dev=0, size=MiB, ptr=managed + 4 * MiB, dur=9_000)
    w.t += 5_000
    w.event("free", api="cudaFree", path="symbol", dev=0, ptr=managed + 4 * MiB, dur=5_000)
    # Virtual memory (PyTorch's expandable segments): two handles mapped into one reservation,
    # the second unmapped and released again.
    va, h1, h2 = 0x7C0000000000, 0xA1, 0xA2
    for h in (h1, h2):
        w.t += 5_000
        w.event("vmm_create", api="cuMemCreate", path="proc-address", dev=0, size=2 * MiB, ptr=h, dur=20_000)
    w.t += 5_000
    w.event("va_reserve", api="cuMemAddressReserve", path="proc-address", dev=0, size=64 * MiB, ptr=va, dur=3_000)
    for i, h in enumerate((h1, h2)):
        w.t += 5_000
        w.event("vmm_map", api="cuMemMap", path="proc-address", dev=0, size=2 * MiB, ptr=va + i * 2 * MiB, dur=3_000,
                extra={"handle": "0x%x" % h, "offset": 0})
    w.t += 5_000
    w.event("vmm_unmap", api="cuMemUnmap", path="proc-address", dev=0, size=2 * MiB, ptr=va + 2 * MiB, dur=3_000)
    w.t += 5_000
    w.event("vmm_release", api="cuMemRelease", path="proc-address", dev=0, size=0, ptr=h2, dur=3_000)
    # A second stream: from now on frees wait for fences.
    w.t += 5_000
    w.event("stream_create", api="cudaStreamCreateWithFlags", path="symbol", dev=0, stream=0x5000, dur=4_000,
            extra={"flags": 1})
    p0.fences = True
    for step in range(4):
        acts = [p0.alloc((1 + rng.below(8)) * 128 * 1024, stream=0x5000) for _ in range(4)]
        for a in acts:
            p0.free_(a)
        p0.retire(3)  # one stays behind each step, until the next fence
    w.t += 1_000
    last = p0.alloc(MiB + 7)
    p0.free_(last)  # still waiting for its fence when the trace ends
    p0.retire(len(p0.held) - 1)
    # Out of memory under the cap: the pool's event, then the program's failed call.
    w.t += 10_000
    w.event("oom", dev=0, size=6 * GiB, dur=5_000, oom="limit", pool=p0.state(), rc=2)
    w.event("alloc", api="cudaMalloc", path="symbol", dev=0, size=6 * GiB, ptr=0, rc=2, dur=5_500, pool=p0.state())
    # Device 1: a few blocks, one freed.
    d1 = [p1.alloc((i + 1) * MiB, api="cuMemAlloc_v2") for i in range(3)]
    p1.free_(d1[1])
    return params  # the parameters stay live


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
    elif a.scenario == "vmm":
        # The vmm policy: granules mapped and unmapped inside one range ("granules":true), a block
        # spanning granules of two maps, an unmap of part of what was mapped.
        w = Writer(out, a.pid, ["./vmm"], config("vmm"))
        w.device(0, dev_name, dev_total)
        base = 0x100000000000
        state = {"reserved": 0, "in_use": 0}

        def pool():
            return {"reserved": state["reserved"], "in_use": state["in_use"], "largest_free": 0,
                    "quarantined": 0, "free_blocks": 0}

        def step(ev, ptr, size, api=""):
            w.t += 1000
            if ev == "grow":
                state["reserved"] += size
            elif ev == "release":
                state["reserved"] -= size
            elif ev == "alloc":
                state["in_use"] += size
            elif ev == "free":
                state["in_use"] -= size
            extra = {"granules": True} if ev in ("grow", "release") else None
            path = "symbol" if api else "none"
            w.event(ev, api=api, path=path, size=size if ev != "free" else 0, ptr=ptr, dur=1000, pool=pool(), extra=extra)

        step("grow", base, 2 * MiB)
        step("alloc", base, 1 * MiB, "cudaMalloc")
        step("grow", base + 2 * MiB, 2 * MiB)
        step("alloc", base + 1 * MiB, 3 * MiB, "cudaMalloc")  # over both maps
        step("free", base + 1 * MiB, 3 * MiB, "cudaFree")
        step("release", base + 2 * MiB, 2 * MiB)  # the second map's granule, idle again
        step("free", base, 1 * MiB, "cudaFree")
        w.footer()
    elif a.scenario in ("share-a", "share-b"):
        # Wall-clock milliseconds after both traces opened (one start_unix_ns): a holds 6 MiB at
        # 1-3 and 9-10, b 4 MiB at 5-7. Their monotonic clocks are 49 s apart (other boots):
        # merged by `t`, all of b would come after a.
        first = a.scenario == "share-a"
        t0 = 1_000_000_000 if first else 50_000_000_000
        w = Writer(out, a.pid, ["./share", a.scenario], config("passthrough"), t0=t0)
        w.device(0, dev_name, dev_total)
        base = 0x7F0000000000
        seq = [(1, "alloc", 6 * MiB), (3, "free", 0), (9, "alloc", 6 * MiB), (10, "free", 0)] if first else \
              [(5, "alloc", 4 * MiB), (7, "free", 0)]
        for ms, ev, size in seq:
            w.t = t0 + ms * 1_000_000
            if ev == "alloc":
                w.event("alloc", api="cudaMalloc", path="symbol", size=size, ptr=base, dur=1000, stream=0)
            else:
                w.event("free", api="cudaFree", path="symbol", ptr=base, dur=1000)
        w.footer()
    elif a.scenario == "frag":
        w = Writer(out, a.pid, ["./frag"], config("passthrough"))
        w.device(0, dev_name, 3 * MiB)
        base = 0x7F0000000000
        seq = [("alloc", MiB, base), ("alloc", MiB, base + MiB), ("free", 0, base + MiB),
               ("alloc", 2 * MiB, base + MiB), ("free", 0, base), ("free", 0, base + MiB)]
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
    elif a.scenario == "pool":
        cfg = config("growth", {"all": {"bytes": 4 * GiB}, "devices": {}})
        cfg["free"] = "deferred"
        w = Writer(out, a.pid, ["python3", "pool.py"], cfg, version="2.2")
        w.device(0, dev_name, dev_total)
        w.device(1, dev_name, dev_total)
        pool_scenario(w, rng)
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
