"""Allreduces issued in a backward pass that sum activations or their
gradients, not parameters' gradients (see test_scope.py), under COMPCOLL_ALGO
from the environment. A layer centres its 20,000 activations on their mean
over the ranks: an allreduce in forward. TEST_MODE:

  checkpoint            the layer inside torch.utils.checkpoint
                        (use_reentrant=False): backward recomputes its
                        forward, allreduce included, inside an autograd node;
  checkpoint_reentrant  the same with use_reentrant=True;
  checkpoint_in_function  non-reentrant, the region ending in a Function
                        of the script's own that saves its input, so the
                        recomputation runs inside that Function's node;
  differentiable        the mean through torch.distributed.nn.functional.
                        all_reduce, whose backward allreduces the mean's
                        gradient.

Without DDP (only these allreduces run) and then with DDP around the same
model (its bucket is a gradient sum). The RESULT line has each run's
compressed calls and whether its gradients equal those of the same model
with the allreduces exact by construction (no checkpoint; for
differentiable, the mean's gradient summed by an all_gather)."""
import os

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnnf
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from common import emit, init

rank, world = init("gloo")
import compcoll  # noqa: E402

MODE = os.environ["TEST_MODE"]
F = 20_000
STEPS = 3


class ExactAllreduce(torch.autograd.Function):
    """The reference: sum over ranks in forward and backward by all_gather
    (never compressed)."""

    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x.contiguous())
        return torch.stack(parts).sum(0)

    @staticmethod
    def backward(ctx, g):
        parts = [torch.empty_like(g) for _ in range(world)]
        dist.all_gather(parts, g.contiguous())
        return torch.stack(parts).sum(0)


class Doubled(torch.autograd.Function):
    """A Function of the script's own that saves its input: the first
    saved tensor a checkpointed region's backward unpacks."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2 + 0 * x


class Centre(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.how = how

    def forward(self, x):
        if self.how == "differentiable":
            return x - dnnf.all_reduce(x.mean(0)) / world
        if self.how == "reference_differentiable":
            return x - ExactAllreduce.apply(x.mean(0)) / world
        with torch.no_grad():
            m = x.mean(0).contiguous()
            dist.all_reduce(m)
        return x - m / world


class Model(nn.Module):
    def __init__(self, how, wrap):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(16, F)
        self.centre = Centre(how)
        self.b = nn.Linear(F, 1)
        self.wrap = wrap

    def block(self, x):
        h = torch.tanh(self.centre(self.a(x)))
        return Doubled.apply(h) if MODE == "checkpoint_in_function" else h

    def forward(self, x):
        if self.wrap in ("checkpoint", "checkpoint_in_function"):
            h = checkpoint(self.block, x, use_reentrant=False)
        elif self.wrap == "checkpoint_reentrant":
            h = checkpoint(self.block, x, use_reentrant=True)
        else:
            h = self.block(x)
        return self.b(h)


def run(how, wrap, ddp):
    model = Model(how, wrap)
    net = DDP(model) if ddp else model
    before = compcoll.stats()["compressed_calls"]
    grads = []
    for step in range(STEPS):
        net.zero_grad()
        g = torch.Generator().manual_seed(10 * step + rank)
        x = torch.randn(8, 16, generator=g, requires_grad=wrap == "checkpoint_reentrant")
        net(x).pow(2).mean().backward()
        grads.append(model.a.weight.grad.clone())
    return compcoll.stats()["compressed_calls"] - before, grads


out = {}
for ddp in (False, True):
    if MODE == "differentiable":
        compressed, grads = run("differentiable", "none", ddp)
        _, want = run("reference_differentiable", "none", ddp)
    else:
        compressed, grads = run("plain", MODE, ddp)
        _, want = run("plain", "none", ddp)
    out["ddp" if ddp else "alone"] = {
        "compressed": compressed,
        "exact": all(torch.equal(a, b) for a, b in zip(grads, want)) if not ddp else None,
        "steps": STEPS}
emit(out)
dist.destroy_process_group()
