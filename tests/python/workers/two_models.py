"""Two DDP models of one architecture, each with a comm hook that reduces a
fresh tensor every call, trained in backward passes of their own (see
compcoll/_ddp_hooks.py). Model A's training must not depend on model B's.

env: MODE  alone (only A trains; B is built and never used) | both (A and
           B take turns, one backward pass each per step)
     HOOK  fp16 (torch's fp16_compress_hook: its float16 copy is freed once
           the call is done) | fresh (a fresh float32 copy that the hook
           keeps until its next call, so two copies are alive at once)
     STEPS (default 8)
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from common import emit, init

rank, world = init("gloo")
import compcoll  # noqa: E402

MODE, HOOK = os.environ["MODE"], os.environ["HOOK"]
STEPS = int(os.environ.get("STEPS", "8"))


def fresh_copy_hook(kept, bucket):
    """Allreduces a new copy of the bucket and keeps it until the next call."""
    copy = bucket.buffer().clone()
    kept[bucket.index()] = copy
    fut = dist.all_reduce(copy, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(world))


def model(seed):
    torch.manual_seed(seed)
    m = DDP(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)))
    if HOOK == "fp16":
        m.register_comm_hook(None, default_hooks.fp16_compress_hook)
    else:
        m.register_comm_hook({}, fresh_copy_hook)
    return m


a, b = model(1), model(2)
opt_a = torch.optim.SGD(a.parameters(), lr=0.1)
opt_b = torch.optim.SGD(b.parameters(), lr=0.1)
data_a = torch.Generator().manual_seed(100 + rank)
data_b = torch.Generator().manual_seed(200 + rank)
for step in range(STEPS):
    trained = [(a, opt_a, data_a)] + ([(b, opt_b, data_b)] if MODE == "both" else [])
    for m, opt, data in trained:
        opt.zero_grad()
        m(torch.randn(16, 256, generator=data)).square().mean().backward()
        opt.step()
        # Every operation so far has run, and the backend's worker holds no
        # tensor of this step: the fp16 copy is freed before the next step
        # reduces its own. Otherwise whether it still is alive then depends
        # on timing, and with it the slot (docs/pytorch.md, "Liveness is
        # each process's own"), which is not what this compares.
        compcoll.stats()


def digest(m):
    h = hashlib.sha256()
    for p in m.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


digests = [None] * world
dist.all_gather_object(digests, digest(a))
group = dist.group.WORLD
emit({"rank": rank, "a": digest(a), "identical": len(set(digests)) == 1,
      "slots": compcoll.slots(group, "cpu"), "stats": compcoll.stats(group)})
dist.destroy_process_group()
