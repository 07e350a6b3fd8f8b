"""What host staging costs a GPU allreduce today: per-call time of an
allreduce of N floats on one GPU through the compcoll backend's cuda lane
(the gradient copied to pinned host memory, the CPU codec with its state on
the host, the result copied back), against torch's own NCCL and against
the two copies alone, and against the same allreduce of a CPU tensor (the
host path with no staging). World size 1 (NCCL refuses two ranks on one
GPU), so no payload travels: what is timed is what staging adds to every
call.

    python3 integration/bench/gpu/staging_cost.py [--n 25557032] [--iters 10] [--algos dense,dgc,onebit]

Prints one JSON line per row. Each row runs in its own process
(COMPCOLL_ALGO is read when the group is made), steady state
(COMPCOLL_WARMUP_STEPS=0), a fresh Gaussian gradient before every call,
median of --iters calls after two untimed ones; the compcoll rows also
report the stats file's compressed_calls, so a row that was not compressed
says so, and comm_ms: the communicator's own time per call (codec and
exchange, mean over every call), so that ms - comm_ms is the lane's (the
copies, the queue, the streams). docs/gpu.md quotes it.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from child_rows import run_row


def child(backend, n, iters, device):
    import torch
    import torch.distributed as dist
    if backend == "compcoll":
        import compcoll  # noqa: F401  registers the backend
    dist.init_process_group(backend, rank=0, world_size=1,
                            init_method=f"file://{tempfile.mktemp(prefix='staging-store-')}")
    t = torch.empty(n, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = []
    for i in range(iters + 2):
        t.normal_()
        sync()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        sync()
        if i >= 2:
            times.append((time.perf_counter() - t0) * 1e3)
    dist.destroy_process_group()
    return statistics.median(times)


def copies(n, iters):
    """The staging's two copies alone: device -> pinned host -> device."""
    import torch
    t = torch.randn(n, device="cuda")
    host = torch.empty(n, pin_memory=True)
    times = []
    for i in range(iters + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        host.copy_(t, non_blocking=True)
        t.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        if i >= 2:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=25557032)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--algos", default="dense,dgc,onebit")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps({"ms": child(a.child, a.n, a.iters, a.device)}))
        return
    import torch
    if not torch.cuda.is_available():
        sys.exit("staging_cost: needs a CUDA device (torch.cuda.is_available() is False)")
    rows = [("nccl", None, "cuda"), ("copies", None, "cuda")]
    for x in a.algos.split(","):
        rows += [("compcoll", x, "cuda"), ("compcoll", x, "cpu")]
    for backend, algo, device in rows:
        row = {"backend": backend, "algo": algo, "device": device, "n": a.n}
        if backend == "copies":
            row["ms"] = round(copies(a.n, a.iters), 3)
            print(json.dumps(row), flush=True)
            continue
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
            if algo:
                env.update(COMPCOLL_ALGO=algo, COMPCOLL_WARMUP_STEPS="0",
                           COMPCOLL_STATS_FILE=os.path.join(d, "stats-{rank}.json"))
            out = run_row([sys.executable, __file__, "--child", backend, "--n", str(a.n),
                           "--iters", str(a.iters), "--device", device], env,
                          os.path.join(d, "stats-0.json"), row)
            if out is not None:
                row["ms"] = round(out["ms"], 3)
                s = out["stats"]
                if s and s.get("calls"):
                    row["comm_ms"] = round(s["time_ms"] / s["calls"], 3)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
