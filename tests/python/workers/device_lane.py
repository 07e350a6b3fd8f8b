"""Checks of the compcoll backend's device lane (docs/pytorch.md, "cuda
tensors"), on cuda (one GPU per rank, NCCL) or on the test lane staged_cpu
(cpu tensors staged through host copies and a second Gloo group, exactly as
cuda tensors are staged through NCCL), so that every check but the stream
ones also runs without a GPU.

usage: device_lane.py LANE MODES
  LANE   cuda | staged_cpu
  MODES  comma-separated, run in this order:
    lazy       the lane's inner backend is built on the first operation on a
               lane tensor, not before (cuda: not by cpu-only use, and CUDA
               itself is not initialised by it); its communicator appears in
               the stats at the first candidate
    reference  TEST_STEPS error-feedback steps of each algorithm of
               TEST_ALGOS (float32 SUM, float16 AVG, bfloat16 SUM): the lane's
               results against the host (cpu) path's on the same inputs, bit
               for bit, and identical on every rank
    exact      delegated operations and the dense path on lane tensors
               against a plain gloo group on cpu copies (integer-valued
               data: every summation order is exact)
    async      a compressed allreduce in flight with delegated operations
               and more candidates queued behind it, their inputs produced
               on a side stream (cuda) just before each call; a future chain
    ddp        a few DDP steps on lane tensors: ranks stay identical and
               every bucket allreduce goes through the lane
The default group is plain gloo (run with TORCH_DEVICE_BACKEND_AUTOLOAD=0).
Prints one RESULT line: {mode: {...}}.
"""
import contextlib
import os
import sys

import torch
import torch.distributed as dist

from common import emit, init

LANE, MODES = sys.argv[1], sys.argv[2].split(",")
assert LANE in ("cuda", "staged_cpu"), LANE
CUDA_INITIALIZED_AT_START = LANE == "cuda" and torch.cuda.is_initialized()
rank, world = init("gloo")
import compcoll  # noqa: E402
from compcoll import _backend  # noqa: E402

GLOO = dist.group.WORLD
if LANE == "cuda":
    DEV = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
else:
    DEV = torch.device("cpu")


def make_group(algo, lane=LANE):
    """A compcoll group whose lane under test is `lane` ("cpu": a plain one)."""
    os.environ["COMPCOLL_ALGO"] = algo
    _backend._TEST_STAGED_CPU = lane == "staged_cpu"
    try:
        group = dist.new_group(backend="compcoll")
    finally:
        _backend._TEST_STAGED_CPU = False
    return group


def host_group(algo, group):
    """The group whose cpu tensors take the host path: on cuda the same group
    (its host lane), on staged_cpu a plain compcoll group."""
    return group if LANE == "cuda" else make_group(algo, "cpu")


def side_stream():
    return torch.cuda.Stream(device=DEV) if LANE == "cuda" else None


def on_stream(stream):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def slow_zero(stream):
    """A zero tensor of 1000 elements that the device computes slowly (a
    chain of 2048x2048 matmuls whose exact value is known) on the current
    stream: an input built on it is not ready until that work is done."""
    if LANE != "cuda":
        return torch.zeros(1000)
    x = torch.full((2048, 2048), 1.0 / 2048, device=DEV)
    for _ in range(30):
        x = x @ x  # stays 1/2048 exactly (powers of two)
    return x[0, :1000] - 1.0 / 2048


def same_on_every_rank(t):
    t = t.detach().to("cpu").contiguous()
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t, group=GLOO)
    return all(torch.equal(p, parts[0]) for p in parts)


def gloo_sum(t):
    x = t.detach().to("cpu").clone()
    dist.all_reduce(x, group=GLOO)
    return x


def lane_stats(group, lane=LANE):
    return compcoll.stats(group)["devices"].get(lane)


# ------------------------------------------------------------------ modes --

