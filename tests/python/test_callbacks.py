"""Collectives from future callbacks, and no wait without a deadline
(issue 14): a callback run by the backend's worker thread may issue and wait
for collectives on every lane, whether compressed, kept dense or delegated,
in the same order on every rank; an operation that cannot make progress
becomes a compcoll error naming it and the group within the timeout."""
import os
import sys

import pytest

# Their workers allreduce outside a backward pass and expect compression.
from conftest import launch_direct as launch, run_single, worker

ALGOS = ["dense", "dgc", "sbc", "sdagc", "csc", "onebit", "auto"]

REPRODUCER = """
import torch, torch.distributed as dist
from datetime import timedelta
dist.init_process_group("gloo", timeout=timedelta(seconds=10))
t = torch.ones(100)
def cb(fut):
    u = torch.ones(100, dtype=torch.int64 if INT else torch.float32)
    return dist.all_reduce(u, async_op=True).get_future().wait()[0]
out = dist.all_reduce(t, async_op=True).get_future().then(cb).wait()
backend = dist.group.WORLD._get_backend(torch.device("cpu")).name()
print("RESULT", __import__("json").dumps({"out": out[:3].tolist(), "backend": backend}))
dist.destroy_process_group()
"""


SETTLED_BEFORE_WAIT_RETURNS = """
import json, torch, torch.distributed as dist
from datetime import timedelta
dist.init_process_group("gloo", timeout=timedelta(seconds=30))
counts = {"future_pending": 0, "callback_not_run": 0, "value_raised": 0}
for i in range(150):
    # 20000 floats are compressed (COMPCOLL_MIN_ELEMS), 10 take the dense
    # route, int64 is delegated: every kind of work the worker completes.
    for x in (torch.full((20000,), float(i)), torch.full((10,), 1.0),
              torch.ones(10, dtype=torch.int64)):
        w = dist.all_reduce(x, async_op=True)
        seen = []
        def cb(fut, seen=seen):
            seen.append(1)
            return fut.value()
        w.get_future().then(cb)
        w.wait()
        counts["future_pending"] += not w.get_future().done()
        counts["callback_not_run"] += not seen
        try:
            w.get_future().value()
        except RuntimeError:
            counts["value_raised"] += 1
backend = dist.group.WORLD._get_backend(torch.device("cpu")).name()
print("RESULT", json.dumps({"counts": counts, "backend": backend}))
dist.destroy_process_group()
"""


# A callback of w1 waits for w2, submitted after w1 (queued behind it on the
# worker). Rank 1 comes late to w1, so rank 0's w1 is still pending when its
# callback is attached: the callback runs on rank 0's worker. Every kind of
# w2: compressed, dense route, delegated (int64); then the group still works.
CALLBACK_WAITS_FOR_A_LATER_OPERATION = """
import json, threading, time, torch, torch.distributed as dist
from datetime import timedelta
dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S))
rank, world = dist.get_rank(), dist.get_world_size()
out = {"took_s": [], "sums_right": [], "callback_threads": []}
for kind in ("compressed", "dense", "delegated"):
    if rank == 1:
        time.sleep(1.0)
    a = torch.full((20000,), 1.0)
    b = {"compressed": torch.full((20000,), float(rank)), "dense": torch.full((10,), 1.0),
         "delegated": torch.ones(10, dtype=torch.int64)}[kind]
    start = time.monotonic()
    w1 = dist.all_reduce(a, async_op=True)
    w2 = dist.all_reduce(b, async_op=True)
    def cb(fut, w2=w2):
        out["callback_threads"].append(threading.current_thread().name)
        w2.wait()  # submitted after w1: queued behind it on the worker
        return fut.value()
    w1.get_future().then(cb).wait()
    w2.wait()
    out["took_s"].append(time.monotonic() - start)
    want = {"compressed": float(sum(range(world))), "dense": float(world), "delegated": world}
    if kind == "compressed":
        # A first step of error feedback sends some elements, not all: each
        # rank's input is constant, so every element sent is the whole sum
        # (two ranks: rank 0 adds zeros), and the rest are 0.
        sent = b[b != 0]
        out["sums_right"].append(sent.numel() > 0 and bool(torch.all(sent == want[kind])))
    else:
        out["sums_right"].append(float(b[0]) == want[kind])
x = torch.ones(10, dtype=torch.int64)
dist.all_reduce(x)
out["usable"] = bool(torch.all(x == world))
out["backend"] = dist.group.WORLD._get_backend(torch.device("cpu")).name()
print("RESULT", json.dumps(out))
dist.destroy_process_group()
"""


