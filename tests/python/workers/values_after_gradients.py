"""A DDP model's compressed gradient sums, then allreduces of values outside
backward that compcoll could not compress in any case (a float64 histogram,
a non-contiguous view): see test_hooks.py. The RESULT line says whether DDP
compressed and whether the value sums were exact on every rank."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from common import emit, init

rank, world = init("gloo")  # COMPCOLL_ALGO in the environment makes it compcoll
import compcoll  # noqa: E402

torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(rank)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(8, 256, generator=g)).sum().backward()
    opt.step()
compressed = compcoll.stats()["compressed_calls"]

histogram = torch.full((20_000,), float(rank + 1), dtype=torch.float64)
dist.all_reduce(histogram)
matrix = torch.full((200, 300), float(rank + 1))
view = matrix.t()
dist.all_reduce(view)
want = float(sum(range(1, world + 1)))
emit({"rank": rank, "compressed": compressed,
      "exact": bool((histogram == want).all()) and bool((matrix == want).all())})
dist.destroy_process_group()
