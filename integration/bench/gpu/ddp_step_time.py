"""What compression costs an unmodified DDP training step on one GPU: the
median step time (forward, backward with DDP's bucketed allreduces, SGD
step) of the same model under torch's NCCL, under NCCL with the compcoll
interposer preloaded (LD_PRELOAD=libcompcoll_nccl.so COMPCOLL_ALGO=...:
the GPU codecs on device memory, COMPCOLL_DEVICE_CODECS=on, and staged
through host memory with the CPU codec, =off), and on the compcoll backend's
cuda lane (init_process_group("compcoll"), staged).

    python3 integration/bench/gpu/ddp_step_time.py --interposer PATH/libcompcoll_nccl.so \
        [--params-m 25] [--steps 20] [--algos dgc] [--codec-threads 1,8]

World size 1 (NCCL refuses two ranks on one GPU), so no payload crosses a
link: the rows say what compcoll adds to every step (staging copies, the
codec, its bookkeeping), which a multi-node job pays on top of its
(smaller) traffic. Each row runs in its own process (LD_PRELOAD and
COMPCOLL_* are read at start), at the steady state (COMPCOLL_WARMUP_STEPS=0),
median of --steps steps after three untimed ones. Compressed rows also report
the stats file's compressed and total calls, so a row that compressed nothing
says so. Prints one JSON line per row; docs/gpu.md quotes it.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from child_rows import run_row


def child(backend, params_m, steps):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    if backend == "compcoll":
        import compcoll  # noqa: F401  registers the backend
    dist.init_process_group(backend, rank=0, world_size=1,
                            init_method=f"file://{tempfile.mktemp(prefix='ddp-step-store-')}")
    torch.manual_seed(0)
    width = 2048
    layers = max(1, round(params_m * 1e6 / (width * width + width)))
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU())
                                  for _ in range(layers)]).cuda()
    ddp = DDP(model, device_ids=[0])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(256, width, device="cuda")
    target = torch.randn(256, width, device="cuda")
    times, losses = [], []
    for i in range(steps + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(ddp(x), target)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if i >= 3:
            times.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.item())
    dist.destroy_process_group()
    n = sum(p.numel() for p in model.parameters())
    return {"step_ms": statistics.median(times), "params": n, "last_loss": losses[-1]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--interposer", help="libcompcoll_nccl.so (its rows are left out without it)")
    p.add_argument("--params-m", type=float, default=25.0, help="model size, millions of parameters")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--algos", default="dgc")
    p.add_argument("--codec-threads", default="1,8", help="COMPCOLL_CODEC_THREADS values to time")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.params_m, a.steps)))
        return
    import torch
    if not torch.cuda.is_available():
        sys.exit("ddp_step_time: needs a CUDA device (torch.cuda.is_available() is False)")
    # (backend, algo, COMPCOLL_CODEC_THREADS, preload the interposer, COMPCOLL_DEVICE_CODECS)
    rows = [("nccl", None, None, False, None)]
    for algo in a.algos.split(","):
        if a.interposer:
            rows.append(("nccl", algo, "1", True, "on"))
        for threads in a.codec_threads.split(","):
            if a.interposer:
                rows.append(("nccl", algo, threads, True, "off"))
            rows.append(("compcoll", algo, threads, False, None))
    for backend, algo, threads, preload, codecs in rows:
        path = "torch"
        if preload:
            path = "interposer, GPU codecs" if codecs == "on" else "interposer, staged"
        elif backend == "compcoll":
            path = "cuda lane, staged"
        row = {"backend": backend, "path": path, "algo": algo or "dense"}
        if codecs != "on" and algo:
            row["codec_threads"] = threads
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29534")
            if algo:
                env.update(COMPCOLL_ALGO=algo, COMPCOLL_WARMUP_STEPS="0", COMPCOLL_CODEC_THREADS=threads,
                           COMPCOLL_STATS_FILE=os.path.join(d, "stats-{rank}.json"))
            if codecs:
                env["COMPCOLL_DEVICE_CODECS"] = codecs
            if preload:
                env["LD_PRELOAD"] = os.path.abspath(a.interposer)
            out = run_row([sys.executable, __file__, "--child", backend, "--params-m", str(a.params_m),
                           "--steps", str(a.steps)], env, os.path.join(d, "stats-0.json"), row, error_lines=3)
            if out is not None:
                row.update(step_ms=round(out["step_ms"], 2), params=out["params"],
                           last_loss=round(out["last_loss"], 5))
                if algo and out["stats"] is None:
                    row["compressed_calls"] = "no stats file"
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
