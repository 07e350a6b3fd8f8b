"""Where would Accordion switch? Its critical-regime detector on the suite's
tasks, trained densely.

Accordion (Agarwal et al. 2021) compresses lightly in "critical regimes" and
heavily elsewhere. It detects them from the gradient: over every interval of
I steps it sums the (averaged) gradients, and the regime is critical when the
norm of that sum changed by at least eta relative to the previous
interval's (eta = 0.5 in the paper, which also uses learning-rate decays as
switch points; the suite's tasks have none). Before building it into the
algorithms, this tool measures where the detector fires on each task, so
that its schedule can be set against the fixed warm-up compcoll has
(COMPCOLL_WARMUP_STEPS): an adaptive schedule can only help where it differs.

    python3 integration/pytorch/convergence/regimes.py                 # every task, seed 1
    python3 integration/pytorch/convergence/regimes.py --tasks lm --seeds 1,2,3 --json out.json

One process per task and seed computes each step's gradient the way dense
DDP does at --ranks ranks: the mean of the ranks' gradients on the same
batches (tasks.batch_at) as the suite's runs, then the task's optimizer: the
update dense DDP makes, with the sum taken in another order (so the rounding
differs). No process group is needed, since only the averaged gradient
matters to the detector.
"""
import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from tasks import TASKS  # noqa: E402


def interval_norms(task_name, seed, steps, ranks, intervals):
    """{I: [norm of the sum of the averaged gradients over steps (j*I, (j+1)*I]]}."""
    task = TASKS[task_name](seed)
    torch.manual_seed(seed)
    model = task.model()
    opt = task.optimizer(model.parameters(), "default")
    params = list(model.parameters())
    sums = {i: [torch.zeros_like(p) for p in params] for i in intervals}
    norms = {i: [] for i in intervals}
    for step in range(steps):
        opt.zero_grad()
        for rank in range(ranks):
            x, y = task.batch_at(rank, ranks, step)
            (task.loss(model(x), y) / ranks).backward()
        for i in intervals:
            for s, p in zip(sums[i], params):
                s += p.grad
            if (step + 1) % i == 0:
                norms[i].append(sum(float(s.pow(2).sum()) for s in sums[i]) ** 0.5)
                for s in sums[i]:
                    s.zero_()
        opt.step()
    return norms


def critical_ends(norms, interval, eta):
    """The steps at which an interval judged critical ends (its successor
    would be compressed lightly)."""
    return [(j + 1) * interval for j in range(1, len(norms))
            if abs(norms[j - 1] - norms[j]) >= eta * norms[j - 1]]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default=",".join(sorted(TASKS)))
    p.add_argument("--seeds", default="1")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--intervals", default="10,25,50,100", help="interval lengths I, in steps")
    p.add_argument("--eta", type=float, default=0.5, help="relative change that marks a critical regime")
    p.add_argument("--json", help="write every interval norm and verdict here")
    args = p.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        p.error(f"--tasks: unknown {unknown}; the tasks are {sorted(TASKS)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
        intervals = sorted({int(i) for i in args.intervals.split(",") if i})
    except ValueError as e:
        p.error(f"--seeds and --intervals take comma-separated integers ({e})")
    if not seeds:
        p.error("--seeds names no seed")
    if not intervals or intervals[0] < 1 or intervals[-1] * 2 > args.steps:
        p.error(f"--intervals {args.intervals}: each must be >= 1 and fit twice in --steps {args.steps}")
    if args.ranks < 1 or not args.eta > 0:
        p.error("--ranks must be >= 1 and --eta > 0")
    torch.set_num_threads(1)

    out = []
    print(f"Accordion's detector, eta {args.eta}: the steps at which a critical interval ends")
    print("| task | seed | interval | critical intervals end at | last |")
    print("|---|---|---|---|---|")
    for task in tasks:
        for seed in seeds:
            norms = interval_norms(task, seed, args.steps, args.ranks, intervals)
            for i in intervals:
                ends = critical_ends(norms[i], i, args.eta)
                out.append({"task": task, "seed": seed, "interval": i, "norms": norms[i],
                            "critical_ends": ends})
                shown = ", ".join(map(str, ends)) if ends else "none"
                print(f"| {task} | {seed} | {i} | {shown} | {ends[-1] if ends else '-'} |",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"eta": args.eta, "steps": args.steps, "ranks": args.ranks, "runs": out}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
