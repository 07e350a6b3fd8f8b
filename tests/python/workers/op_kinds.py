"""The kinds of operation the reliability workers issue on a compcoll group,
each from fresh tensors: the compressed and the exact allreduce, and the
operations the backend delegates to its inner backend."""
import torch
import torch.distributed as dist

DELEGATED = ("all_reduce float64 (delegated)", "broadcast", "all_gather", "all_gather_into_tensor",
             "reduce_scatter_tensor", "all_to_all_single", "reduce", "irecv")


def op_kinds(rank, world, compcoll, n=50_000):
    """name -> make(); make() returns (the tensors rank 0 watches, a
    function issuing the op async). DELEGATED names those the backend hands
    to its inner backend as they are."""
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