def test_a_callback_may_wait_for_an_operation_submitted_after_the_one_it_follows():
    """w1.get_future().then(lambda f: w2.wait()) with w2 issued after w1: the
    callback, run by rank 0's worker, waits for w2, which is queued behind
    w1 on that worker; the worker runs w2 in the callback's wait, in queue
    order, as ProcessGroupGloo (whose callbacks run on other threads)
    completes it. Within seconds (the group's timeout is 30 s), for a
    compressed, a dense-route and a delegated w2; the group still works."""
    code = CALLBACK_WAITS_FOR_A_LATER_OPERATION.replace("TIMEOUT_S", "30")
    ranks = launch(["-c", code], 2,
                   env={"COMPCOLL_ALGO": "dgc", "COMPCOLL_MIN_ELEMS": "16384"}, timeout=120)
    for r in ranks:
        res = r.result
        assert res["backend"] == "compcoll", res
        assert all(t < 10 for t in res["took_s"]), res
        assert all(res["sums_right"]), res
        assert res["usable"], res
    # Rank 0's callbacks ran on its worker (the case that used to hang).
    assert all(t != "MainThread" for t in ranks[0].result["callback_threads"]), ranks[0].result


# Nested: w1's callback waits for w3, so the worker runs w2 and w3 in that
# wait; w2's callback, run there, waits for w1, whose completion is still
# running its callbacks (the outcome is known).
NESTED_WAITS = """
import json, time, torch, torch.distributed as dist
from datetime import timedelta
dist.init_process_group("gloo", timeout=timedelta(seconds=30))
rank = dist.get_rank()
if rank == 1:
    time.sleep(1.0)
start = time.monotonic()
xs = [torch.full((20000,), float(i)) for i in range(3)]
w1, w2, w3 = (dist.all_reduce(x, async_op=True) for x in xs)
w1.get_future().then(lambda f: w3.wait())
w2.get_future().then(lambda f: w1.wait())
for w in (w1, w2, w3):
    w.wait()
print("RESULT", json.dumps({"took_s": time.monotonic() - start}))
dist.destroy_process_group()
"""


def test_callbacks_run_ahead_inside_another_may_wait_for_the_one_completing():
    """w1's callback waits for w3 (the worker runs w2 and w3 in that wait);
    w2's callback, run there, waits for w1, whose completion is what runs
    it: the outcome is known, so it returns (it used to hold the worker for
    ever, past the group's timeout)."""
    ranks = launch(["-c", NESTED_WAITS], 2,
                   env={"COMPCOLL_ALGO": "dgc", "COMPCOLL_MIN_ELEMS": "16384"}, timeout=120)
    for r in ranks:
        assert r.result["took_s"] < 10, r.result


def test_a_works_future_and_its_callbacks_are_done_when_wait_returns():
    """As with ProcessGroupGloo: once work.wait() returns, the work's future
    is done (value() works) and the callbacks it ran inline have run, for a
    compressed, a dense-route and a delegated allreduce."""
    ranks = launch(["-c", SETTLED_BEFORE_WAIT_RETURNS], 2,
                   env={"COMPCOLL_ALGO": "dgc", "COMPCOLL_MIN_ELEMS": "16384"}, timeout=240)
    for r in ranks:
        assert r.result["backend"] == "compcoll", r.result
        assert r.result["counts"] == {"future_pending": 0, "callback_not_run": 0,
                                      "value_raised": 0}, r.result


