"""The compcoll backend's cuda device: registration, laziness, and the
host-staged device lane (docs/pytorch.md, "cuda tensors").

Without a GPU the device lane is checked through the test-only lane
"staged_cpu", which stages cpu tensors exactly as the cuda lane stages cuda
ones (host snapshot at submission, the CPU codecs on the worker, payloads
through staging tensors on the lane's device via TorchComm's staging path,
result copied back before the work completes) over a second, lazily built
Gloo group. The GPU tests run the same worker on cuda over NCCL; they skip
when torch.cuda.is_available() is False.
"""
import datetime
import threading

import pytest
import torch
import torch.distributed as dist

# Their workers allreduce outside a backward pass and expect compression.
from conftest import launch_direct as launch, worker

ALGOS = ["dgc", "sbc", "sdagc", "csc", "onebit"]
NO_HOOK = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
HAVE_CUDA = torch.cuda.is_available() and dist.is_nccl_available()
needs_gpu = pytest.mark.skipif(not HAVE_CUDA, reason="needs CUDA and NCCL "
                               "(torch.cuda.is_available() is False here)")


def run_lane(lane, modes, nranks, env=None, timeout=240):
    e = dict(NO_HOOK)
    e.update(env or {})
    return launch([worker("device_lane.py"), lane, ",".join(modes)], nranks, env=e,
                  timeout=timeout)


# ------------------------------------------------------------ the checks --
# Shared by the staged_cpu runs here and the cuda runs on a GPU machine.

def check_lazy(r, lane):
    res = r.result["lazy"]
    assert res["device_lane"] == lane, res
    assert not res["built_at_creation"], res
    if lane == "cuda":
        assert not res["cuda_initialized_at_start"], res
        assert not res["built_after_cpu_ops"], "cpu-only use built the NCCL group"
        assert not res["cuda_initialized_after_cpu_ops"], "cpu-only use initialised CUDA"
        assert res["inner_name"] == "nccl", res
    else:
        assert res["inner_name"] == "gloo", res
    assert res["built_after_lane_op"] and res["broadcast_ok"], res
    assert res["lanes_before_candidate"] == ["cpu"], res  # no communicator before a candidate
    assert res["lanes_after_candidate"] == sorted(["cpu", lane]), res
    assert res["lane_compressed_calls"] == 1 and res["slots"] == 1, res


def check_reference(ranks, algos, steps):
    nranks = len(ranks)
    cases = 3  # float32 SUM, float16 AVG, bfloat16 SUM
    for r in ranks:
        for algo in algos:
            res = r.result["reference"][algo]
            assert all(res["identical"]), f"{algo} rank {r.rank}: ranks differ {res['identical']}"
            # csc's chunk norms are an exact allreduce: over NCCL with 3+ ranks
            # its sum order differs from Gloo's, so bits may differ from the
            # host path (the selection can too); 1-2 ranks sum exactly.
            if algo != "csc" or nranks <= 2:
                assert all(res["equal_host"]), \
                    f"{algo} rank {r.rank}: lane differs from the host path {res['equal_host']}"
            assert max(res["rel_error"]) < 1.5, res["rel_error"]  # compressed, but a sum
            st = res["lane_stats"]
            assert st["calls"] == cases * steps and st["compressed_calls"] == cases * steps, st
            host = res["host_stats"]
            assert host["compressed_calls"] == cases * steps, host
            assert st["wire_bytes"] == host["wire_bytes"], (st, host)  # same payloads
            assert st["dense_bytes"] == host["dense_bytes"], (st, host)


def check_exact(r, lane):
    res = r.result["exact"]
    checks = {k: v for k, v in res.items() if isinstance(v, bool)}
    assert len(checks) >= 11 + (r.result["world"] > 1) and all(checks.values()), \
        f"rank {r.rank}: not exact: {checks}"
    # kept dense by the policy (algorithm dense, or small): the inner
    # allreduce directly, no staging; counted
    assert res["dense_calls"] == 1 and res["dense_direct_calls"] == 1, res
    assert res["dgc_lane_calls"] == 2 and res["dgc_lane_compressed_calls"] == 1, res
    assert res["dgc_lane_direct_calls"] == 1, res


def check_async(r):
    res = r.result["async"]
    assert all(res["delegated_ok"]), res
    assert res["identical"] and res["returned_before_done"], res
    assert res["future_value"], res
    assert res["lane_compressed_calls"] == 5 and res["lane_calls"] == 6, res
    assert res["lane_direct_calls"] == 1, res


