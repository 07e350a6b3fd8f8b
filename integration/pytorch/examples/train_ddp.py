r"""A plain PyTorch DDP training script: it knows nothing about compcoll.

It asks for the "gloo" backend and takes its rank and world size from
torchrun, as any DDP script does. compcoll compresses its gradient
allreduces when the environment says so, without a line changed here:

    torchrun --standalone --nproc-per-node 4 integration/pytorch/examples/train_ddp.py
    COMPCOLL_ALGO=dgc COMPCOLL_STATS_FILE=/tmp/stats{rank}.json \
        torchrun --standalone --nproc-per-node 4 integration/pytorch/examples/train_ddp.py

The second run writes /tmp/stats0.json ... /tmp/stats3.json when the process
group is destroyed: compressed_calls, wire_bytes and ratio say what
compcoll did (docs/pytorch.md). The model is a small MLP on scikit-learn's
bundled digits images (no download); rank 0 prints the loss and the test
accuracy.
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def load_digits_tensors(seed):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=seed,
                                                        stratify=y)
    return x_train, x_test, y_train, y_test


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Past compcoll's default warm-up (COMPCOLL_WARMUP_STEPS): the stats show the steady state too.
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()

    torch.set_num_threads(1)  # several ranks share this machine's cores
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()

    x_train, x_test, y_train, y_test = load_digits_tensors(args.seed)
    shard = torch.arange(rank, len(x_train), world)  # this rank's part of the data
    gen = torch.Generator().manual_seed(args.seed + rank)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                              nn.Linear(256, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    for step in range(1, args.steps + 1):
        idx = shard[torch.randint(len(shard), (args.batch,), generator=gen)]
        opt.zero_grad()
        loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
        loss.backward()  # DDP allreduces the gradients here
        opt.step()
        if rank == 0 and (step % 100 == 0 or step == args.steps):
            print(f"step {step}: loss {loss.item():.4f}", flush=True)

    with torch.no_grad():
        correct = (model.module(x_test).argmax(dim=1) == y_test).sum()
    if rank == 0:
        print(f"test accuracy {100.0 * correct.item() / len(y_test):.2f}% "
              f"({world} ranks, backend {dist.get_backend()})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
