"""Reliability checks through the compcoll backend (see test_reliability.py).

usage: reliability.py MODE
  nonfinite  for every algorithm of TEST_ALGOS: rank 1 puts NaN, +Inf and
             -Inf into its gradient; every rank reports where its output is
             non-finite, then runs clean steps and reports whether they are
             finite and identical across ranks
  killed     COMPCOLL_ALGO (from the environment) on the default group with
             a TEST_TIMEOUT_S process-group timeout; rank TEST_VICTIM
             SIGKILLs itself after TEST_KILL_AFTER allreduces; survivors
             report how long after their last completed call the error came
             and what it said
  retimed    COMPCOLL_ALGO on the default group created with a 600 s
             timeout, shortened to TEST_TIMEOUT_S by dist.set_timeout after
             TEST_KILL_AFTER allreduces; then rank TEST_VICTIM hangs (stops
             calling, alive, its connections open) and the survivors report
             how long their next allreduce took to fail and what it said
  op_timeout COMPCOLL_ALGO on the default group created with a
             TEST_TIMEOUT_S timeout; allreduces carry their own timeout in
             their options (AllreduceOptions.timeout, as ProcessGroupGloo
             honours it), TEST_OP_TIMEOUT_S. Rank 1 comes TEST_LATE_S late
             to one of them; every rank reports how long it took and its
             error, then (when it succeeded) whether the group still works
  ephemeral  COMPCOLL_ALGO on the default group created with a
             TEST_TIMEOUT_S timeout, extended by TEST_EXTRA_S with
             _add_ephemeral_timeout (what torch.compile does around long
             compiles); rank 1 comes TEST_LATE_S late to the next allreduce
             and to the one after it (the extension has ended by then);
             every rank reports how long each took and the error
  released   COMPCOLL_ALGO on the default group created with a
             TEST_TIMEOUT_S timeout (long); after warm-up rank 0 alone
             shortens it to TEST_SHORT_S, rank TEST_VICTIM hangs
             (TEST_HANG_S, alive, connections open) and the others
             allreduce: rank 0 fails at its short timeout and keeps its
             process (and so the store it hosts) TEST_LINGER_S longer; every
             survivor reports how long its allreduce took and its error,
             then exits through the interpreter's normal exit
  timing     _enable_collectives_timing on the default group (which
             ProcessGroupGloo accepts); every rank reports _get_duration()
             of a compressed allreduce, then runs a delegated broadcast
"""
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from common import emit

MODE = sys.argv[1]
torch.set_num_threads(1)
N = 50_000
BAD = {"nan": 7, "posinf": 1234, "neginf": 40_000}


def gradient(rank, step):
    g = torch.Generator().manual_seed(7 * step + rank)
    return torch.randn(N, generator=g) * 1e-2


def nonfinite():
    import compcoll  # noqa: F401  registers "compcoll"
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for algo in os.environ["TEST_ALGOS"].split(","):
        os.environ["COMPCOLL_ALGO"] = algo
        group = dist.new_group(backend="compcoll")
        x = gradient(rank, 0)
        if rank == 1:
            x[BAD["nan"]] = float("nan")
            x[BAD["posinf"]] = float("inf")
            x[BAD["neginf"]] = float("-inf")
        dist.all_reduce(x, group=group)
        res = {
            "nan_at": torch.nonzero(torch.isnan(x)).flatten().tolist(),
            "posinf_at": torch.nonzero(torch.isposinf(x)).flatten().tolist(),
            "neginf_at": torch.nonzero(torch.isneginf(x)).flatten().tolist(),
        }
        clean_finite, clean_identical, clean_err = True, True, 0.0
        for step in range(1, 4):
            y = gradient(rank, step)
            want = sum(gradient(r, step) for r in range(world))
            dist.all_reduce(y, group=group)
            clean_finite &= bool(torch.isfinite(y).all())
            mine = y.clone()
            others = [torch.empty_like(y) for _ in range(world)]
            dist.all_gather(others, mine, group=group)
            clean_identical &= all(torch.equal(o, mine) for o in others)
            clean_err = float((y - want).norm() / want.norm())
        res.update(clean_finite=clean_finite, clean_identical=clean_identical,
                   clean_rel_err=clean_err)
        out[algo] = res
        dist.destroy_process_group(group)
    emit(out)
    dist.destroy_process_group()


def killed():
    timeout_s = float(os.environ["TEST_TIMEOUT_S"])
    victim = int(os.environ["TEST_VICTIM"])
    kill_after = int(os.environ["TEST_KILL_AFTER"])
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=timeout_s))
    rank = dist.get_rank()
    backend = dist.group.WORLD._get_backend(torch.device("cpu")).name()
    last_ok = time.monotonic()
    calls = 0
    try:
        for step in range(100_000):  # bounded; the victim ends it long before
            if rank == victim and step == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
            x = gradient(rank, step)
            dist.all_reduce(x)
            calls += 1
            last_ok = time.monotonic()
    except Exception as e:  # noqa: BLE001  the error is the result
        emit({"rank": rank, "backend": backend, "calls": calls,
              "error_after_s": time.monotonic() - last_ok, "error": str(e)[:2000]})
        os._exit(0)  # the group is broken; skip its teardown
    emit({"rank": rank, "backend": backend, "calls": calls, "error": None})