def check_ddp(r, lane):
    res = r.result["ddp"]
    assert res["identical_params"], res
    assert res["lane_calls"] >= 8 and res["lane_compressed_calls"] >= 8, res
    assert res["losses"][-1] < res["losses"][0], res["losses"]


# -------------------------------------------------------- without a GPU --

def test_registered_for_cpu_and_cuda_and_cpu_use_builds_no_nccl(tmp_path):
    """"compcoll" is registered for cpu and cuda and one backend serves both.
    Here (no CUDA) no device lane exists; with CUDA "available" (faked: the
    worker replaces the check) the group gets a cuda lane whose NCCL group
    is not built by cpu-only use; the gloo hook never gets one."""
    code = r'''
import json, torch, torch.distributed as dist
import compcoll
from compcoll import _backend, _C
out = {"capability": dist.Backend.backend_capability["compcoll"]}
dist.init_process_group("compcoll", init_method="env://")
pg = dist.group.WORLD
out["devices"] = sorted(d.type for d in pg._device_types)
out["same_object"] = _C.is_compcoll(pg._get_backend(torch.device("cuda")))
out["lane_here"] = compcoll.device_lane()
_backend._nccl_usable = lambda: True  # as on a GPU machine
g = dist.new_group(backend="compcoll")
out["lane_faked"] = compcoll.device_lane(g)
x = torch.randn(40_000)
dist.all_reduce(x, group=g)
dist.broadcast(torch.ones(5), 0, group=g)
dist.all_gather([torch.empty(3) for _ in range(dist.get_world_size())], torch.ones(3), group=g)
dist.barrier(group=g)
out["nccl_built"] = compcoll.inner(g, "cuda") is not None
out["stats_lanes"] = sorted(compcoll.stats(g)["devices"])
out["cuda_initialized"] = torch.cuda.is_initialized()
# Torch builds that keep gloo outside the backend plugin table (2.11) cannot
# be hooked: install_gloo_hook says so and returns False.
out["hooked"] = _backend.install_gloo_hook()
out["gloo_in_plugin_table"] = (hasattr(dist.Backend, "_BackendPlugin")
                               and "GLOO" in getattr(dist.Backend, "_plugins", {}))
if out["hooked"]:
    h = dist.new_group(backend="gloo")
    out["hooked_gloo_lane"] = compcoll.device_lane(h)
    out["hooked_is_compcoll"] = _C.is_compcoll(h._get_backend(torch.device("cuda")))
print("RESULT " + json.dumps(out))
'''
    for r in launch(["-c", code], 2, env=dict(NO_HOOK, COMPCOLL_ALGO="dgc"), timeout=120):
        res = r.result
        assert res["capability"] == ["cpu", "cuda"], res
        assert res["devices"] == ["cpu", "cuda"] and res["same_object"], res
        if not HAVE_CUDA:
            assert res["lane_here"] is None, res
        assert res["lane_faked"] == "cuda", res
        assert not res["nccl_built"] and not res["cuda_initialized"], res
        assert res["stats_lanes"] == ["cpu"], res
        if res["hooked"]:
            assert res["hooked_is_compcoll"] and res["hooked_gloo_lane"] is None, res
        else:  # only where torch keeps gloo outside its plugin table
            assert not res["gloo_in_plugin_table"], res


def test_staged_lane_equals_host_path(tmp_path):
    """The staging path with real copies (cpu staging device), 2 ranks, 3
    error-feedback steps of every algorithm in float32 SUM, float16 AVG and
    bfloat16 SUM: bit for bit what the host path gives on the same inputs,
    and the lane's inner group is built on its first operation only."""
    steps = 3
    ranks = run_lane("staged_cpu", ["lazy", "reference"], 2,
                     {"TEST_ALGOS": ",".join(ALGOS), "TEST_STEPS": str(steps)})
    for r in ranks:
        check_lazy(r, "staged_cpu")
    check_reference(ranks, ALGOS, steps)


