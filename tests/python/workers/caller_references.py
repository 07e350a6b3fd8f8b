"""While an operation is in flight, the backend holds no reference to the
caller's tensors: its worker and the inner backend work on aliases
(integration/pytorch/csrc/python_free.h). A thread other than the caller's
that dropped a reference to a Python-visible tensor would have to take the
GIL, and one that does so while the interpreter finalizes aborts the
process ("terminate called without an active exception").

Rank 1 joins every operation 0.3 s late, so that rank 0 counts the
references of its tensors (Tensor._use_count: 1 is the Python object's
own) while the operation is in flight, and again after wait().

RESULT {"counts": {op: [[before...], [during...], [after...]]}, "ok": {op: bool}}
on rank 0; rank 1 prints {"rank": 1}.
"""
import time

import torch
import torch.distributed as dist

from common import emit, init

rank, world = init("gloo")
import compcoll  # noqa: E402

LATE_S = 0.3


def ops():
    """name -> (the tensors rank 0 watches, a function issuing the op async)."""
    n = 50_000
    x = torch.full((n,), float(rank + 1))
    out = {}

    def allreduce_compressed():
        t = torch.randn(n)
        def issue():
            with compcoll.gradient_scope():
                return dist.all_reduce(t, async_op=True)
        return [t], issue
    out["all_reduce (compressed)"] = allreduce_compressed

    def allreduce_exact():
        t = x.clone()
        return [t], lambda: dist.all_reduce(t, async_op=True)
    out["all_reduce (exact, outside backward)"] = allreduce_exact

    def allreduce_float64():
        t = x.double()
        return [t], lambda: dist.all_reduce(t, async_op=True)
    out["all_reduce float64 (delegated)"] = allreduce_float64

    def broadcast():
        t = x.clone()
        return [t], lambda: dist.broadcast(t, src=1, async_op=True)
    out["broadcast"] = broadcast

    def all_gather():
        outs = [torch.empty(n) for _ in range(world)]
        t = x.clone()
        return [t] + outs, lambda: dist.all_gather(outs, t, async_op=True)
    out["all_gather"] = all_gather

    def all_gather_into_tensor():
        o, t = torch.empty(n * world), x.clone()
        return [o, t], lambda: dist.all_gather_into_tensor(o, t, async_op=True)
    out["all_gather_into_tensor"] = all_gather_into_tensor

    def reduce_scatter_tensor():
        o, t = torch.empty(n), torch.ones(n * world)
        return [o, t], lambda: dist.reduce_scatter_tensor(o, t, async_op=True)
    out["reduce_scatter_tensor"] = reduce_scatter_tensor

    def all_to_all_single():
        o, t = torch.empty(n * world), torch.ones(n * world)
        return [o, t], lambda: dist.all_to_all_single(o, t, async_op=True)
    out["all_to_all_single"] = all_to_all_single

    def reduce():
        t = x.clone()
        return [t], lambda: dist.reduce(t, dst=0, async_op=True)
    out["reduce"] = reduce

    def recv():
        t = torch.empty(n)
        if rank == 0:
            return [t], lambda: dist.irecv(t, src=1)
        return [t], lambda: dist.isend(x, dst=0)
    out["irecv"] = recv
    return out


counts, ok = {}, {}
for name, make in ops().items():
    watched, issue = make()
    dist.barrier()
    if rank == 1:
        time.sleep(LATE_S)
    before = [t._use_count() for t in watched]
    work = issue()
    during = [t._use_count() for t in watched]
    late = not work.is_completed()
    work.wait()
    del work
    after = [t._use_count() for t in watched]
    counts[name] = [before, during, after]
    # In flight on rank 0 (rank 1 is late), and nothing beyond the Python
    # object's own reference, then or after.
    ok[name] = (late or rank == 1) and before == during == after == [1] * len(watched)

dist.barrier()
emit({"rank": rank, "counts": counts, "ok": ok})
dist.destroy_process_group()
