# The JAX MLP step of shared/workloads/jax_mlp_step.py (6 layers, 2048 wide, 30 steps after 3
# warm-up), printing its step time and a digest of the final weights, so that a run under cupool's
# VMM mapping cache (XLA_PYTHON_CLIENT_ALLOCATOR=platform, CUPOOL_POLICY=growth) can be compared
# with XLA's own BFC pool: same digest, step time close to BFC's. run_all.py sets XLA_FLAGS for
# deterministic kernels (no autotuning), so the digest depends on nothing but the arithmetic.
#
#   jax_vmm_check.py            the step as the workload runs it, and the digest
#   jax_vmm_check.py dispatch   how long the gradient call takes to *return* (before the result is
#                               ready), median of 30: with an allocator that cannot free
#                               asynchronously, XLA's GpuExecutable blocks the host until the device
#                               is done inside every execution, so the call returns only then
#   jax_vmm_check.py serial     the step with every execution waited for at once (1 gradient + 12
#                               element-wise executions): the best a step can do when each
#                               execution blocks, whatever allocator sits under XLA
import hashlib, json, os, statistics, sys, time
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


def step_serial(w):
    gr = jax.block_until_ready(g(w, x))
    out = []
    for a, b in zip(w, gr):
        m = jax.block_until_ready(1e-3 * b)
        out.append(jax.block_until_ready(a - m))
    return out


mode = sys.argv[1] if len(sys.argv) > 1 else "step"
if mode not in ("step", "dispatch", "serial"):
    sys.exit("jax_vmm_check.py: unknown run %r (accepted: step, dispatch, serial)" % mode)
label = os.environ.get("MODE", "?")
for _ in range(3):
    w = step(w)
jax.block_until_ready(w)

if mode == "dispatch":
    returns, totals = [], []
    for _ in range(30):
        t0 = time.perf_counter()
        gr = g(w, x)
        t1 = time.perf_counter()
        jax.block_until_ready(gr)
        t2 = time.perf_counter()
        returns.append((t1 - t0) * 1e3)
        totals.append((t2 - t0) * 1e3)
    r, t = statistics.median(returns), statistics.median(totals)
    print("jax mode=%-30s gradient call returns after %.3f ms, result ready after %.3f ms" % (label, r, t), flush=True)
    print(json.dumps({"dispatch_return_ms": round(r, 3), "dispatch_ready_ms": round(t, 3)}), flush=True)
    sys.exit(0)

run_step = step_serial if mode == "serial" else step
t0 = time.perf_counter()
for _ in range(30):
    w = run_step(w)
jax.block_until_ready(w)
ms = (time.perf_counter() - t0) / 30 * 1e3
digest = hashlib.sha256(b"".join(np.asarray(a).tobytes() for a in w)).hexdigest()[:16]
print("jax mode=%-30s step=%.2f ms" % (label + ("" if mode == "step" else " " + mode), ms), flush=True)
print(json.dumps({"step_ms": round(ms, 3), "digest": digest, "run": mode}), flush=True)