def test_staged_lane_delegation_async_and_ddp(tmp_path):
    """Delegated operations and the dense path through the staged lane are
    exact; operations queued behind a compressed allreduce complete with the
    right values; a future chain sees the result; DDP keeps ranks equal."""
    for r in run_lane("staged_cpu", ["exact", "async", "ddp"], 2):
        check_exact(r, "staged_cpu")
        check_async(r)
        check_ddp(r, "staged_cpu")


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_torch_comm_staging_on_cpu(world, compcoll_ext):
    """TorchComm's staging path (cpu staging device: real copies) gives what
    the direct path gives for every Comm call, with the same byte counts.
    Ranks are threads of this process over Gloo on loopback."""
    store = dist.HashStore()
    timeout = datetime.timedelta(seconds=60)
    results, errors = [None] * world, []

    def rank_main(rank):
        try:
            options = dist.ProcessGroupGloo._Options()
            options._devices = [dist.ProcessGroupGloo.create_device(interface="lo")]
            options._timeout = timeout
            inner = dist.ProcessGroupGloo(store, rank, world, options)
            results[rank] = (compcoll_ext._exercise_torch_comm(inner, timeout, None),
                             compcoll_ext._exercise_torch_comm(inner, timeout, torch.device("cpu")))
        except Exception as e:  # noqa: BLE001  rethrown on the main thread
            errors.append(f"rank {rank}: {e!r}")

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert not errors and all(not t.is_alive() for t in threads), errors or "a rank hung"
    for rank, (direct, staged) in enumerate(results):
        check_exercise(direct, rank, world)
        assert staged == direct


def check_exercise(res, rank, world):
    """What _C._exercise_torch_comm returns on rank of world (see bindings.cc)."""
    assert res["allgatherv"] == [[j] * (3 * j) for j in range(world)], res
    assert res["alltoallv"] == [[10 * j + rank] * ((j + rank) % 3) for j in range(world)], res
    assert res["allreduce"] == [float(sum(range(1, world + 1)))] * 5, res
    assert res["allreduce_int64"] == [world * (world - 1) // 2] * 3, res
    assert res["broadcast"] == [7] * 9, res
    assert res["barrier"] is True
    assert res["empty_allgatherv"] == [[] for _ in range(world)], res
    assert (res["bytes_sent"] > 0) == (world > 1), res  # a lone rank sends nothing


# ------------------------------------------------------------ with a GPU --

@needs_gpu
def test_cuda_lane_one_gpu(tmp_path):
    """One rank over NCCL on one GPU: laziness, every algorithm against the
    host path, delegation, queued operations on side streams, DDP."""
    steps = 3
    ranks = run_lane("cuda", ["lazy", "reference", "exact", "async", "ddp"], 1,
                     {"TEST_ALGOS": ",".join(ALGOS), "TEST_STEPS": str(steps)}, timeout=400)
    r = ranks[0]
    check_lazy(r, "cuda")
    check_reference(ranks, ALGOS, steps)
    check_exact(r, "cuda")
    check_async(r)
    check_ddp(r, "cuda")


@needs_gpu
def test_cuda_lane_one_gpu_per_rank(tmp_path):
    """2-4 ranks, one GPU each (skips with fewer than 2 GPUs)."""
    n = min(torch.cuda.device_count(), 4)
    if n < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {n}")
    steps = 3
    ranks = run_lane("cuda", ["lazy", "reference", "exact", "async", "ddp"], n,
                     {"TEST_ALGOS": ",".join(ALGOS), "TEST_STEPS": str(steps)}, timeout=500)
    for r in ranks:
        check_lazy(r, "cuda")
        check_exact(r, "cuda")
        check_async(r)
        check_ddp(r, "cuda")
    check_reference(ranks, ALGOS, steps)


@needs_gpu
def test_torch_comm_staging_on_cuda(compcoll_ext):
    """TorchComm with a cuda staging device over ProcessGroupNCCL gives what
    the cpu path over Gloo gives (ranks: the GPUs, at most 4)."""
    n = max(1, min(torch.cuda.device_count(), 4))
    code = r'''
import json, os, datetime, torch, torch.distributed as dist
from compcoll import _C
dist.init_process_group("cpu:gloo,cuda:nccl", init_method="env://")
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(dev)
t = datetime.timedelta(seconds=60)
gloo = dist.group.WORLD._get_backend(torch.device("cpu"))
nccl = dist.group.WORLD._get_backend(torch.device("cuda"))
print("RESULT " + json.dumps({"direct": _C._exercise_torch_comm(gloo, t, None),
                              "staged": _C._exercise_torch_comm(nccl, t, dev)}))
'''
    for r in launch(["-c", code], n, env=NO_HOOK, timeout=240):
        check_exercise(r.result["staged"], r.rank, n)
        assert r.result["staged"] == r.result["direct"]
