r"""DDP training of a small MLP on scikit-learn's bundled digits data set on R
local ranks (torch.multiprocessing, Gloo over loopback). Prints test accuracy,
bytes on the wire and the compression ratio, and saves the loss curves as a
PNG. Two modes:

Your environment (COMPCOLL_ALGO set): one training run with exactly the
environment you gave, every COMPCOLL_* variable as you set it; the ranks ask
for init_process_group("gloo"), like an unmodified script, so compression
comes from compcoll's activation by environment alone:

    COMPCOLL_ALGO=sbc python3 integration/pytorch/examples/ddp_digits.py
    COMPCOLL_ALGO=dgc COMPCOLL_DENSITY=0.01 COMPCOLL_STATS_FILE=/tmp/stats{rank}.json \
        python3 integration/pytorch/examples/ddp_digits.py --steps 200

Comparison (COMPCOLL_ALGO unset): one run per algorithm of --algos [all],
one after the other, each with its own process group (backend "compcoll",
COMPCOLL_ALGO set for that run before the group is created; dense included,
so the dense run reports its bytes on the wire too) and the same seed, data
order and steps; the other COMPCOLL_* variables you set apply to every run:

    python3 integration/pytorch/examples/ddp_digits.py
    python3 integration/pytorch/examples/ddp_digits.py --algos dense,dgc --steps 300 \
        --plot /tmp/digits.png --json /tmp/digits.json

Bytes come from the COMPCOLL_STATS_FILE each rank writes when its process
group is destroyed: yours if you set it (in comparison mode it must contain
{algo}, since every run writes its own), else one in a temporary directory.
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


def train(rank, world, args, run):
    """One DDP training run (a Run: algo, backend, run_dir, the environment
    it sets); rank 0 writes result.json."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    # Read by the backend when the process group is created. Empty in your
    # environment's mode: nothing of yours is overwritten.
    os.environ.update(run.environ)
    dist.init_process_group(run.backend, init_method=f"file://{run.run_dir}/store", rank=rank,
                            world_size=world)
    # What the group really got: "compcoll" when compression is active (the
    # gloo group's cpu backend is compcoll's under activation by environment).
    cpu_backend = dist.group.WORLD._get_backend(torch.device("cpu")).name()
    if run.algo != "dense" and cpu_backend != "compcoll":
        raise RuntimeError(
            f"COMPCOLL_ALGO={run.algo} but the process group's backend is {cpu_backend}: "
            "compcoll is not installed in this interpreter, or its activation at `import torch` "
            "is off (TORCH_DEVICE_BACKEND_AUTOLOAD=0; then run this with python3 -m compcoll.run)")
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
        with open(os.path.join(run.run_dir, "result.json"), "w") as f:
            json.dump({"accuracy": acc, "losses": curve.tolist(), "train_s": train_s,
                       "backend": dist.get_backend(), "cpu_backend": cpu_backend}, f)
    dist.destroy_process_group()  # each rank writes its COMPCOLL_STATS_FILE


def worker(rank, world, args, runs):
    import torch

    torch.set_num_threads(1)  # the ranks share the machine's cores
    if any(run.backend == "compcoll" for run in runs):
        import compcoll  # noqa: F401  registers the "compcoll" backend
    for run in runs:
        train(rank, world, args, run)


class Run:
    """One training run: the algorithm, the backend the ranks ask for, where
    its files go, the COMPCOLL_* variables it sets, its stats file template."""

    def __init__(self, algo, backend, run_dir, environ, stats_file):
        self.algo, self.backend, self.run_dir = algo, backend, run_dir
        self.environ, self.stats_file = environ, stats_file


def plan_runs(args, out_dir, environ):
    """The runs, honouring the caller's environment: with COMPCOLL_ALGO set,
    one run in that environment, untouched; else one per --algos entry.
    Returns (runs, error message or None)."""
    user_algo = environ.get("COMPCOLL_ALGO", "").strip()
    user_stats = environ.get("COMPCOLL_STATS_FILE", "").strip()
    if user_algo:
        if args.algos:
            return None, (f"COMPCOLL_ALGO={user_algo} is set and --algos {args.algos} asks for a "
                          "comparison: unset COMPCOLL_ALGO to compare, or drop --algos to train "
                          "with your environment")
        run_dir = os.path.join(out_dir, "run")
        # Your stats file if you named one; else one of ours, set for the
        # run only because you left it unset.
        env = {} if user_stats else {"COMPCOLL_STATS_FILE": os.path.join(run_dir, "stats{rank}.json")}
        return [Run(user_algo, "gloo", run_dir, env, user_stats or env["COMPCOLL_STATS_FILE"])], None
    if user_stats and "{algo}" not in user_stats:
        return None, (f"COMPCOLL_STATS_FILE={user_stats} would be written by every algorithm of "
                      "the comparison in turn: put {algo} in it (each run writes its own), or "
                      "set COMPCOLL_ALGO to train one algorithm")
    runs = []
    for algo in (args.algos or ",".join(ALGOS)).split(","):
        run_dir = os.path.join(out_dir, algo)
        stats = (user_stats.replace("{algo}", algo) if user_stats
                 else os.path.join(run_dir, "stats{rank}.json"))
        runs.append(Run(algo, "compcoll", run_dir, {"COMPCOLL_ALGO": algo, "COMPCOLL_STATS_FILE": stats},
                        stats))
    return runs, None


