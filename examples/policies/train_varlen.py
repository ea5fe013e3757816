# A PyTorch training run whose shapes vary step to step, the pattern that fragments memory:
# sequence lengths drawn from 64 to 1024 with tokens per batch fixed (16384). A 6-layer
# transformer encoder (d_model 512), AdamW. Prints one JSON line: final loss, step times and
# the caching allocator's own peaks (zero when its cache is off).
#   STEPS=150 SEED=1 python3 train_varlen.py    (SEED: the draw of lengths; jobs run side by side
#   with different seeds do not peak together)
import json
import os
import statistics
import time

import torch
import torch.nn as nn

torch.manual_seed(0)
steps = int(os.environ.get("STEPS", "150"))
d_model, tokens = 512, 16384
model = nn.TransformerEncoder(
    nn.TransformerEncoderLayer(d_model=d_model, nhead=8, dim_feedforward=2048, batch_first=True), num_layers=6
).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
lengths = torch.Generator().manual_seed(int(os.environ.get("SEED", "1")))
times = []
for i in range(steps):
    seq = int(torch.randint(64, 1025, (1,), generator=lengths))
    x = torch.randn(max(1, tokens // seq), seq, d_model, device="cuda")
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
print(json.dumps({
    "workload": "train_varlen", "steps": steps, "loss": round(loss.item(), 6), "loss_hex": float(loss.item()).hex(),
    "median_step_ms": round(statistics.median(times[5:]) * 1e3, 2),
    "total_s": round(sum(times), 2),
    "torch_max_reserved": torch.cuda.max_memory_reserved(), "torch_max_allocated": torch.cuda.max_memory_allocated(),
}), flush=True)
