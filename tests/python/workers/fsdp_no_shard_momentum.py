"""FSDP NO_SHARD (an allreduce of each flat gradient, compressed) with SGD
momentum, which compcoll takes over (COMPCOLL_MOMENTUM_HANDOVER=auto): STEPS
steps on rank-dependent data, each step's reduced gradients kept and
compared between the ranks only at the end (a collective between steps
would change when the previous step's tensors are freed, which is what the
test is about). See test_hooks.py."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy

from common import emit

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = FSDP(nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 32)),
             sharding_strategy=ShardingStrategy.NO_SHARD, use_orig_params=True,
             device_id=torch.device("cpu"))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
gen = torch.Generator().manual_seed(rank)
reduced = []
for _ in range(int(os.environ.get("STEPS", "30"))):
    loss = model(torch.randn(8, 128, generator=gen)).square().mean()
    opt.zero_grad()
    loss.backward()
    reduced.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone())
    opt.step()
mine = torch.stack(reduced)
every = [torch.empty_like(mine) for _ in range(world)]
dist.all_gather(every, mine)
differ = [i for i in range(len(reduced)) if not all(torch.equal(e[i], every[0][i]) for e in every)]
import compcoll  # noqa: E402

emit({"steps_differing": differ, "stats": compcoll.stats(None)})
dist.destroy_process_group()