def check_lazy():
    out = {"cuda_initialized_at_start": CUDA_INITIALIZED_AT_START}
    g = make_group("dgc")
    out["device_lane"] = compcoll.device_lane(g)
    out["built_at_creation"] = compcoll.inner(g, LANE) is not None
    if LANE == "cuda":  # cpu-only use: compressed, delegated, barrier
        x = torch.randn(50_000)
        dist.all_reduce(x, group=g)
        dist.broadcast(torch.ones(10), 0, group=g)
        out["cuda_initialized_after_cpu_ops"] = torch.cuda.is_initialized()
        dist.barrier(group=g)  # torch picks cpu for a group with a cpu backend
        out["built_after_cpu_ops"] = compcoll.inner(g, LANE) is not None
    t = torch.full((1000,), float(rank), device=DEV)
    dist.broadcast(t, 0, group=g)  # the first lane operation: delegated
    out["broadcast_ok"] = bool(torch.all(t.cpu() == 0))
    inner = compcoll.inner(g, LANE)
    out["built_after_lane_op"] = inner is not None
    out["inner_name"] = inner.name() if inner is not None else None
    out["lanes_before_candidate"] = sorted(compcoll.stats(g)["devices"])
    x = torch.randn(50_000, device=DEV)
    dist.all_reduce(x, group=g)
    st = compcoll.stats(g)
    out["lanes_after_candidate"] = sorted(st["devices"])
    out["lane_compressed_calls"] = st["devices"][LANE]["compressed_calls"]
    out["slots"] = len(compcoll.slots(g, LANE))
    dist.destroy_process_group(g)
    return out


CASES = [(torch.float32, dist.ReduceOp.SUM), (torch.float16, dist.ReduceOp.AVG),
         (torch.bfloat16, dist.ReduceOp.SUM)]


def check_reference():
    steps = int(os.environ.get("TEST_STEPS", "3"))
    n = int(os.environ.get("TEST_COUNT", "50000"))
    out = {}
    for algo in os.environ["TEST_ALGOS"].split(","):
        g = make_group(algo)
        h = host_group(algo, g)
        res = {"equal_host": [], "identical": [], "rel_error": []}
        for dtype, op in CASES:
            dev_buf = torch.empty(n, dtype=dtype, device=DEV)  # persistent: one state each
            host_buf = torch.empty(n, dtype=dtype)
            for s in range(steps):
                gen = torch.Generator().manual_seed(10_000 * s + 100 * rank + len(res["identical"]))
                x = (torch.randn(n, generator=gen) * (1 + s) + 0.01 * rank).to(dtype)
                dev_buf.copy_(x)
                host_buf.copy_(x)
                dist.all_reduce(dev_buf, op=op, group=g)
                dist.all_reduce(host_buf, op=op, group=h)
                got = dev_buf.to("cpu", copy=True)  # never an alias: dev_buf's life is its own
                res["equal_host"].append(bool(torch.equal(got, host_buf)))
                res["identical"].append(same_on_every_rank(got))
                exact = gloo_sum(x.double())
                if op == dist.ReduceOp.AVG:
                    exact /= world
                res["rel_error"].append(float((got.double() - exact).norm() / exact.norm()))
        res["lane_stats"] = lane_stats(g)
        res["host_stats"] = lane_stats(h, "cpu")
        res["stats_keys"] = sorted(compcoll.stats(g)["devices"])
        out[algo] = res
        if h is not g:
            dist.destroy_process_group(h)
        dist.destroy_process_group(g)
    return out


