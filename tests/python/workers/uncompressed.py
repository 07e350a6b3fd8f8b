"""Gradient-like sums compcoll cannot compress, under COMPCOLL_ALGO (see
test_hooks.py): a float64 DDP model, a non-contiguous view reduced in place,
a DDP model whose embedding has sparse gradients, an all_reduce_coalesced
of float tensors, each several times; and reductions that are not gradient sums (int64,
MAX, fewer than COMPCOLL_MIN_ELEMS elements), which must pass without a
word. The RESULT line says what the stats counted and whether every
reduction gave the exact sum on every rank."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from common import emit, init

rank, world = init("gloo")  # COMPCOLL_ALGO in the environment makes it compcoll
import compcoll  # noqa: E402

out = {"rank": rank, "backend": dist.group.WORLD._get_backend(torch.device("cpu")).name()}
g = torch.Generator().manual_seed(rank)
before = compcoll.stats()

# A float64 model: every bucket is float64.
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256)).double())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(8, 128, dtype=torch.float64, generator=g)).sum().backward()
    opt.step()

# A sparse embedding: its gradient is a sparse COO tensor of 20000 x 8
# elements.
torch.manual_seed(0)
sparse_model = DDP(nn.Sequential(nn.EmbeddingBag(20_000, 8, mode="sum", sparse=True)))
sparse_opt = torch.optim.SGD(sparse_model.parameters(), lr=0.01)
for _ in range(3):
    sparse_opt.zero_grad()
    sparse_model(torch.randint(0, 20_000, (8, 4), generator=g)).sum().backward()
    sparse_opt.step()
# Every rank holds the same embedding: the sparse gradients were summed exactly.
weights = [torch.zeros_like(sparse_model.module[0].weight) for _ in range(world)]
dist.all_gather(weights, sparse_model.module[0].weight.detach())
sparse_same = all(torch.equal(w, weights[0]) for w in weights)


def exact_everywhere(make, op=dist.ReduceOp.SUM):
    """all_reduce(make()) in place; every rank's result equals the exact
    reduction of every rank's input (each rank rebuilds them all)."""
    mine = make(torch.Generator().manual_seed(100 + rank))
    dist.all_reduce(mine, op=op)
    inputs = [make(torch.Generator().manual_seed(100 + r)) for r in range(world)]
    want = inputs[0].clone()
    for x in inputs[1:]:
        want = want + x if op == dist.ReduceOp.SUM else torch.maximum(want, x)
    return bool(torch.equal(mine, want)) if world == 2 else bool(torch.allclose(mine, want))


checks = []
for _ in range(3):  # a transposed view, reduced in place
    checks.append(exact_everywhere(lambda gen: torch.randn(300, 200, generator=gen).t()))
# all_reduce_coalesced of two float32 tensors (as a comm hook reducing its
# bucket with it would), twice: Gloo's, said once.
for _ in range(2):
    pair = [torch.full((30_000,), rank + 1.0), torch.full((20_000,), 2.0 * rank)]
    dist.all_reduce_coalesced(pair)
    checks.append(bool(torch.equal(pair[0], torch.full((30_000,), world * (world + 1) / 2.0))))
checks.append(exact_everywhere(lambda gen: torch.randint(0, 9, (100_000,), generator=gen)))
checks.append(exact_everywhere(lambda gen: torch.randn(100_000, generator=gen),
                               op=dist.ReduceOp.MAX))
checks.append(exact_everywhere(lambda gen: torch.randn(10, dtype=torch.float64, generator=gen)))
after = compcoll.stats()
out["exact"] = all(checks) and sparse_same
out["calls"] = after["calls"] - before["calls"]
emit(out)
dist.destroy_process_group()
