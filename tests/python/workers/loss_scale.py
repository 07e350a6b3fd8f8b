"""DDP under torch.amp.GradScaler as fp16 training meets it, on the CPU:
every parameter's gradient overflows, as a float16 one would, when an
element of it exceeds float16's largest value (a gradient hook makes it
infinite then). The scaler starts at its default 2^16, so the first steps
overflow and are skipped while it halves its scale, and it grows again
every GROWTH good steps, overflowing again now and then. The error-feedback
state must follow the scale (compcoll/_loss_scale.py): otherwise what it
kept from earlier steps comes back in the wrong unit.

env: STEPS (default 300), GROWTH (growth_interval, default 50), SCALER (0:
     the scaler disabled, for the same training without a loss scale)
RESULT {"rank", "finite", "scales": log2 of the scale after each step,
        "loss_first", "loss_last" (means of the first 20 and last 50 steps),
        "params": sha256 of the parameters, "loss_scale_changes" (compcoll's
        stats; -1 without compcoll)}
"""
import hashlib
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from common import emit, init

rank, world = init("gloo")
STEPS = int(os.environ.get("STEPS", "300"))
FP16_MAX = 65504.0


def overflow_like_fp16(grad):
    return grad if grad.abs().max() <= FP16_MAX else torch.full_like(grad, math.inf)

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
for p in net.parameters():
    p.register_hook(overflow_like_fp16)  # before DDP reduces the gradient
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16,
                              growth_interval=int(os.environ.get("GROWTH", "50")),
                              enabled=os.environ.get("SCALER", "1") == "1")
data = torch.Generator().manual_seed(rank)
teacher = torch.randn(64, 10, generator=torch.Generator().manual_seed(7))
scales, losses = [], []
for step in range(STEPS):
    x = torch.randn(32, 64, generator=data)
    y = (x @ teacher).argmax(1)
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    scales.append(math.log2(scaler.get_scale()) if scaler.is_enabled() else 0.0)
    losses.append(loss.item())

digest = hashlib.sha256()
for p in model.parameters():
    digest.update(p.detach().numpy().tobytes())
changes = -1
if os.environ.get("COMPCOLL_ALGO"):
    import compcoll
    changes = compcoll.stats()["loss_scale_changes"]
emit({"rank": rank, "finite": all(torch.isfinite(p).all().item() for p in model.parameters()),
      "scales": scales, "loss_first": sum(losses[:20]) / 20, "loss_last": sum(losses[-50:]) / 50,
      "params": digest.hexdigest(), "loss_scale_changes": changes})
dist.destroy_process_group()
