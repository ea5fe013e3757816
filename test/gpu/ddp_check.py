# Two-rank data-parallel training over NCCL (torchrun --nproc_per_node=2): the summed final loss
# must be identical with and without cupool; under cupool each rank writes its own trace.
import json

import torch
import torch.distributed as dist
import torch.nn as nn

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
ddp = nn.parallel.DistributedDataParallel(model, device_ids=[rank])
opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
g = torch.Generator(device="cuda").manual_seed(rank)
for step in range(30):
    x = torch.randn(256 + 64 * (step % 5), 1024, device="cuda", generator=g)
    loss = ddp(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
l = loss.detach().clone()
dist.all_reduce(l)
if rank == 0:
    print(json.dumps({"check": "ddp", "world": dist.get_world_size(), "loss_sum": l.item()}), flush=True)
dist.destroy_process_group()