def test_registry_algorithms_are_all_tested(compcoll_ext):
    """ALGOS here (and in test_hooks.py) is every registered algorithm."""
    names = {n.strip() for n in compcoll_ext.algorithm_names().split(",")}
    assert names == set(ALGOS), names


@pytest.mark.parametrize("dtype", ["float", "int64"])
def test_issue_reproducer_finishes(dtype):
    """The issue's reproducer, verbatim but for the dtype of the callback's
    tensor: an unmodified "gloo" script under COMPCOLL_ALGO=dgc."""
    code = REPRODUCER.replace("INT", "True" if dtype == "int64" else "False")
    ranks = launch(["-c", code], 2, env={"COMPCOLL_ALGO": "dgc"}, timeout=120)
    for r in ranks:
        assert r.result["backend"] == "compcoll", r.result
        assert r.result["out"] == [2, 2, 2], r.result


@pytest.mark.parametrize("world", [2, 3])
def test_callbacks_issue_and_wait_on_every_lane_and_algorithm(world):
    """Every algorithm, the host lane and the staged lane (the cuda lane's
    path, on cpu tensors): callbacks issue and wait for a compressed, a
    dense and a delegated allreduce, an all_gather and a nested chain, while
    the main thread submits more. Exact results where the path is exact,
    results identical on every rank, the callbacks ran on the worker."""
    ranks = launch([worker("callbacks.py"), "chains"], world,
                   env={"TEST_ALGOS": ",".join(ALGOS), "TEST_LANES": "cpu,staged_cpu",
                        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, timeout=300)
    for r in ranks:
        assert len(r.result) == 2 * len(ALGOS)
        for name, res in r.result.items():
            where = f"rank {r.rank} {name}"
            assert all(res["checks"].values()), f"{where}: {res['checks']}"
            assert res["identical"], where
            lane, algo = name.split("/")
            assert lane in res["lanes"], f"{where}: {res['lanes']}"
            if algo not in ("dense", "auto"):  # auto compresses when it predicts a gain
                assert res["compressed_calls"] > 0, where
            # The first operation's callbacks ran on the worker (a thread
            # Python did not start) at least once in three rounds.
            assert any(t != "MainThread" for t in res["threads"]), f"{where}: {res['threads']}"


def test_wedged_worker_fails_every_rank_within_timeout():
    """Rank 0's worker is held by a future callback that blocks. The next
    allreduce fails on every rank within the group's timeout + 2 s with a
    compcoll error naming the operation and the group (rank 0: queued behind
    the wedged worker; rank 1: waiting for rank 0 in Gloo); later operations
    are refused at once; the group is destroyed in bounded time once the
    callback returns."""
    timeout_s = 4
    ranks = launch([worker("callbacks.py"), "wedge"], 2,
                   env={"COMPCOLL_ALGO": "dgc", "TEST_TIMEOUT_S": str(timeout_s)}, timeout=120)
    for r in ranks:
        res, end = r.results[0], r.results[-1]
        where = f"rank {r.rank}: {res}"
        assert res["backend"] == "compcoll", where
        assert res["error"] is not None, where
        assert res["error"].startswith("compcoll"), where
        assert "all_reduce" in res["error"] and "group '0'" in res["error"], where
        assert res["after_s"] <= timeout_s + 2, where
        assert res["later"] is not None and "compcoll" in res["later"], where
        assert end["destroy_s"] <= timeout_s + 5, end
    err0 = ranks[0].results[0]["error"]
    assert "did not finish within the group's timeout" in err0, err0
    assert "waiting for the worker thread" in err0 and "future callbacks" in err0, err0
