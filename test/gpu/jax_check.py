# JAX/XLA on the GPU: a deterministic computation whose result must not change under cupool,
# and XLA's own allocation statistics.
import json
import jax
import jax.numpy as jnp

k = jax.random.PRNGKey(0)
xs = [jax.random.normal(jax.random.fold_in(k, i), (512 * (1 + i % 7), 1024)) for i in range(40)]
w = jax.random.normal(k, (1024, 1024)) * 0.02
acc = jnp.zeros(())
for x in xs:
    acc = acc + jnp.tanh(x @ w).sum()
acc = float(jax.block_until_ready(acc))
stats = jax.devices()[0].memory_stats() or {}
print(json.dumps({"checksum": acc, "num_allocs": stats.get("num_allocs"), "peak_bytes_in_use": stats.get("peak_bytes_in_use")}))
