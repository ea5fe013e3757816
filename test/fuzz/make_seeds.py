#!/usr/bin/env python3
"""Writes the trace reader's seed corpus (test/fuzz/corpus/trace_reader/seed-*): a few small traces
with every line kind, as libcupool.so writes them (trace/trace_writer.cpp) or as
test/tools/gen_trace.py does, plain, gzip and zstd. Run by hand when the format changes; the
files are checked in. Regression inputs (crash-*) found by fuzzing are kept beside them.

  test/fuzz/make_seeds.py            (needs the zstd command for the .zst seed)
"""
import gzip
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "trace_reader")

CONFIG = ('{"policy":"growth","free":"deferred","limit":{"all":{"bytes":42949672960},"devices":{"1":{"percent":50}}},'
          '"preallocate":{"percent":75},"preallocate_grow":false,"growth_chunk":33554432,'
          '"growth_chunk_max":536870912,"release_idle_ns":30000000000,"thread_cache":true,"vmm_cache":true,'
          '"trace":"/tmp/run.%p.jsonl","trace_flush_ns":100000000,"trace_buffer_events":16384,"log_level":"info"}')


def header(version, cmdline='["python3","train.py"]'):
    return ('{"type":"header","format":"cupool-trace","version":"%s","cupool_version":"0.1.0","pid":4242,'
            '"ppid":1,"host":"testhost","cmdline":%s,"start_unix_ns":1700000000000000000,'
            '"start_mono_ns":1000000000,"config":%s,"devices":[]}\n' % (version, cmdline, CONFIG))


DEVICE = '{"type":"device","t":1000000100,"index":0,"name":"NVIDIA H200","total_bytes":150754820096}\n'
POOL = '"reserved":33554432,"in_use":1048576,"largest_free":32505856,"quarantined":0,"free_blocks":1'

# Version 2.1, as the writer writes it: every event kind's shape, optional keys, a drop line.
EVENTS_21 = [
    '{"type":"event","t":1000001000,"tid":4242,"ev":"stream_create","api":"cudaStreamCreateWithFlags","path":"symbol","dev":0,"size":0,"ptr":"0x0","stream":"0x55d0c0a0","flags":1,"rc":0,"dur":2100}\n',
    '{"type":"event","t":1000002000,"tid":4242,"ev":"grow","api":"","path":"none","dev":0,"size":33554432,"ptr":"0x7f0000000000","rc":0,"dur":48192,"reserved":33554432,"in_use":0,"largest_free":33554432,"quarantined":0,"free_blocks":1}\n',
    '{"type":"event","t":1000002500,"tid":4242,"ev":"alloc","api":"cudaMallocAsync","path":"dlsym","dev":0,"size":1048576,"ptr":"0x7f0000000000","stream":"0x55d0c0a0","rc":0,"dur":670,%s}\n' % POOL,
    '{"type":"event","t":1000003000,"tid":4243,"ev":"free","api":"cuMemFree_v2","path":"proc-address","dev":0,"size":1048576,"ptr":"0x7f0000000000","rc":0,"reserved":33554432,"in_use":0,"largest_free":32505856,"quarantined":0,"cached":1048576,"free_blocks":1}\n',
    '{"type":"event","t":1000003500,"tid":4243,"ev":"alloc","api":"cudaMalloc","path":"entry-point","dev":0,"size":1048576,"ptr":"0x7f0000000000","stream":"0x0","rc":0,"dur":140,"timed_for":16,%s}\n' % POOL,
    '{"type":"event","t":1000004000,"tid":4242,"ev":"vmm_create","api":"cuMemCreate","path":"proc-address","dev":0,"size":2097152,"ptr":"0x1","rc":0,"dur":900,"recycled":true}\n',
    '{"type":"event","t":1000005000,"tid":4242,"ev":"oom","api":"cudaMalloc","path":"symbol","dev":0,"size":85899345920,"ptr":"0x0","rc":2,"dur":300,"oom":"limit",%s}\n' % POOL,
    '{"type":"drop","t":1000005500,"tid":4243,"count":12}\n',
    '{"type":"event","t":1000006000,"tid":4242,"ev":"graph_mem","api":"cudaGraphInstantiate","path":"symbol","dev":0,"size":4194304,"ptr":"0x0","rc":0,"dur":5000}\n',
    '{"type":"event","t":1000007000,"tid":4242,"ev":"stream_destroy","api":"cudaStreamDestroy","path":"symbol","dev":0,"size":0,"ptr":"0x0","stream":"0x55d0c0a0","flags":1,"rc":0,"dur":800}\n',
]
FOOTER = ('{"type":"footer","events":9,"dropped":12,"allocs":2,"frees":1,"ooms":1,"end_mono_ns":1000008000,'
          '"devices":[{"index":0,"name":"NVIDIA H200","total_bytes":150754820096}]}\n')
