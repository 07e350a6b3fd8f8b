"""Which error-feedback key each DDP bucket allreduce gets, iteration by
iteration, across DDP's bucket rebuild after the first iteration.

For each model (one that fits in one bucket and one that DDP splits into
several after the rebuild) it trains ITERS steps on a fresh compcoll group
and reports, per iteration, the (key, numel, event) of every allreduce.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from common import emit, init

rank, world = init("gloo")
import compcoll  # noqa: E402
from compcoll import _C  # noqa: E402

ITERS = 6
MODELS = {
    # 64*256+256 + 256*256+256 + 256*10+10: one bucket before and after
    "small": lambda: nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                   nn.Linear(256, 10)),
    # ~2.4M parameters: one bucket in iteration 1, then 1 MiB + 25 MiB buckets
    "big": lambda: nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024),
                                 nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 10)),
}

out = {"rank": rank}
for name, make in MODELS.items():
    os.environ["COMPCOLL_ALGO"] = "dgc"
    group = dist.new_group(backend="compcoll")
    backend = compcoll.backend_of(group)
    torch.manual_seed(0)
    model = DDP(make(), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    iters, seen = [], 0
    for it in range(ITERS):
        x = torch.randn(16, model.module[0].in_features, generator=g)
        y = torch.randint(0, 10, (16,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        trace = _C.key_trace(backend)
        iters.append([list(t) for t in trace[seen:]])
        seen = len(trace)
    out[name] = {"iterations": iters, "state_entries": compcoll.state_entries(group),
                 "slots": compcoll.slots(group),
                 "params": sum(p.numel() for p in model.parameters())}
    del model, opt
    dist.destroy_process_group(group)
emit(out)
dist.destroy_process_group()
