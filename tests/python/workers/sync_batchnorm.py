"""torch's SyncBatchNorm autograd Function over compcoll (see test_scope.py).

SyncBatchNorm runs its kernels on CUDA only; here the five it calls are
replaced by equivalents on CPU tensors (2-D input, N x C), so that the
Function's own collectives (an all_gather of the statistics forward, an
allreduce of sum_dy and sum_dy_xmu backward: 2C floats) run as torch wrote
them. Trains STEPS steps and reports compcoll's stats and the input
gradients' checksum, which must equal a plain Gloo run's.
"""
import os

import torch
import torch.distributed as dist
from torch.nn.modules._functions import SyncBatchNorm

from common import emit, init


def batch_norm_stats(x, eps):
    return x.mean(0), (x.var(0, unbiased=False) + eps).rsqrt()


def gather_stats_with_counts(x, mean_all, invstd_all, running_mean, running_var, momentum, eps,
                             counts):
    c = counts.view(-1, 1)
    n = c.sum()
    mean = (mean_all * c).sum(0) / n
    var = ((invstd_all.pow(-2) - eps + (mean_all - mean) ** 2) * c).sum(0) / n
    return mean, (var + eps).rsqrt()


def elemt(x, weight, bias, mean, invstd, eps):
    return (x - mean) * invstd * weight + bias


def backward_reduce(dy, x, mean, invstd, weight, input_g, weight_g, bias_g):
    sum_dy = dy.sum(0)
    sum_dy_xmu = (dy * (x - mean)).sum(0)
    return sum_dy, sum_dy_xmu, sum_dy_xmu * invstd, sum_dy


def backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    n = count.sum()
    return (dy - sum_dy / n - (x - mean) * invstd ** 2 * sum_dy_xmu / n) * invstd * weight


torch.batch_norm_stats = batch_norm_stats
torch.batch_norm_gather_stats_with_counts = gather_stats_with_counts
torch.batch_norm_elemt = elemt
torch.batch_norm_backward_reduce = backward_reduce
torch.batch_norm_backward_elemt = backward_elemt


def main():
    rank, world = init("gloo")
    channels = int(os.environ.get("CHANNELS", "8192"))
    g = torch.Generator().manual_seed(rank)
    weight = torch.ones(channels, requires_grad=True)
    bias = torch.zeros(channels, requires_grad=True)
    running_mean, running_var = torch.zeros(channels), torch.ones(channels)
    checksum = 0.0
    for _ in range(int(os.environ.get("STEPS", "3"))):
        x = torch.randn(8, channels, generator=g, requires_grad=True)
        y = SyncBatchNorm.apply(x, weight, bias, running_mean, running_var, 1e-5, 0.1,
                                dist.group.WORLD, world)
        (y * torch.randn(8, channels, generator=g)).sum().backward()
        checksum += float(x.grad.double().abs().sum())
    out = {"checksum": checksum}
    try:
        import compcoll
        if compcoll.backend_of(None) is not None:
            out["stats"] = compcoll.stats(None)
    except ImportError:
        pass
    emit(out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
