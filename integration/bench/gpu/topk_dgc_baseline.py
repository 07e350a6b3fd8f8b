"""The yardstick for compcoll's GPU dgc encoder: DGC written the obvious way
in PyTorch on the same GPU (torch.topk for the threshold), per step on a
gradient of N floats, with the payload (k values and indices) copied to the
host as compcoll's encoder does. Also times a device-to-device copy of the
gradient. Prints one JSON line.

    python3 integration/bench/gpu/topk_dgc_baseline.py [--n 25557032] [--density 0.001]

docs/gpu.md compares it with compcoll_gpu_tests'
GpuCodecs.ReportsDgcEncodeThroughputOnAResNet50SizedGradient.
"""
import argparse
import json
import sys

import torch


def timed(fn, iters):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=25557032)
    ap.add_argument("--density", type=float, default=0.001)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("topk_dgc_baseline: needs a CUDA device (torch.cuda.is_available() is False)")
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(1)
    g = torch.randn(a.n, device=dev, generator=gen)
    u = torch.zeros_like(g)
    v = torch.zeros_like(g)
    k = max(1, int(a.n * a.density))

    def dgc_step():
        # Momentum correction and accumulation, the exact top-k of |v|, the
        # payload to the host, then the sent entries leave u and v.
        u.mul_(a.momentum).add_(g)
        v.add_(u)
        idx = torch.topk(v.abs(), k, sorted=False).indices
        vals = v[idx]
        payload = (vals.to("cpu", non_blocking=False), idx.to(torch.int32).to("cpu"))
        v[idx] = 0
        u[idx] = 0
        return payload

    copy_dst = torch.empty_like(g)
    copy_ms = timed(lambda: copy_dst.copy_(g), 50)
    step_ms = timed(dgc_step, a.iters)
    print(json.dumps({
        "device": torch.cuda.get_device_name(),
        "n": a.n, "k": k,
        "topk_dgc_ms": round(step_ms, 3),
        "topk_dgc_compulsory_gbps": round(5 * a.n * 4 / (step_ms * 1e6), 1),
        "d2d_copy_ms": round(copy_ms, 4),
        "d2d_copy_gbps": round(2 * a.n * 4 / (copy_ms * 1e6), 1),
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
