"""torch's HierarchicalModelAverager beside DDP, 4 ranks, COMPCOLL_ALGO from
the environment: DDP's buckets are allreduced over the world in backward
(compressed); the averager averages the parameters every 2 steps within
subgroups of 2 ranks (dist.new_subgroups, which carry nothing else) and
every 4 steps over the world, after the optimizer step (values: exact). The
subgroups' calls were warned about as if they were gradients of a loop of
the script's own. The RESULT line says, per step, whether every rank holds
the same parameters, what the process compressed, and how many allreduce
calls the subgroups made."""
from collections import OrderedDict

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.model_averaging.hierarchical_model_averager import \
    HierarchicalModelAverager
from torch.nn.parallel import DistributedDataParallel as DDP

from common import emit, init, parameters_identical

rank, world = init("gloo")  # COMPCOLL_ALGO in the environment makes it compcoll
import compcoll  # noqa: E402

torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
averager = HierarchicalModelAverager(period_group_size_dict=OrderedDict([(2, 2), (4, world)]),
                                     warmup_steps=0)
g = torch.Generator().manual_seed(100 + rank)
steps = []
for step in range(1, 7):
    opt.zero_grad()
    x = torch.randn(16, 64, generator=g)
    (model(x) - x[:, :1]).pow(2).mean().backward()
    opt.step()
    averager.average_parameters(model.parameters())
    same, _ = parameters_identical(model, world)
    steps.append({"step": step, "same": same})
st = compcoll.stats()
emit({"rank": rank, "steps": steps, "compressed_calls": st["compressed_calls"],
      "averaging_calls": compcoll.stats(averager.period_process_group_dict[2])["calls"]})
dist.destroy_process_group()