def check_exact():
    """Lane tensors are made with .to(DEV, copy=True): on staged_cpu a plain
    .to would alias the cpu input the expectation is computed from."""
    out = {}
    gen = torch.Generator().manual_seed(77 + rank)

    def ints(n, dtype=torch.float32):
        return torch.randint(-1000, 1000, (n,), generator=gen).to(dtype)

    def record(name, got, expected):
        if isinstance(got, (list, tuple)):
            out[name] = all(torch.equal(a.cpu(), b) for a, b in zip(got, expected))
        else:
            out[name] = bool(torch.equal(got.cpu(), expected))

    for algo in ("dense", "dgc"):
        g = make_group(algo)
        big = ints(60_000)
        x = big.to(DEV, copy=True)
        dist.all_reduce(x, group=g)  # dense: the inner allreduce, directly; dgc: compressed
        if algo == "dense":
            record("dense_allreduce_big", x, gloo_sum(big))
            st = lane_stats(g)
            out["dense_calls"] = st["calls"] if st else None
            out["dense_direct_calls"] = st["direct_calls"] if st else None
            dist.destroy_process_group(g)
            continue
        # too small to compress: the inner backend's allreduce, directly
        small = ints(1000)
        x = small.to(DEV, copy=True)
        dist.all_reduce(x, group=g)
        record("allreduce_small_dense_path", x, gloo_sum(small))
        for name, t, op in (("allreduce_int64", ints(5000, torch.int64), dist.ReduceOp.SUM),
                            ("allreduce_float64", ints(5000, torch.float64), dist.ReduceOp.SUM),
                            ("allreduce_max", ints(40_000), dist.ReduceOp.MAX)):
            x = t.to(DEV, copy=True)
            dist.all_reduce(x, op=op, group=g)
            y = t.clone()
            dist.all_reduce(y, op=op, group=GLOO)
            record(name, x, y)
        src = world - 1
        b = torch.full((7000,), float(rank), device=DEV)
        b += ints(7000).to(DEV, copy=True) * (rank == src)
        expected = b.cpu()
        dist.broadcast(expected, src, group=GLOO)
        dist.broadcast(b, src, group=g)
        record("broadcast", b, expected)
        part = ints(3000)
        outs = [torch.empty(3000, device=DEV) for _ in range(world)]
        dist.all_gather(outs, part.to(DEV, copy=True), group=g)
        ref = [torch.empty(3000) for _ in range(world)]
        dist.all_gather(ref, part, group=GLOO)
        record("all_gather", outs, ref)
        flat = torch.empty(3000 * world, device=DEV)
        dist.all_gather_into_tensor(flat, part.to(DEV, copy=True), group=g)
        record("all_gather_into_tensor", flat, torch.cat(ref))
        inp = ints(world * 2000)
        rs = torch.empty(2000, device=DEV)
        dist.reduce_scatter_tensor(rs, inp.to(DEV, copy=True), group=g)
        record("reduce_scatter_tensor", rs, gloo_sum(inp)[rank * 2000:(rank + 1) * 2000])
        in_splits = [(rank + j) % 3 + 1 for j in range(world)]
        out_splits = [(j + rank) % 3 + 1 for j in range(world)]
        a2a_in = torch.arange(sum(in_splits), dtype=torch.float32) + 100 * rank
        a2a = torch.empty(sum(out_splits), device=DEV)
        dist.all_to_all_single(a2a, a2a_in.to(DEV, copy=True), out_splits, in_splits, group=g)
        a2a_ref = torch.empty(sum(out_splits))
        dist.all_to_all_single(a2a_ref, a2a_in, out_splits, in_splits, group=GLOO)
        record("all_to_all_single", a2a, a2a_ref)
        if world > 1:
            # a ring, even ranks sending first: NCCL's point-to-point kernels
            # of one pair run in issue order, so all-send-first can deadlock
            nxt, prv = (rank + 1) % world, (rank - 1) % world
            got = torch.empty(500, device=DEV)
            mine = torch.full((500,), float(rank), device=DEV)
            if rank % 2 == 0:
                dist.send(mine, nxt, group=g)
                dist.recv(got, prv, group=g)
            else:
                dist.recv(got, prv, group=g)
                dist.send(mine, nxt, group=g)
            record("send_recv", got, torch.full((500,), float(prv)))
        objs = [None] * world
        dist.all_gather_object(objs, {"rank": rank}, group=g)
        out["all_gather_object"] = [o["rank"] for o in objs] == list(range(world))
        dist.barrier(group=g)
        if LANE == "cuda":
            dist.barrier(group=g, device_ids=[DEV.index])  # a barrier on the NCCL group
        st = lane_stats(g)
        out["dgc_lane_calls"] = st["calls"]  # big (compressed) and small (dense path)
        out["dgc_lane_compressed_calls"] = st["compressed_calls"]
        out["dgc_lane_direct_calls"] = st["direct_calls"]
        dist.destroy_process_group(g)
    return out