TRACE_21 = header("2.1") + DEVICE + "".join(EVENTS_21) + FOOTER

# A newer minor version: an unknown line type, an unknown event kind and unknown keys are skipped;
# keys in another order, escapes, whitespace, a bare-number address.
TRACE_29 = (header("2.9", '["/usr/bin/python3","-c","print(\\"\\u00e9\\t\\ud83d\\ude00\\")"]') + DEVICE +
            '{"type":"marker","t":1000000500,"label":{"nested":[1,2.5e3,null,true]}}\n'
            '{"type":"event","t":1000001000,"tid":7,"ev":"prefetch","api":"cudaMemPrefetchAsync","path":"symbol","dev":0,"size":4096,"ptr":"0x7f0000000000","rc":0,"dur":10}\n'
            '{"ev":"alloc", "t":1000002000, "type":"event", "tid":7, "api":"cu\\u004dem\\/Alloc", "path":"symbol", "dev":-1, "size":4096, "ptr":140737488355328, "rc":0, "dur":10, "future":{"a":[{}]}}\r\n'
            '\n' + FOOTER)

# gen_trace.py's hand-computable replay case (format 1.0): header, device, alloc/free, footer.
GEN = os.path.join(HERE, "..", "tools", "gen_trace.py")


def gen(scenario):
    path = os.path.join(OUT, ".gen.jsonl")
    subprocess.run([sys.executable, GEN, scenario, path], check=True)
    with open(path) as f:
        text = f.read()
    os.remove(path)
    return text


def write(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def gz(text):
    return gzip.compress(text.encode(), mtime=0)


def main():
    os.makedirs(OUT, exist_ok=True)
    write("seed-v1.0-replay.jsonl", gen("replay"))
    killed = gen("killed").splitlines(keepends=True)
    write("seed-v1.0-killed-cut.jsonl", "".join(killed[:6]) + killed[6][:70])  # no footer, last line cut
    write("seed-v2.1-every-kind.jsonl", TRACE_21)
    write("seed-v2.9-newer-minor.jsonl", TRACE_29)
    # Bytes that are not UTF-8 in a name and the command line: read as U+FFFD.
    write("seed-v2.1-bad-utf8.jsonl",
          header("2.1", '["caf\xe9","\xed\xa0\x80","\xf4\x90\x80\x80"]').encode("latin-1") +
          b'{"type":"device","t":1,"index":1,"name":"GPU \xff\xc0\xaf","total_bytes":1}\n' +
          EVENTS_21[2].replace("cudaMallocAsync", "cuda\x80Malloc").encode("latin-1"))
    write("seed-v2.1-every-kind.jsonl.gz", gz(TRACE_21))
    # Two gzip members one after another (cat a.gz b.gz), cut inside the second.
    write("seed-v2.1-two-members-cut.jsonl.gz", gz(header("2.1") + DEVICE) + gz("".join(EVENTS_21) + FOOTER)[:-9])
    # A line longer than the reader's first buffer (64 KiB): it must grow.
    long_line = EVENTS_21[1].replace('"api":""', '"api":"' + "x" * 70000 + '"')
    write("seed-v2.1-long-line.jsonl.gz", gz(header("2.1") + long_line + FOOTER))
    zst = subprocess.run(["zstd", "-q", "-19", "-c"], input=TRACE_21.encode(), stdout=subprocess.PIPE, check=True)
    write("seed-v2.1-every-kind.jsonl.zst", zst.stdout)


if __name__ == "__main__":
    main()
