"""Which allreduces compcoll compresses under COMPCOLL_TORCH_SCOPE (an
unmodified "gloo" script; COMPCOLL_ALGO from the environment). Each phase
reports how many compressed calls it added (compcoll.stats), and the
direct phases whether their result is the exact sum:

  direct        dist.all_reduce of 100,000 floats outside backward, as a
                script averaging parameters or evaluation results would;
  chained       the same issued async with a then() callback that
                allreduces another 100,000 floats;
  ddp           3 DDP steps (2 buckets' allreduces per step, in backward);
  hook_chain    3 DDP steps under a comm hook that chains a second
                allreduce of 100,000 floats on its bucket's future;
  in_backward   an autograd Function that allreduces its gradient in
                backward (as tensor-parallel layers do), 3 steps;
  in_backward_marked  the same on a group the script marked with
                compcoll.mark_tensor_parallel: exact;
  averaging     on a new group, 3 DDP steps (compressed), then the model's
                parameters allreduced outside backward, as periodic model
                averaging does: exact, and rank 0's note about it an INFO
                line, not a warning (the group compresses its gradients);
  delegated_chain  in backward, an async broadcast whose then() callback
                allreduces 100,000 floats, run on Gloo's thread on rank 0
                and at once on the backward thread on rank 1;
  scoped        the direct allreduce inside compcoll.gradient_scope()
                (with a nested scope before it), then one after the scope
                (left once more by an exception);
  join          DDP under Join with uneven inputs and SGD with momentum
                (the process's first optimizer steps, so the group agrees
                on the momentum then): rank r trains 4r steps, so rank 0
                shadows every backward pass and step of the others from
                the start; reports the compressed calls, whether the
                replicas end equal and the momentum the group took over;
  join_two_optimizers  the same on a new group, with two optimizers
                stepped one after the other each iteration.
"""
import datetime
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

import compcoll
from common import emit

torch.set_num_threads(1)
# A route that differs between ranks waits for the group's timeout: fail in a minute.
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
N = 100_000
out = {}


def compressed():
    return compcoll.stats()["compressed_calls"]


def exact_sum(t):
    # Every rank holds rank + 1: the exact sum is the same in every entry.
    return bool(torch.all(t == sum(range(1, world + 1))))


before = compressed()
t = torch.full((N,), rank + 1.0)
dist.all_reduce(t)
out["direct"] = {"compressed": compressed() - before, "exact": exact_sum(t)}

before = compressed()
second = torch.full((N,), rank + 1.0)


def then(fut):
    dist.all_reduce(second)
    return fut.value()


t = torch.full((N,), rank + 1.0)
dist.all_reduce(t, async_op=True).get_future().then(then).wait()
out["chained"] = {"compressed": compressed() - before, "exact": exact_sum(t) and exact_sum(second)}


def model():
    torch.manual_seed(0)
    # 2 buckets of at least 16,384 elements (bucket_cap_mb 0.25 = 65,536 floats).
    return nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))


def train(m, steps=3):
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        m(torch.randn(8, 256, generator=g)).square().mean().backward()


before = compressed()
train(DDP(model(), bucket_cap_mb=0.25))
out["ddp"] = {"compressed": compressed() - before}

extra = torch.zeros(N)


def chaining_hook(_state, bucket):
    def again(fut):
        extra.fill_(rank + 1.0)
        dist.all_reduce(extra)
        return fut.value()[0]
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(again)


before = compressed()
m = DDP(model(), bucket_cap_mb=0.25)
m.register_comm_hook(None, chaining_hook)
train(m)
out["hook_chain"] = {"compressed": compressed() - before}


class AllreduceGrad(torch.autograd.Function):
    """Identity in forward; allreduces its gradient over group in backward."""

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


before = compressed()
w = torch.ones(N, requires_grad=True)
for _ in range(3):
    AllreduceGrad.apply(w * (rank + 1.0)).sum().backward()
out["in_backward"] = {"compressed": compressed() - before}

# The same on a group marked as carrying tensor parallelism (a Megatron-style
# layer of the script's own): exact, in backward too.
tp = dist.new_group(list(range(world)))
marked = compcoll.mark_tensor_parallel(tp)
w = torch.full((N,), 0.1, requires_grad=True)
for _ in range(3):
    w.grad = None
    AllreduceGrad.apply(w * (rank + 1.0), tp).sum().backward()