def check_async():
    g = make_group("dgc")
    stream = side_stream()
    first = torch.randn(2_000_000, device=DEV)
    works, checks = [], []
    w0 = dist.all_reduce(first, async_op=True, group=g)
    returned_before_done = not w0.is_completed()
    comp = []
    for i in range(4):
        with on_stream(stream):
            zero = slow_zero(stream)
            # a candidate whose input the side stream is still computing
            c = torch.randn(60_000, generator=torch.Generator().manual_seed(i * 10 + rank)).to(DEV)
            c[:1000] += zero
            comp.append(c)
            works.append(dist.all_reduce(c, async_op=True, group=g))
            # delegated operations queued behind it, inputs from the same slow work
            b = torch.full((1000,), float(rank), device=DEV) + zero
            works.append(dist.broadcast(b, src=i % world, async_op=True, group=g))
            checks.append((b, torch.full((1000,), float(i % world))))
            s = torch.ones(100, device=DEV) * (rank + 1) + zero[:100]
            works.append(dist.all_reduce(s, op=dist.ReduceOp.MAX, async_op=True, group=g))
            checks.append((s, torch.full((100,), float(world))))
            outs = [torch.empty(10, device=DEV) for _ in range(world)]
            mine = torch.full((10,), float(rank), device=DEV) + zero[:10]
            works.append(dist.all_gather(outs, mine, async_op=True, group=g))
            checks.extend((o, torch.full((10,), float(j))) for j, o in enumerate(outs))
    for w in works:
        w.wait()
    w0.wait()
    ok = [bool(torch.equal(t.cpu(), e)) for t, e in checks]
    # the candidates: the same bits on every rank
    identical = all(same_on_every_rank(c) for c in comp + [first])
    # a future chain on a device result (DDP's pattern), on a candidate the
    # policy keeps dense (exact): the callback must see the reduced values
    t = torch.full((1000,), float(rank + 1), device=DEV)
    fut = dist.all_reduce(t, async_op=True, group=g).get_future().then(lambda f: f.value()[0] * 2)
    doubled = fut.wait()
    st = lane_stats(g)
    out = {"delegated_ok": ok, "identical": identical, "returned_before_done": returned_before_done,
           "future_device": str(doubled.device),
           "future_value": bool(torch.equal(doubled.cpu(),
                                            torch.full((1000,), float(world * (world + 1))))),
           "lane_compressed_calls": st["compressed_calls"], "lane_calls": st["calls"],
           "lane_direct_calls": st["direct_calls"]}
    dist.destroy_process_group(g)
    return out


def check_ddp():
    from torch.nn.parallel import DistributedDataParallel as DDP

    g = make_group("dgc")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10)).to(DEV)
    ddp = DDP(model, device_ids=[DEV.index] if LANE == "cuda" else None, process_group=g)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(123 + rank)
    data = torch.randn(64, 64, generator=gen).to(DEV)
    target = torch.randint(0, 10, (64,), generator=gen).to(DEV)
    losses = []
    for _ in range(8):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(data), target)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    st = lane_stats(g)
    out = {"identical_params": same_on_every_rank(params), "losses": losses,
           "lane_calls": st["calls"] if st else 0,
           "lane_compressed_calls": st["compressed_calls"] if st else 0}
    dist.destroy_process_group(g)
    return out


RUNS = {"lazy": check_lazy, "reference": check_reference, "exact": check_exact,
        "async": check_async, "ddp": check_ddp}
result = {"rank": rank, "world": world}
for mode in MODES:
    result[mode] = RUNS[mode]()
emit(result)
dist.destroy_process_group()
