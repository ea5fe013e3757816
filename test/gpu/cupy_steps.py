# A CuPy workload for the default-policy decision (issue 39): CuPy's memory pool off, so that
# every array is one cudaMalloc that cupool serves; shapes that vary from step to step (a batch of
# 2^14..2^17 rows, 256 wide) through the operations a CuPy pipeline uses: a matrix product,
# elementwise kernels, a sort, an FFT and reductions. Prints one JSON line: the median step,
# and a checksum (float64) to hold growth and vmm to the same result.
#   STEPS=120 python3 cupy_steps.py
import json
import os
import statistics
import time

import cupy as cp

cp.cuda.set_allocator(None)
steps = int(os.environ.get("STEPS", "120"))
rng = cp.random.default_rng(0)
w = rng.standard_normal((256, 256), dtype=cp.float32) / 16
rows_of = [1 << (14 + (i * 7) % 4) for i in range(steps)]  # 16 Ki..128 Ki rows, a fixed pattern
checksum, times = 0.0, []
for i, rows in enumerate(rows_of):
    t0 = time.perf_counter()
    x = cp.random.default_rng(i).standard_normal((rows, 256), dtype=cp.float32)
    h = cp.tanh(x @ w)
    s = cp.sort(h[:, 0])
    f = cp.abs(cp.fft.rfft(h[:, :64], axis=0))
    step = float(s[rows // 2]) + float(f.mean(dtype=cp.float64)) + float(h.sum(dtype=cp.float64))
    cp.cuda.Device().synchronize()
    times.append(time.perf_counter() - t0)
    checksum += step
    del x, h, s, f
print(json.dumps({"workload": "cupy_steps", "steps": steps, "checksum": checksum, "checksum_hex": float(checksum).hex(),
                  "median_step_ms": round(statistics.median(times[5:]) * 1e3, 3)}), flush=True)