def retimed():
    timeout_s = float(os.environ["TEST_TIMEOUT_S"])
    victim = int(os.environ["TEST_VICTIM"])
    calls_before = int(os.environ["TEST_KILL_AFTER"])
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    backend = dist.group.WORLD._get_backend(torch.device("cpu")).name()
    for step in range(calls_before):
        dist.all_reduce(gradient(rank, step))
    dist.set_timeout(timedelta(seconds=timeout_s))
    if rank == victim:
        # Hung, not dead: a dead peer's closed connections fail the others
        # at once, whatever the timeout; a hung one is found by the timeout
        # alone. Bounded: the survivors give up after timeout_s (the test
        # allows 2 s more); twice that plus 4 s leaves them 5 s of slack
        # before this rank's exit could fail them for another reason.
        time.sleep(2 * timeout_s + 4)
        emit({"rank": rank, "backend": backend, "victim": True})
        os._exit(0)  # the survivors have left; skip the teardown
    start = time.monotonic()
    try:
        dist.all_reduce(gradient(rank, calls_before))
        error = None
    except Exception as e:  # noqa: BLE001  the error is the result
        error = str(e)[:2000]
    emit({"rank": rank, "backend": backend, "error": error,
          "error_after_s": time.monotonic() - start})
    os._exit(0)  # the group is broken; skip its teardown


def released():
    rank, pg, backend = warm_group_with_timeout()
    victim = int(os.environ["TEST_VICTIM"])
    if rank == 0:
        dist.set_timeout(timedelta(seconds=float(os.environ["TEST_SHORT_S"])))
    if rank == victim:
        time.sleep(float(os.environ["TEST_HANG_S"]))  # bounded: the survivors have left by then
        emit({"rank": rank, "backend": backend, "victim": True})
        os._exit(0)
    outcome = late_call(-1, lambda: dist.all_reduce(gradient(rank, 3)))
    emit(dict(outcome, rank=rank, backend=backend))
    if rank == 0:
        time.sleep(float(os.environ["TEST_LINGER_S"]))
    sys.exit(0)  # the interpreter's own exit, with the broken group still alive


def warm_group_with_timeout():
    """The default group with a TEST_TIMEOUT_S timeout, after three
    allreduces (the compressed path set up): rank, group, cpu backend name."""
    timeout = timedelta(seconds=float(os.environ["TEST_TIMEOUT_S"]))
    dist.init_process_group("gloo", init_method="env://", timeout=timeout)
    rank = dist.get_rank()
    pg = dist.group.WORLD
    for step in range(3):
        dist.all_reduce(gradient(rank, step))
    return rank, pg, pg._get_backend(torch.device("cpu")).name()


def late_call(rank, call):
    """call() with rank 1 TEST_LATE_S late: {error or None, seconds taken}."""
    if rank == 1:
        time.sleep(float(os.environ["TEST_LATE_S"]))
    start = time.monotonic()
    try:
        call()
        error = None
    except Exception as e:  # noqa: BLE001  the error is the result
        error = str(e)[:2000]
    return {"error": error, "took_s": time.monotonic() - start}


def op_timeout():
    rank, pg, backend = warm_group_with_timeout()
    opts = dist.AllreduceOptions()
    opts.timeout = timedelta(seconds=float(os.environ["TEST_OP_TIMEOUT_S"]))
    outcome = late_call(rank, lambda: pg.allreduce([gradient(rank, 3)], opts).wait())
    error, took = outcome["error"], outcome["took_s"]
    usable = None
    if error is None:
        dist.all_reduce(gradient(rank, 4))  # compressed, as the call before
        x = torch.ones(N, dtype=torch.int64)  # exact: the sum can be checked
        dist.all_reduce(x)
        usable = bool(torch.all(x == dist.get_world_size()))
    emit({"rank": rank, "backend": backend, "error": error, "took_s": took, "usable": usable})
    if error is not None:
        os._exit(0)  # a broken group has no clean teardown
    dist.destroy_process_group()


def ephemeral():
    rank, pg, backend = warm_group_with_timeout()
    pg._add_ephemeral_timeout(timedelta(seconds=float(os.environ["TEST_EXTRA_S"])))
    result = {"rank": rank, "backend": backend}
    for name, step in (("extended", 3), ("after", 4)):
        result[name] = late_call(rank, lambda: dist.all_reduce(gradient(rank, step)))
        if result[name]["error"] is not None:
            break
    emit(result)
    os._exit(0)  # the group is broken by the second call; skip its teardown


def timing():
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    pg = dist.group.WORLD
    x = gradient(rank, 0)
    dist.all_reduce(x)
    pg._enable_collectives_timing()
    durations = {}
    w = dist.all_reduce(gradient(rank, 1), async_op=True)
    w.wait()
    durations["all_reduce"] = w._get_duration()
    group_timeout_s = w.timeout.total_seconds()  # the work's timeout, as a Gloo work has
    y = torch.ones(1000) if rank == 0 else torch.zeros(1000)
    dist.broadcast(y, src=0)  # delegated: Gloo's work, which has no duration
    emit({"rank": rank, "backend": pg._get_backend(torch.device("cpu")).name(),
          "durations": durations, "timeout_s": group_timeout_s})
    dist.destroy_process_group()


{"nonfinite": nonfinite, "killed": killed, "retimed": retimed, "op_timeout": op_timeout,
 "ephemeral": ephemeral, "timing": timing, "released": released}[MODE]()
