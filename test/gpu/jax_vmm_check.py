# The JAX MLP step of shared/workloads/jax_mlp_step.py (6 layers, 2048 wide, 30 steps after 3
# warm-up), printing its step time and a digest of the final weights, so that a run under cupool's
# VMM mapping cache (XLA_PYTHON_CLIENT_ALLOCATOR=platform, CUPOOL_POLICY=growth) can be compared
# with XLA's own BFC pool: same digest, step time close to BFC's. run_all.py sets XLA_FLAGS for
# deterministic kernels (no autotuning), so the digest depends on nothing but the arithmetic.
import hashlib, json, os, time
import jax, jax.numpy as jnp
import numpy as np


def loss(w, x):
    h = x
    for i in range(6):
        h = jax.nn.gelu(h @ w[i])
    return (h ** 2).mean()


g = jax.jit(jax.grad(loss))
k = jax.random.PRNGKey(0)
w = [jax.random.normal(jax.random.fold_in(k, i), (2048, 2048)) * 0.02 for i in range(6)]
x = jax.random.normal(k, (4096, 2048))


def step(w):
    gr = g(w, x)
    return [a - 1e-3 * b for a, b in zip(w, gr)]


for _ in range(3):
    w = step(w)
jax.block_until_ready(w)
t0 = time.perf_counter()
for _ in range(30):
    w = step(w)
jax.block_until_ready(w)
ms = (time.perf_counter() - t0) / 30 * 1e3
digest = hashlib.sha256(b"".join(np.asarray(a).tobytes() for a in w)).hexdigest()[:16]
print("jax mode=%-30s step=%.2f ms" % (os.environ.get("MODE", "?"), ms), flush=True)
print(json.dumps({"step_ms": round(ms, 3), "digest": digest}), flush=True)
