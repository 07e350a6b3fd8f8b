"""PyTorch's own DDP communication hooks over compcoll (see test_hooks.py).

The default group is plain Gloo (it carries the checks). For every hook of
TEST_HOOKS the same small model is trained TEST_STEPS steps over a Gloo
subgroup (the reference) and over one compcoll subgroup per algorithm of
TEST_ALGOS (COMPCOLL_ALGO is read when a group is created). Every run
reports its per-step losses and whether its parameters are bitwise equal on
every rank. TEST_BUCKET_MB (optional) caps DDP's buckets, for several
buckets per step; TEST_MOMENTUM sets SGD's momentum (0: none); TEST_GLOO_REFERENCE=0 skips the Gloo run (with several
buckets PowerSGD's callbacks race with the next bucket's allreduce on plain
Gloo, which then fails with a collective mismatch).
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from common import emit, init

STEPS = int(os.environ.get("TEST_STEPS", "6"))
BUCKET_MB = os.environ.get("TEST_BUCKET_MB")


def _patch_batched_orthogonalize():
    """torch 2.15's batched_powerSGD_hook hands _orthogonalize one 2-D
    matrix, which it rejects (it takes a batch: 3-D), on Gloo as anywhere.
    Give it the batch of one it expects (a view: orthogonalized in place)."""
    original = powerSGD_hook._orthogonalize

    def orthogonalize(matrices, epsilon=0):
        if matrices.dim() == 2:
            return original(matrices.unsqueeze(0), epsilon)
        return original(matrices, epsilon)

    powerSGD_hook._orthogonalize = orthogonalize


def _batched_hook_is_broken():
    try:
        powerSGD_hook._orthogonalize(torch.randn(4, 1))
    except AssertionError:
        return True
    return False


if _batched_hook_is_broken():
    _patch_batched_orthogonalize()


def make_hook(name, group):
    """(hook, state) for DDP.register_comm_hook."""
    if name in ("powerSGD", "batched_powerSGD"):
        # PowerSGD proper from the third step on (the first two are plain
        # allreduces, as the hook's own warm-up), with error feedback and
        # warm start: every step issues allreduces from future callbacks.
        state = powerSGD_hook.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2, min_compression_rate=1,
                                            random_seed=0)
        hook = (powerSGD_hook.powerSGD_hook if name == "powerSGD"
                else powerSGD_hook.batched_powerSGD_hook)
        return hook, state
    if name == "fp16_compress":
        return default_hooks.fp16_compress_hook, group
    if name == "allreduce":
        return default_hooks.allreduce_hook, group
    if name == "fresh_allreduce":
        # A hand-written hook that allreduces a new tensor and returns it:
        # DDP holds the returned tensor until the next step, so the previous
        # one is alive when the next is reduced (buffer_slots.h).
        def fresh_allreduce(pg, bucket):
            t = bucket.buffer() / pg.size()
            fut = dist.all_reduce(t, group=pg, async_op=True).get_future()
            return fut.then(lambda f: f.value()[0])
        return fresh_allreduce, group
    raise SystemExit(f"unknown hook {name}")


def train(group, hook_name, rank):
    torch.manual_seed(0)
    # 26,122 parameters: one DDP bucket of at least COMPCOLL_MIN_ELEMS (so
    # allreduce_hook and fp16_compress_hook allreduces are compressed); the
    # PowerSGD factors and the biases stay under it (exact dense path).
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 10))
    kwargs = {"bucket_cap_mb": float(BUCKET_MB)} if BUCKET_MB else {}
    ddp = DDP(model, process_group=group, **kwargs)
    hook, state = make_hook(hook_name, group)
    ddp.register_comm_hook(state, hook)
    # TEST_MOMENTUM: the optimizer's momentum (compcoll takes it over and
    # hands its own back, COMPCOLL_MOMENTUM_HANDOVER=auto).
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05,
                          momentum=float(os.environ.get("TEST_MOMENTUM", "0")))
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(STEPS):
        x = torch.randn(32, 64, generator=g)
        y = torch.randint(0, 10, (32,), generator=g)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    return losses, flat


def identical_everywhere(flat):
    """Bitwise equal on every rank (checked over the plain Gloo world group)."""
    world = dist.get_world_size()
    everyone = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(everyone, flat)
    return all(torch.equal(e, flat) for e in everyone)


def main():
    rank, _ = init("gloo")
    import compcoll  # noqa: F401  registers "compcoll"

    hooks = os.environ["TEST_HOOKS"].split(",")
    algos = os.environ["TEST_ALGOS"].split(",")
    out = {}
    for hook_name in hooks:
        runs, ref = {}, None
        if os.environ.get("TEST_GLOO_REFERENCE", "1") == "1":
            ref_group = dist.new_group(backend="gloo")
            t0 = time.monotonic()
            losses, ref = train(ref_group, hook_name, rank)
            runs["gloo"] = {"losses": losses, "identical": identical_everywhere(ref),
                            "seconds": time.monotonic() - t0}
            dist.destroy_process_group(ref_group)
        for algo in algos:
            os.environ["COMPCOLL_ALGO"] = algo
            group = dist.new_group(backend="compcoll")
            t0 = time.monotonic()
            losses, flat = train(group, hook_name, rank)
            st = compcoll.stats(group)
            runs[algo] = {"losses": losses, "identical": identical_everywhere(flat),
                          "equal_to_gloo": ref is not None and bool(torch.equal(flat, ref)),
                          "calls": st["calls"], "compressed_calls": st["compressed_calls"],
                          "slots": compcoll.slots(group),
                          "seconds": time.monotonic() - t0}
            dist.destroy_process_group(group)
        out[hook_name] = runs
        print(f"rank {rank}: {hook_name} done", file=sys.stderr, flush=True)
    emit(out)
    dist.destroy_process_group()


main()
