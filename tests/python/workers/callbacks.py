"""Collectives issued from future callbacks, and the worker's deadlines
(see test_callbacks.py).

usage: callbacks.py MODE
  chains  for every algorithm of TEST_ALGOS and every lane of TEST_LANES
          ("cpu"; "staged_cpu", the device lane's path on cpu tensors): a
          compcoll subgroup; future callbacks that issue and wait for a
          compressed, a dense and a delegated allreduce and an all_gather,
          nested callbacks, and operations the main thread submits while the
          callbacks run. Reports the values and whether they are equal on
          every rank.
  wedge   COMPCOLL_ALGO from the environment on the default group, with a
          TEST_TIMEOUT_S timeout. Rank 0's worker is wedged by a future
          callback that blocks; then every rank runs one allreduce and
          reports how long it took to fail and with what.
"""
import faulthandler
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from common import emit

MODE = sys.argv[1]
torch.set_num_threads(1)
# A hang shows where every thread is, before the test's deadline kills us.
faulthandler.dump_traceback_later(float(os.environ.get("TEST_DUMP_AFTER_S", "240")), exit=True)
BIG = 20_000  # at least COMPCOLL_MIN_ELEMS: compressed (unless dense)


def equal_everywhere(t, world_group=None):
    mine = t.detach().clone().flatten().float()
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine, group=world_group)
    return all(torch.equal(e, mine) for e in everyone)


def chain_round(group, rank, world, step, concurrent):
    """One round of collectives from callbacks; returns (checks, tensors to
    compare across ranks). concurrent: the main thread submits an operation
    while the callbacks may be running."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    first = torch.randn(BIG, generator=g)
    big = torch.randn(BIG, generator=g)
    small = torch.full((100,), float(rank + 1))
    ints = torch.arange(100, dtype=torch.int64) * (rank + 1)
    gathered = [torch.empty(3) for _ in range(world)]
    seen = {}

    def inner_cb(fut):
        # A callback of an operation issued from a callback. It issues
        # nothing itself: where the outer callback runs on one of Gloo's two
        # threads (delegated operations issued directly), a second blocking
        # level would hold both, which hangs plain Gloo too.
        seen["inner_thread"] = threading.current_thread().name
        return fut.value()[0] + float(world)

    def cb(fut):
        seen["cb_thread"] = threading.current_thread().name
        a = dist.all_reduce(big, group=group, async_op=True).get_future().wait()[0]
        w = dist.all_reduce(small, group=group, async_op=True)
        w.wait()
        c = dist.all_reduce(ints, group=group, async_op=True).get_future().wait()[0]
        dist.all_gather(gathered, torch.full((3,), float(rank)), group=group)
        nested = (dist.all_reduce(torch.ones(5), group=group, async_op=True).get_future()
                  .then(inner_cb).wait())
        return [fut.value()[0], a, c, nested]

    work = dist.all_reduce(first, group=group, async_op=True)
    fut = work.get_future().then(cb)
    after = torch.full((BIG,), 0.5)
    if concurrent:
        # Submitted while the callbacks may be running: after them on every
        # rank (the callback was attached before this was submitted).
        w_after = dist.all_reduce(after, group=group, async_op=True)
    res = fut.wait()
    if not concurrent:
        w_after = dist.all_reduce(after, group=group, async_op=True)
    w_after.wait()
    n = world * (world + 1) / 2
    checks = {
        "dense_exact": bool(torch.all(small == n)),
        "delegated_exact": bool(torch.equal(res[2], torch.arange(100, dtype=torch.int64) * int(n))),
        "gather_exact": all(bool(torch.all(gathered[r] == r)) for r in range(world)),
        "nested_exact": bool(torch.all(res[3] == world + world)),
    }
    return checks, [res[0], res[1], after], seen


def chains():
    dist.init_process_group("gloo", init_method="env://")
    import compcoll
    from compcoll import _backend

    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for lane in os.environ["TEST_LANES"].split(","):
        _backend._TEST_STAGED_CPU = lane == "staged_cpu"
        for algo in os.environ["TEST_ALGOS"].split(","):
            os.environ["COMPCOLL_ALGO"] = algo
            group = dist.new_group(backend="compcoll")
            res = {"checks": {}, "identical": True, "threads": set()}
            # The staged lane hands what it keeps dense to its inner Gloo
            # directly: callbacks on such an operation run on Gloo's thread,
            # concurrently with the main thread, whose next operation then
            # races with theirs as on plain Gloo (docs/pytorch.md). Those
            # rounds submit it after the callbacks.
            concurrent = not (lane == "staged_cpu" and algo in ("dense", "auto"))
            for step in range(3):
                checks, compare, seen = chain_round(group, rank, world, step, concurrent)
                for k, v in checks.items():
                    res["checks"][k] = res["checks"].get(k, True) and v
                for t in compare:
                    res["identical"] &= equal_everywhere(t)
                res["threads"].update(seen.values())
            st = compcoll.stats(group)
            res["compressed_calls"] = st["compressed_calls"]
            res["lanes"] = sorted(st["devices"])
            res["threads"] = sorted(res["threads"])
            out[f"{lane}/{algo}"] = res
            print(f"rank {rank}: {lane}/{algo} done", file=sys.stderr, flush=True)
            dist.destroy_process_group(group)
    _backend._TEST_STAGED_CPU = False
    emit(out)
    dist.destroy_process_group()


def wedge():
    timeout_s = float(os.environ["TEST_TIMEOUT_S"])
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=timeout_s))
    rank = dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    backend = dist.group.WORLD._get_backend(torch.device("cpu")).name()
    release = threading.Event()
    entered = threading.Event()

    def block(fut):
        entered.set()
        release.wait(600)  # bounded; released once the result is in
        return fut.value()

    x = torch.ones(BIG)
    if rank == 0:
        # The allreduce cannot complete before rank 1 joins it, and rank 1
        # joins only once the callback is attached: it runs on the worker.
        w = dist.all_reduce(x, async_op=True)
        wedged = w.get_future().then(block)
        store.set("attached", "1")
        if not entered.wait(60):
            raise SystemExit("the blocking callback never ran")
    else:
        store.wait(["attached"], timedelta(seconds=60))
        dist.all_reduce(x)
    y = torch.ones(BIG)
    t0 = time.monotonic()
    err = None
    try:
        dist.all_reduce(y)
    except Exception as e:  # noqa: BLE001  the error is the result
        err = str(e)
    elapsed = time.monotonic() - t0
    later = None
    try:
        dist.all_reduce(torch.ones(10))
    except Exception as e:  # noqa: BLE001
        later = str(e)
    release.set()
    if rank == 0:
        wedged.wait()
    emit({"rank": rank, "backend": backend, "error": err and err[:3000], "after_s": elapsed,
          "later": later and later[:3000]})
    t1 = time.monotonic()
    dist.destroy_process_group()
    emit({"rank": rank, "destroy_s": time.monotonic() - t1})


{"chains": chains, "wedge": wedge}[MODE]()
