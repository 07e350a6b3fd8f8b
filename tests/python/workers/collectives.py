"""Collective checks on a compcoll process group (see test_allreduce.py).

usage: collectives.py MODE OUT_DIR
  exact      every non-compressed path (and the dense algorithm) against a
             plain gloo group of the same ranks, bit for bit
  reference  STEPS allreduces of seeded tensors; inputs and outputs saved
             to OUT_DIR for comparison with compcoll's own algorithm
  async      many operations in flight at once, mixed compressed/delegated
  error      ranks disagree on the tensor size: the error reaches wait()

The default group is plain gloo (run with TORCH_DEVICE_BACKEND_AUTOLOAD=0);
exact and reference build one compcoll group per algorithm of TEST_ALGOS
(COMPCOLL_ALGO is read when a group is created).
"""
import os
import sys

import torch
import torch.distributed as dist

from common import cpu_backend_name, emit, init

MODE, OUT = sys.argv[1], sys.argv[2]
rank, world = init("gloo")
import compcoll  # noqa: E402

GLOO = dist.group.WORLD

gen = torch.Generator().manual_seed(1000 + rank)


def rnd(n, dtype=torch.float32):
    return (torch.randn(n, generator=gen) * (rank + 1)).to(dtype)


def compcoll_group(algo):
    os.environ["COMPCOLL_ALGO"] = algo
    group = dist.new_group(backend="compcoll")
    assert cpu_backend_name(group) == "compcoll"
    return group


def both(fn):
    """Runs fn(group) on the compcoll group and on a plain gloo group with
    the same inputs; returns both outputs."""
    return fn(CC), fn(GLOO)


def check_exact(algo):
    results = {}

    def record(name, a, b):
        same = all(torch.equal(x, y) for x, y in zip(a, b)) if isinstance(a, list) else torch.equal(a, b)
        results[name] = bool(same)

    big = rnd(100_003)
    small = rnd(1000)
    half = rnd(2000, torch.float16)
    ints = torch.arange(50_000, dtype=torch.int64) * (rank + 1)
    dbl = rnd(30_000, torch.float64)

    def ar(t, op=dist.ReduceOp.SUM):
        def f(group):
            x = t.clone()
            dist.all_reduce(x, op=op, group=group)
            return x
        return f

    if algo == "dense":
        record("allreduce_big_dense", *both(ar(big)))
    record("allreduce_small", *both(ar(small)))
    record("allreduce_half_small", *both(ar(half)))
    record("allreduce_int64", *both(ar(ints)))
    record("allreduce_float64", *both(ar(dbl)))
    record("allreduce_max", *both(ar(big, dist.ReduceOp.MAX)))
    record("allreduce_min", *both(ar(small, dist.ReduceOp.MIN)))

    def bcast(group):
        x = rnd(70_000) if rank == 1 else torch.zeros(70_000)
        dist.broadcast(x, src=1, group=group)
        return x
    gen_state = gen.get_state()  # same broadcast content in both runs
    a = bcast(None)
    gen.set_state(gen_state)
    b = bcast(GLOO)
    record("broadcast", a, b)

    def allgather(group):
        out = [torch.zeros(20_000) for _ in range(world)]
        dist.all_gather(out, small.repeat(20), group=group)
        return out
    record("all_gather", *both(allgather))

    def allgather_into(group):
        out = torch.zeros(world * 20_000)
        dist.all_gather_into_tensor(out, small.repeat(20), group=group)
        return out
    record("all_gather_into_tensor", *both(allgather_into))

    def reduce_scatter(group):
        out = torch.zeros(20_000)
        dist.reduce_scatter_tensor(out, big[: world * 20_000].contiguous(), group=group)
        return out
    record("reduce_scatter_tensor", *both(reduce_scatter))

    def alltoall(group):
        in_splits = [(rank + j) % 3 + 1 for j in range(world)]
        out_splits = [(j + rank) % 3 + 1 for j in range(world)]
        x = torch.arange(sum(in_splits), dtype=torch.float32) + 100 * rank
        out = torch.zeros(sum(out_splits))
        dist.all_to_all_single(out, x, out_splits, in_splits, group=group)
        return out
    record("all_to_all_single", *both(alltoall))

    def gather(group):
        dst = 0
        out = [torch.zeros(1000) for _ in range(world)] if rank == dst else None
        dist.gather(small, out, dst=dst, group=group)
        return out if rank == dst else [small]
    record("gather", *both(gather))

    def scatter(group):
        out = torch.zeros(1000)
        src = [torch.full((1000,), float(j)) for j in range(world)] if rank == 0 else None
        dist.scatter(out, src, src=0, group=group)
        return out
    record("scatter", *both(scatter))

    def reduce(group):
        x = small.clone()
        dist.reduce(x, dst=0, group=group)
        return x
    record("reduce", *both(reduce))

    def sendrecv(group):
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        out = torch.zeros(5000)
        reqs = [dist.isend(small.repeat(5), nxt, group=group), dist.irecv(out, prv, group=group)]
        for r in reqs:
            r.wait()
        return out
    record("send_recv", *both(sendrecv))

    def objects(group):
        out = [None] * world
        dist.all_gather_object(out, {"rank": rank, "v": [rank] * 3}, group=group)
        return torch.tensor([o["rank"] for o in out])
    record("all_gather_object", *both(objects))

    dist.barrier(group=CC)
    return results


