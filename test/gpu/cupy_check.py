# CuPy with its memory pool turned off, so that every array is one cudaMalloc: the count of
# arrays it made must equal the trace's allocations; the result must not change under cupool.
import json
import cupy as cp

cp.cuda.set_allocator(None)
made = 0
acc = 0.0
a = cp.arange(1 << 20, dtype=cp.float32); made += 1
for i in range(30):
    b = cp.full((1 << 16) * (1 + i % 5), float(i), dtype=cp.float32); made += 1
    acc += float(b.sum())
    del b
print(json.dumps({"checksum": acc + float(a[:1000].sum()), "arrays_made": made}))
