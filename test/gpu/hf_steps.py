# A Hugging Face `transformers` model trained from a config (no weights, nothing downloaded) for
# the default-policy decision (issue 39): GPT-2's architecture at 6 layers, width 512, trained
# with AdamW on random tokens whose sequence length varies from step to step (128..512, a fixed
# draw). Run with PYTORCH_NO_CUDA_MEMORY_CACHING=1, so that every tensor is one cudaMalloc that
# cupool serves. Prints one JSON line: the median step and the final loss.
#   STEPS=60 python3 hf_steps.py
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
steps = int(os.environ.get("STEPS", "60"))
config = GPT2Config(n_layer=6, n_embd=512, n_head=8, n_positions=512, vocab_size=16384)
model = GPT2LMHeadModel(config).cuda().train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
draw = torch.Generator().manual_seed(1)
times = []
for i in range(steps):
    seq = int(torch.randint(128, 513, (1,), generator=draw))
    ids = torch.randint(0, config.vocab_size, (max(1, 8192 // seq), seq), generator=draw).cuda()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
print(json.dumps({"workload": "hf_gpt2_steps", "steps": steps, "loss": round(loss.item(), 6),
                  "loss_hex": float(loss.item()).hex(), "median_step_ms": round(statistics.median(times[5:]) * 1e3, 2)}),
      flush=True)