want = (rank + 1.0) * world  # ones allreduced, times d(w (r + 1))/dw
tp_stats = compcoll.stats(tp)
out["in_backward_marked"] = {"marked": marked, "calls": tp_stats["calls"],
                             "compressed": tp_stats["compressed_calls"],
                             "exact": bool(torch.equal(w.grad, torch.full((N,), want)))}

# Model averaging beside compressed DDP (PostLocalSGD's averager, say): the
# parameters, equal on every rank here, allreduced after the DDP steps.
avg = dist.new_group(list(range(world)))
m = DDP(model(), bucket_cap_mb=0.25, process_group=avg)
train(m)
ddp_compressed = compcoll.stats(avg)["compressed_calls"]
params = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
summed = params.clone()
dist.all_reduce(summed, group=avg)
out["averaging"] = {"ddp_compressed": ddp_compressed,
                    "compressed": compcoll.stats(avg)["compressed_calls"] - ddp_compressed,
                    "exact": bool(torch.equal(summed, params * world))}

chained = torch.zeros(N)
chained_works = []


class BroadcastThenAllreduce(torch.autograd.Function):
    """In backward: an async broadcast (delegated, issued straight to Gloo)
    with a then() callback that allreduces 100,000 floats. Rank 1 attaches
    the callback late, after the broadcast has completed, so it runs at once
    on the backward thread; rank 0 attaches it at once, so it runs on
    Gloo's thread. Both must judge the allreduce alike."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        flag = torch.zeros(1)
        work = dist.broadcast(flag, src=0, async_op=True)
        if rank == 1:
            work.wait()
            time.sleep(0.2)

        def allreduce_next(fut):
            chained.fill_(rank + 1.0)
            chained_works.append(dist.all_reduce(chained, async_op=True))
            return fut.value()
        chained_works.append(work.get_future().then(allreduce_next))
        return grad


before = compressed()
w = torch.ones(8, requires_grad=True)
BroadcastThenAllreduce.apply(w * 2.0).sum().backward()
deadline = time.monotonic() + 30
while len(chained_works) < 2 and time.monotonic() < deadline:
    time.sleep(0.01)
for x in list(chained_works):
    x.wait()
out["delegated_chain"] = {"compressed": compressed() - before}

before = compressed()
t = torch.full((N,), rank + 1.0)
with compcoll.gradient_scope():
    with compcoll.gradient_scope():  # scopes nest
        pass
    dist.all_reduce(t)
try:
    with compcoll.gradient_scope():
        raise KeyError("left by an exception")
except KeyError:
    pass
inside = compressed() - before
t = torch.full((N,), rank + 1.0)
dist.all_reduce(t)  # after the scope: as before it
out["scoped"] = {"compressed": inside, "after": compressed() - before - inside,
                 "after_exact": exact_sum(t)}

before = compressed()
m = DDP(model(), bucket_cap_mb=0.25)
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
g = torch.Generator().manual_seed(rank)
with Join([m]):
    for _ in range(4 * rank):
        opt.zero_grad()
        m(torch.randn(8, 256, generator=g)).square().mean().backward()
        opt.step()
flat = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
replicas = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(replicas, flat)
out["join"] = {"compressed": compressed() - before,
               "replicas_equal": all(torch.equal(replicas[0], x) for x in replicas),
               "optimizer_momentum": round(compcoll.stats()["optimizer_momentum"], 6)}
# The same with two optimizers stepped one after the other each iteration,
# on a group of its own (so that it agrees on the momentum afresh).
group = dist.new_group(list(range(world)))
m = DDP(model(), bucket_cap_mb=0.25, process_group=group)
opts = [torch.optim.SGD(m.module[0].parameters(), lr=0.01, momentum=0.9),
        torch.optim.SGD(m.module[2].parameters(), lr=0.01, momentum=0.9)]
g = torch.Generator().manual_seed(rank)
with Join([m]):
    for _ in range(4 * rank):
        m(torch.randn(8, 256, generator=g)).square().mean().backward()
        for o in opts:
            o.step()
            o.zero_grad()
flat = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
replicas = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(replicas, flat, group=group)
out["join_two_optimizers"] = {
    "replicas_equal": all(torch.equal(replicas[0], x) for x in replicas),
    "optimizer_momentum": round(compcoll.stats(group)["optimizer_momentum"], 6)}
emit(out)
dist.destroy_process_group()
