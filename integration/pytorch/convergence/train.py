"""One rank of one convergence run: a plain DDP training script.

It knows nothing of compcoll: it asks for init_process_group("gloo") and gets
compression only when the environment says so (COMPCOLL_ALGO etc., through
the installed package's autoload entry point), exactly as an unmodified user
script would. Launched by run.py like torchrun does (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT in the environment):

    python3 train.py --task lm --steps 800 --eval-at 200,800 --out DIR

--perturb X multiplies every initial weight by 1 + X (the suite's `jitter`
control, X = 1e-6, about 8 units in float32's last place: dense training from
weights a few roundings away, to measure how far two runs that differ by
that little drift apart on a task; run.py, docs/convergence.md).

Writes DIR/rank{RANK}.json: the training loss of every step on this rank,
and (rank 0) the held-out loss and metric at every --eval-at step and the
wall time of the training steps (evaluation excluded).
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tasks import TASKS  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--task", required=True, choices=sorted(TASKS))
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--eval-at", default="", help="comma-separated steps (after that many updates)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True)
    p.add_argument("--optimizer", default="default", choices=["default", "sgd", "sgd0", "adam"])
    p.add_argument("--perturb", type=float, default=0.0,
                   help="multiply every initial weight by 1 + this (relative, e.g. 1e-6)")
    args = p.parse_args(argv)
    if not 0.0 <= args.perturb <= 1e-3:
        p.error(f"--perturb {args.perturb}: expected a relative change in [0, 1e-3]")
    eval_at = sorted({int(s) for s in args.eval_at.split(",") if s})
    if any(s < 1 or s > args.steps for s in eval_at):
        p.error(f"--eval-at {args.eval_at}: every step must be in [1, --steps={args.steps}]")

    torch.set_num_threads(1)  # the ranks share a few cores
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    task = TASKS[args.task](args.seed)
    torch.manual_seed(args.seed)
    net = task.model()
    if args.perturb:
        with torch.no_grad():
            for t in net.parameters():
                t.mul_(1.0 + args.perturb)
    model = DDP(net, **task.ddp_kwargs)  # broadcasts rank 0's weights
    opt = task.optimizer(model.parameters(), args.optimizer)

    losses, evals, train_s = [], {}, 0.0
    for step in range(args.steps):
        x, y = task.batch_at(rank, world, step)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = task.loss(model(x), y)
        loss.backward()
        opt.step()
        train_s += time.perf_counter() - t0
        losses.append(loss.item())
        if step + 1 in eval_at and rank == 0:
            model.eval()
            evals[str(step + 1)] = task.evaluate(model.module)
            model.train()
    result = {"rank": rank, "losses": losses, "train_s": train_s}
    if rank == 0:
        result["evals"] = {s: {"loss": l, "metric": m} for s, (l, m) in evals.items()}
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()  # compcoll writes COMPCOLL_STATS_FILE here
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without finalizing the interpreter. destroy_process_group() does
    # not stop torch's Gloo worker threads (torch keeps the group alive), and
    # those threads drop each finished work item only after waking its
    # waiter; the item holds Python objects from the thread that issued it,
    # so a drop that comes while the interpreter finalizes aborts the process
    # ("terminate called without an active exception", in ProcessGroupGloo's
    # runLoop; 1 in 18-100 plain-Gloo runs of the mixed task here). Every
    # result is on disk by now: rank{RANK}.json above, compcoll's stats file
    # in destroy_process_group().
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
