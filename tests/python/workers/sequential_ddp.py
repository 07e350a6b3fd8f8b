"""DDP models built one after another in one process, each once the
previous one is freed (cross-validation folds, a second fit, a sweep). The
last model must train bit for bit as it does in a process of its own: no
residual of an earlier model reaches it (buffer_slots.h, rule 2b').

env: MODELS  how many models train before the last (0: the last alone)
     STEPS   steps per model (default 5)
"""
import gc
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from common import emit, init

rank, world = init("gloo")
import compcoll  # noqa: E402
from compcoll import _C  # noqa: E402

STEPS = int(os.environ.get("STEPS", "5"))


def train(seed):
    """A fresh model of one architecture; its parameters' digest."""
    torch.manual_seed(seed)
    model = DDP(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1000 * seed + rank)
    for _ in range(STEPS):
        opt.zero_grad()
        model(torch.randn(16, 256, generator=data)).square().mean().backward()
        opt.step()
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


for seed in range(1, 1 + int(os.environ["MODELS"])):
    train(seed)
    gc.collect()  # the model and its buckets are freed
last = train(100)
digests = [None] * world
dist.all_gather_object(digests, last)
emit({"rank": rank, "last": last, "identical": len(set(digests)) == 1,
      "trace": [list(t) for t in _C.key_trace(compcoll.backend_of(dist.group.WORLD))]})
dist.destroy_process_group()
