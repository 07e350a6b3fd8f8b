"""DDP training of a small MLP on scikit-learn's bundled digits data set, once
per compcoll algorithm, on R local ranks (torch.multiprocessing, Gloo over
loopback). Prints test accuracy, bytes on the wire and the compression ratio
per algorithm, and saves the loss curves as a PNG.

    python3 integration/pytorch/examples/ddp_digits.py
    python3 integration/pytorch/examples/ddp_digits.py --algos dense,dgc --steps 300 \
        --plot /tmp/digits.png --json /tmp/digits.json

The ranks train one algorithm after the other, each run with its own process
group (backend "compcoll", COMPCOLL_ALGO set before the group is created;
dense included, so the dense run reports its bytes on the wire too) and the
same seed, data order and steps. Setting COMPCOLL_ALGO for a script that calls
init_process_group("gloo") gives the same result (see docs/pytorch.md). Bytes
come from the COMPCOLL_STATS_FILE each rank writes when its process group is
destroyed.
"""
import argparse
import json
import os
import sys
import tempfile
import time

ALGOS = ["dense", "dgc", "sbc", "sdagc", "csc", "onebit"]


def load_data(seed):
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    return train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)


def build_model(hidden):
    import torch.nn as nn

    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))


def train(rank, world, args, algo, out_dir):
    """One DDP training run with COMPCOLL_ALGO=algo; rank 0 writes result.json."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    run_dir = os.path.join(out_dir, algo)
    # Read by the backend when the process group is created.
    os.environ["COMPCOLL_ALGO"] = algo
    os.environ["COMPCOLL_STATS_FILE"] = os.path.join(run_dir, "stats{rank}.json")
    dist.init_process_group("compcoll", init_method=f"file://{run_dir}/store", rank=rank,
                            world_size=world)
    x_train, x_test, y_train, y_test = load_data(args.seed)
    x_train, y_train = torch.from_numpy(x_train), torch.from_numpy(y_train)
    # This rank's shard of the training set, in a seeded order.
    shard = torch.arange(rank, len(x_train), world)
    gen = torch.Generator().manual_seed(args.seed + rank)

    torch.manual_seed(args.seed)
    model = DDP(build_model(args.hidden))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    losses = []
    order, pos = shard[torch.randperm(len(shard), generator=gen)], 0
    t0 = time.perf_counter()
    for _ in range(args.steps):
        if pos + args.batch > len(order):
            order, pos = shard[torch.randperm(len(shard), generator=gen)], 0
        idx = order[pos:pos + args.batch]
        pos += args.batch
        opt.zero_grad()
        loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    train_s = time.perf_counter() - t0

    with torch.no_grad():
        pred = model.module(torch.from_numpy(x_test)).argmax(dim=1)
        acc = (pred == torch.from_numpy(y_test)).float().mean().item()
    # Every rank's loss, averaged, for the curve.
    curve = torch.tensor(losses)
    dist.all_reduce(curve)
    curve /= world
    if rank == 0:
        with open(os.path.join(run_dir, "result.json"), "w") as f:
            json.dump({"accuracy": acc, "losses": curve.tolist(), "train_s": train_s}, f)
    dist.destroy_process_group()  # each rank writes its COMPCOLL_STATS_FILE


def worker(rank, world, args, out_dir):
    import torch

    torch.set_num_threads(1)  # the ranks share the machine's cores
    import compcoll  # noqa: F401  registers the "compcoll" backend
    for algo in args.algos.split(","):
        train(rank, world, args, algo, out_dir)


def collect(algo, args, out_dir):
    run_dir = os.path.join(out_dir, algo)
    with open(os.path.join(run_dir, "result.json")) as f:
        result = json.load(f)
    stats = []
    for r in range(args.ranks):
        with open(os.path.join(run_dir, f"stats{r}.json")) as f:
            stats.append(json.load(f))
    wire = sum(s["wire_bytes"] for s in stats) / len(stats)
    dense = sum(s["dense_bytes"] for s in stats) / len(stats)
    result.update(algo=algo, wire_bytes_per_rank=wire, dense_bytes_per_rank=dense,
                  ratio=dense / wire if wire else 0.0,
                  compressed_calls=stats[0]["compressed_calls"], calls=stats[0]["calls"])
    return result


def plot(results, path, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 5))
    w = max(1, args.steps // 50)
    for r in results:
        y = np.convolve(r["losses"], np.ones(w) / w, mode="valid")
        ax.plot(np.arange(len(y)) + w, y,
                label=f"{r['algo']} (acc {100 * r['accuracy']:.1f}%, {r['ratio']:.0f}x)")
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss (mean of {args.ranks} ranks, moving average of {w})")
    ax.set_yscale("log")
    ax.set_title(f"DDP on digits, {args.ranks} ranks, compcoll algorithms")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algos", default=",".join(ALGOS))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=16, help="per rank")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--momentum", type=float, default=0.0,
                   help="optimizer momentum (keep 0 when COMPCOLL_MOMENTUM is set)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--plot", default="ddp_digits_loss.png")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)

    import torch.multiprocessing as mp

    # One machine: keep Gloo on the loopback interface.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory(prefix="ddp-digits-") as out_dir:
        for algo in args.algos.split(","):
            os.makedirs(os.path.join(out_dir, algo))
        t0 = time.perf_counter()
        mp.spawn(worker, args=(args.ranks, args, out_dir), nprocs=args.ranks)
        print(f"{args.ranks} ranks, {args.steps} steps per algorithm, "
              f"{time.perf_counter() - t0:.1f} s in all")
        results = [collect(algo, args, out_dir) for algo in args.algos.split(",")]
    for r in results:
        algo = r["algo"]
        print(f"{algo:>7}: test accuracy {100 * r['accuracy']:6.2f}%  "
              f"wire {r['wire_bytes_per_rank'] / 1e6:9.3f} MB/rank  "
              f"dense {r['dense_bytes_per_rank'] / 1e6:8.3f} MB/rank  ratio {r['ratio']:8.1f}x  "
              f"compressed calls {r['compressed_calls']}/{r['calls']}  (training {r['train_s']:.1f} s)",
              flush=True)
    if args.plot:
        plot(results, args.plot, args)
        print(f"loss curves: {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
