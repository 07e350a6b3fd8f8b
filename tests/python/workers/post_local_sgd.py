"""PyTorch's post-local SGD (torch.distributed.algorithms), as its docs
write it, in an unmodified "gloo" script with COMPCOLL_ALGO from the
environment: DDP with post_localSGD_hook (a global allreduce of each bucket
until START, then each bucket allreduced within a subgroup) and
PostLocalSGDOptimizer, whose PeriodicModelAverager allreduces the
parameters over the world every PERIOD steps once past START.

The hook's allreduces run in backward (gradient sums: compressed); the
averager's run after the optimizer step (values: exact, or the replicas
would not be equal after an averaging step). The RESULT line reports, per
step, whether every rank (and every rank of its subgroup) holds the same
parameters, the compressed calls
of the world group and of the subgroup, and whether the world group's calls
after START were all exact."""
import torch
import torch.distributed as dist
import torch.distributed.algorithms.model_averaging.averagers as averagers
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
    PostLocalSGDState, post_localSGD_hook)
from torch.distributed.optim import PostLocalSGDOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from common import emit, init

rank, world = init("gloo")  # COMPCOLL_ALGO in the environment makes it compcoll
import compcoll  # noqa: E402

START, PERIOD, STEPS = 3, 2, 8

# Two "nodes" of world / 2 ranks each (new_subgroups() would size them by the
# CUDA devices, which a CPU job has none of): between averaging steps the
# nodes' replicas drift apart, and each averaging step makes them equal.
subgroup, _ = dist.new_subgroups(group_size=world // 2)
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)))
model.register_comm_hook(PostLocalSGDState(process_group=None, subgroup=subgroup,
                                           start_localSGD_iter=START), post_localSGD_hook)
opt = PostLocalSGDOptimizer(optim=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                            averager=averagers.PeriodicModelAverager(period=PERIOD,
                                                                     warmup_steps=START))


def flat():
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def same_on_every_rank(t, group=None):
    everyone = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, t, group=group)
    return all(torch.equal(everyone[0], x) for x in everyone)


g = torch.Generator().manual_seed(100 + rank)
steps = []
for step in range(STEPS):
    opt.zero_grad()
    x = torch.randn(16, 256, generator=g)
    nn.functional.cross_entropy(model(x), torch.randint(0, 10, (16,), generator=g)).backward()
    opt.step()
    steps.append({"step": step + 1, "same": same_on_every_rank(flat()),
                  "same_in_subgroup": same_on_every_rank(flat(), subgroup),
                  "world_compressed": compcoll.stats()["compressed_calls"],
                  "world_calls": compcoll.stats()["calls"],
                  "sub_compressed": compcoll.stats(subgroup)["compressed_calls"]})
emit({"rank": rank, "steps": steps, "finite": bool(torch.isfinite(flat()).all())})
dist.destroy_process_group()