def collect(run, args):
    with open(os.path.join(run.run_dir, "result.json")) as f:
        result = json.load(f)
    result.update(algo=run.algo, stats_files=[], wire_bytes_per_rank=None,
                  dense_bytes_per_rank=None, ratio=None, compressed_calls=None, calls=None,
                  warmup_dense_calls=None, steady_ratio=None)
    paths = [run.stats_file.replace("{rank}", str(r)) for r in range(args.ranks)]
    if not all(os.path.exists(p) for p in paths):
        # Plain Gloo (COMPCOLL_ALGO=dense in your environment): compcoll was
        # not in the process group, so nothing counted the bytes.
        return result
    stats = []
    for path in paths:
        with open(path) as f:
            stats.append(json.load(f))
    wire = sum(s["wire_bytes"] for s in stats) / len(stats)
    dense = sum(s["dense_bytes"] for s in stats) / len(stats)
    result.update(stats_files=paths, wire_bytes_per_rank=wire, dense_bytes_per_rank=dense,
                  ratio=dense / wire if wire else 0.0,
                  compressed_calls=stats[0]["compressed_calls"], calls=stats[0]["calls"],
                  warmup_dense_calls=stats[0].get("warmup_dense_calls", 0),
                  # The calls after their tensor's warm-up (0: none yet).
                  steady_ratio=sum(s.get("steady_ratio", 0.0) for s in stats) / len(stats))
    return result


def describe(r):
    head = f"{r['algo']:>7}: test accuracy {100 * r['accuracy']:6.2f}%  "
    tail = f"  (backend {r['backend']}, cpu backend {r['cpu_backend']}; training {r['train_s']:.1f} s)"
    if r["wire_bytes_per_rank"] is None:
        return head + "wire not counted (plain Gloo: compcoll not active)" + tail
    return (head + f"wire {r['wire_bytes_per_rank'] / 1e6:9.3f} MB/rank  "
            f"dense {r['dense_bytes_per_rank'] / 1e6:8.3f} MB/rank  ratio {r['ratio']:8.1f}x  "
            f"after the warm-up {steady_text(r)}  "
            f"compressed calls {r['compressed_calls']}/{r['calls']}"
            + (f" ({r['warmup_dense_calls']} dense in the warm-up)" if r["warmup_dense_calls"] else "")
            + tail)


def steady_text(r):
    return f"{r['steady_ratio']:8.1f}x" if r["steady_ratio"] else "    none"


def warmup_note(args):
    """What the ratios above include: the warm-up's calls (a tensor's first
    COMPCOLL_WARMUP_STEPS), said once, with the setting's value."""
    from compcoll import _C

    default = next(v[1] for v in _C.config_variables() if v[0] == "COMPCOLL_WARMUP_STEPS")
    steps = int(os.environ.get("COMPCOLL_WARMUP_STEPS", default))
    if steps == 0:
        return "no warm-up (COMPCOLL_WARMUP_STEPS=0): the ratios are the steady state's"
    return (f"'ratio' is over the whole run, 'after the warm-up' over the calls after it: the first "
            f"{min(steps, args.steps)} of {args.steps} steps are the warm-up (COMPCOLL_WARMUP_STEPS="
            f"{steps}), in which dgc, sdagc and sbc send more and csc and onebit run dense")


def plot(results, path, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 5))
    w = max(1, args.steps // 50)
    for r in results:
        y = np.convolve(r["losses"], np.ones(w) / w, mode="valid")
        ratio = f", {r['ratio']:.0f}x" if r["ratio"] is not None else ""
        ax.plot(np.arange(len(y)) + w, y, label=f"{r['algo']} (acc {100 * r['accuracy']:.1f}%{ratio})")
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss (mean of {args.ranks} ranks, moving average of {w})")
    ax.set_yscale("log")
    ax.set_title(f"DDP on digits, {args.ranks} ranks, compcoll algorithms")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algos", default="",
                   help=f"algorithms to compare (default {','.join(ALGOS)}; not with COMPCOLL_ALGO set)")
    p.add_argument("--ranks", type=int, default=4)
    # Past the default warm-up (COMPCOLL_WARMUP_STEPS, plugin/config.cc), so every
    # algorithm's steady state shows in the ratio.
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch", type=int, default=16, help="per rank")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--momentum", type=float, default=0.0,
                   help="optimizer momentum (keep 0 when COMPCOLL_MOMENTUM is set)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--plot", default="ddp_digits_loss.png", help="PNG of the loss curves ('' for none)")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    if args.ranks < 1 or args.steps < 1 or args.batch < 1:
        p.error("--ranks, --steps and --batch must be at least 1")

    with tempfile.TemporaryDirectory(prefix="ddp-digits-") as out_dir:
        runs, error = plan_runs(args, out_dir, os.environ)
        if error:
            p.error(error)
        for run in runs:
            os.makedirs(run.run_dir)
        import torch.multiprocessing as mp

        # One machine: keep Gloo on the loopback interface (unless you chose one).
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        mode = "your environment" if len(runs) == 1 and runs[0].backend == "gloo" else "comparison"
        t0 = time.perf_counter()
        mp.spawn(worker, args=(args.ranks, args, runs), nprocs=args.ranks)
        print(f"{args.ranks} ranks, {args.steps} steps per run ({mode}), "
              f"{time.perf_counter() - t0:.1f} s in all")
        results = [collect(run, args) for run in runs]
    for r in results:
        print(describe(r), flush=True)
    if any(r["ratio"] is not None for r in results):
        print(warmup_note(args))
    if args.plot:
        plot(results, args.plot, args)
        print(f"loss curves: {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
