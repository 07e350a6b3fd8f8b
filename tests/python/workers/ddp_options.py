"""An ordinary DDP script under every DDP option that changes how gradients
reach the backend, with compression from the environment only (see
test_ddp.py): gradient_as_bucket_view (the grads are views into the
buckets compcoll reduces in place), static_graph, find_unused_parameters (a
branch that some steps leave unused), a small bucket cap (a bucket per weight,
rebuilt after the first step), no_sync gradient accumulation, and all of
them at once. Each variant trains a fresh model with SGD momentum on
per-rank batches; the RESULT line says, per variant, whether every rank
ends with the same parameters (so every allreduce gave every rank the same
bits), whether they are finite and moved, and how many of the variant's
allreduce calls compcoll compressed (0 would be a silent no-op)."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from common import emit, init

rank, world = init("gloo")  # COMPCOLL_ALGO in the environment makes it compcoll
import compcoll  # noqa: E402

STEPS = 6


class Net(nn.Module):
    """Two heads behind one trunk; the side head runs on even steps only, so
    with find_unused_parameters its parameters are unused every other step."""

    def __init__(self):
        super().__init__()
        # 1 MiB weights: DDP puts several in one bucket under its default
        # cap, each in a bucket of its own under a 0.25 MB cap.
        self.trunk = nn.Sequential(nn.Linear(256, 512), nn.ReLU(),
                                   *[m for _ in range(3) for m in (nn.Linear(512, 512), nn.ReLU())])
        self.head = nn.Linear(512, 10)
        self.side = nn.Linear(512, 10)

    def forward(self, x, use_side):
        h = self.trunk(x)
        out = self.head(h)
        return out + self.side(h) if use_side else out


VARIANTS = {
    "plain": {},
    "gradient_as_bucket_view": {"gradient_as_bucket_view": True},
    "static_graph": {"static_graph": True},
    "find_unused_parameters": {"find_unused_parameters": True},
    "small_buckets": {"bucket_cap_mb": 0.25},
    "no_sync_accumulation": {},
    "everything": {"gradient_as_bucket_view": True, "find_unused_parameters": True,
                   "bucket_cap_mb": 0.25},
}


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def same_on_every_rank(t):
    everyone = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(everyone, t)
    return all(torch.equal(everyone[0], x) for x in everyone)


out = {"rank": rank, "backend": dist.group.WORLD._get_backend(torch.device("cpu")).name()}
for name, kwargs in VARIANTS.items():
    torch.manual_seed(0)
    net = Net()
    start = flat_params(net).clone()
    model = DDP(net, **kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1000 + rank)
    side_every_step = name not in ("find_unused_parameters", "everything")
    before = compcoll.stats()
    for step in range(STEPS):
        opt.zero_grad()
        use_side = side_every_step or step % 2 == 0

        def batch_loss():
            x = torch.randn(16, 256, generator=g)
            y = torch.randint(0, 10, (16,), generator=g)
            return nn.functional.cross_entropy(model(x, use_side), y)

        if name == "no_sync_accumulation":
            with model.no_sync():  # the first micro-batch's grads stay local
                batch_loss().backward()
        batch_loss().backward()
        opt.step()
    after = compcoll.stats()
    final = flat_params(model.module)
    out[name] = {
        "buckets": len(str(model._get_ddp_logging_data().get("rebuilt_bucket_sizes", "")).split(",")),
        "same_on_every_rank": same_on_every_rank(final),
        "finite": bool(torch.isfinite(final).all()),
        "moved": bool(not torch.equal(final, start)),
        "calls": after["calls"] - before["calls"],
        "compressed_calls": after["compressed_calls"] - before["compressed_calls"],
    }
    del model, opt, net
emit(out)
dist.destroy_process_group()