def run_reference(algo):
    steps = int(os.environ["TEST_STEPS"])
    n = int(os.environ["TEST_COUNT"])
    average = os.environ.get("TEST_AVG") == "1"
    ins, outs = [], []
    buf = torch.empty(n)  # one persistent buffer, like a DDP bucket: one error-feedback state
    for step in range(steps):
        g = torch.Generator().manual_seed(10_000 * step + rank)
        x = torch.randn(n, generator=g) * (1 + step) + 0.01 * rank
        ins.append(x)
        buf.copy_(x)
        dist.all_reduce(buf, op=dist.ReduceOp.AVG if average else dist.ReduceOp.SUM, group=CC)
        outs.append(buf.clone())
    torch.save({"inputs": ins, "outputs": outs}, os.path.join(OUT, f"{algo}-rank{rank}.pt"))
    return {"stats": compcoll.stats(CC)}


def run_async(algo):
    """Issues everything before waiting for anything; the order of issue is
    the same on every rank, the order of completion is not."""
    works, expect = [], []
    # A compressed allreduce returns at once; it runs on the backend's worker.
    first = rnd(2_000_000)
    w0 = dist.all_reduce(first, async_op=True, group=CC)
    returned_before_done = not w0.is_completed()
    w0.wait()
    comp = [rnd(60_000) for _ in range(4)]
    for i, t in enumerate(comp):
        works.append(dist.all_reduce(t, async_op=True, group=CC))
        b = torch.full((1000,), float(rank))
        works.append(dist.broadcast(b, src=i % world, async_op=True, group=CC))
        expect.append(("bcast", b, float(i % world)))
        s = torch.ones(100) * (rank + 1)
        works.append(dist.all_reduce(s, async_op=True, group=CC))
        expect.append(("small", s, float(sum(range(1, world + 1)))))
        out = [torch.zeros(10) for _ in range(world)]
        works.append(dist.all_gather(out, torch.full((10,), float(rank)), async_op=True, group=CC))
        expect.append(("gather", out, None))
    futs = [w.get_future() for w in works[:1]]
    for w in works:
        w.wait()
    torch.futures.wait_all(futs)
    ok = True
    for kind, t, v in expect:
        if kind == "gather":
            ok &= all(torch.equal(o, torch.full((10,), float(j))) for j, o in enumerate(t))
        else:
            ok &= bool(torch.all(t == v))
    # Compressed results must be identical on every rank.
    sums = torch.stack([t.double().sum() for t in comp])
    gathered = [torch.zeros_like(sums) for _ in range(world)]
    dist.all_gather(gathered, sums)
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    return {"delegated_ok": bool(ok), "compressed_identical": bool(same),
            "returned_before_done": returned_before_done,
            "stats": compcoll.stats(CC)}


def run_error(algo):
    n = 20_000 if rank == 0 else 40_000  # rank 0 receives indices it cannot hold
    x = rnd(n)
    work = dist.all_reduce(x, async_op=True, group=CC)
    err = None
    try:
        work.wait()
    except Exception as e:  # noqa: BLE001
        err = str(e)
    fut_err = None
    if err is not None:
        try:
            work.get_future().wait()
        except Exception as e:  # noqa: BLE001
            fut_err = str(e)
    later = None
    if err is not None:
        try:
            dist.all_reduce(rnd(n), group=CC)
        except Exception as e:  # noqa: BLE001
            later = str(e)
    return {"error": err, "future_error": fut_err, "later_error": later}


RUNS = {"exact": check_exact, "reference": run_reference, "async": run_async, "error": run_error}
out = {"rank": rank}
for algo in os.environ["TEST_ALGOS"].split(","):
    CC = compcoll_group(algo)
    result = RUNS[MODE](algo)
    result["cpu_backend"] = cpu_backend_name(CC)
    result["gloo_backend"] = cpu_backend_name(GLOO)
    out[algo] = result
    if MODE == "error":  # the failed communicator cannot take part in more
        emit(out)
        sys.exit(0)
    dist.destroy_process_group(CC)
emit(out)
dist.destroy_process_group()
