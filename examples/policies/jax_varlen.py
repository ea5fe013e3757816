# A JAX run with varying shapes: an MLP gradient step on (batch, seq, 1024) activations whose
# sequence length changes every step (8 buckets from 128 to 1024, tokens per batch fixed), so
# XLA's buffers change size as a long training run's would. Prints one JSON line.
#   STEPS=200 python3 jax_varlen.py
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp

steps = int(os.environ.get("STEPS", "200"))
d, tokens = 1024, 32768
buckets = [128 * (i + 1) for i in range(8)]


def loss(w, x):
    h = x
    for i in range(6):
        h = jax.nn.gelu(h @ w[i])
    return (h ** 2).mean()


grad = jax.jit(jax.grad(loss))
k = jax.random.PRNGKey(0)
w = [jax.random.normal(jax.random.fold_in(k, i), (d, d)) * 0.02 for i in range(6)]
order = jax.random.randint(jax.random.PRNGKey(1), (steps,), 0, len(buckets)).tolist()
times = []
for i, b in enumerate(order):
    seq = buckets[b]
    x = jax.random.normal(jax.random.fold_in(k, 1000 + i), (tokens // seq, seq, d))
    t0 = time.perf_counter()
    g = grad(w, x)
    w = [a - 1e-3 * gb for a, gb in zip(w, g)]
    jax.block_until_ready(w)
    times.append(time.perf_counter() - t0)
stats = jax.devices()[0].memory_stats() or {}
print(json.dumps({
    "workload": "jax_varlen", "steps": steps, "checksum": float(sum(float(a.sum()) for a in w)),
    "median_step_ms": round(statistics.median(times[len(buckets) * 2:]) * 1e3, 2),
    "xla_peak_bytes_in_use": stats.get("peak_bytes_in_use"), "xla_bytes_limit": stats.get("bytes_limit"),
}), flush=True)
