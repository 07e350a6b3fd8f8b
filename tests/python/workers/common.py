"""What every test worker shares: process-group setup from torchrun-style
environment variables, and the RESULT line the tests parse."""
import json
import os

import torch
import torch.distributed as dist


def init(backend):
    torch.set_num_threads(1)
    if backend == "compcoll":
        import compcoll  # noqa: F401  registers the backend
    dist.init_process_group(backend, init_method="env://")
    return dist.get_rank(), dist.get_world_size()


def cpu_backend_name(group=None):
    pg = group if group is not None else dist.group.WORLD
    return pg._get_backend(torch.device("cpu")).name()


def emit(obj):
    print("RESULT " + json.dumps(obj), flush=True)


def rank_env(name, default=None):
    return os.environ.get(name, default)


def train_square_loss(model, steps, features, lr, seed):
    """steps of SGD on the mean square of the model's output for random
    batches of 8 x features (this rank's own stream: seed)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, features, generator=g)).square().mean().backward()
        opt.step()


def train_regression(model, steps, seed, lr=0.01):
    """steps of SGD fitting the model's one output to the first of 64 random
    features (batches of 16, this rank's own stream: seed); the losses."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        x = torch.randn(16, 64, generator=g)
        loss = (model(x) - x[:, :1]).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def parameters_identical(model, world):
    """Whether every rank holds the same parameters, bit for bit, and
    whether they are all finite: (identical, finite)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    return all(torch.equal(gathered[0], t) for t in gathered), bool(torch.isfinite(flat).all())
