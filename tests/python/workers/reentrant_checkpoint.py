"""Two layers of one shape whose weight gradients are allreduced by tensor
hooks inside the backward pass (a fresh tensor each, compressed), SGD
momentum 0.9 handed over; CHECKPOINT=1 runs each layer under reentrant
activation checkpointing, whose backward is a nested autograd pass per
layer. Reports each step's reduced gradient sums (see test_hooks.py)."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.utils.checkpoint as checkpoint

from common import emit, init


def main():
    init("compcoll")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers = nn.ModuleList([nn.Linear(256, 256, bias=False) for _ in range(2)])

    def reduce(grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad

    for layer in layers:
        layer.weight.register_hook(reduce)
    opt = torch.optim.SGD(layers.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)
    nested = os.environ.get("CHECKPOINT") == "1"
    sums = []
    for _ in range(6):
        h = torch.randn(8, 256, generator=gen, requires_grad=True)
        for layer in layers:
            h = checkpoint.checkpoint(layer, h, use_reentrant=True) if nested else layer(h)
        opt.zero_grad()
        h.square().mean().backward()
        sums.append([float(layer.weight.grad.double().sum()) for layer in layers])
        opt.step()
    import compcoll
    emit({"sums": sums, "stats": compcoll.stats(None)})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
