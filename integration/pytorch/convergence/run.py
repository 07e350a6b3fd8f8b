"""compcoll's convergence suite: every task x every algorithm, plain DDP on
"gloo", compression from the environment only. One command:

    python3 integration/pytorch/convergence/run.py                 # full: 200 / 1000 steps
    python3 integration/pytorch/convergence/run.py --quick         # smoke: 20 / 60 steps
    python3 integration/pytorch/convergence/run.py --tasks lm --algos dense,dgc \
        --env COMPCOLL_WARMUP_STEPS=100 --label warmup100 --out /tmp/conv
    python3 integration/pytorch/convergence/run.py --seeds 1,2,3   # mean and range over seeds
    python3 integration/pytorch/convergence/run.py --tasks cnn --algos dense,jitter,dgc \
        --seeds 1,2,3                                              # with the chaos floor

Each run launches --ranks processes of train.py (like torchrun: RANK,
WORLD_SIZE, MASTER_ADDR/PORT) with COMPCOLL_ALGO=<algo> (unset for dense:
plain Gloo, no compcoll at all), COMPCOLL_STATS_FILE and the --env settings.
Every algorithm of a task sees the same seed, initial weights and batches.
Writes OUT/results.json, OUT/results.md (loss and metric at the short and the
long horizon, relative to dense; compression ratio over the whole run from the
stats files and over the last tenth of the run from the per-call trace lines;
wall time) and OUT/loss.png (training loss against step).

With several --seeds every task and algorithm runs once per seed (the seed
draws the initial weights and the batches; each run is compared with dense of
the same seed). results.md then opens with the gap to dense over the seeds
(mean, min and max, and in how many seeds it met 5 % / 2 %) and dense's own
spread between seeds, the noise any single-seed figure carries;
OUT/across_seeds.json holds the same, and the PNG shows the mean curves.
"""
import argparse
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import report  # noqa: E402

ALGOS = ["dense", "dgc", "sbc", "sdagc", "csc", "onebit"]
# Runs on plain Gloo, without compcoll. `jitter` (not in the default --algos)
# is dense from initial weights scaled by 1 + 1e-6 (a few units in float32's
# last place; a single unit is rounded away within a few steps): compared
# with dense like every algorithm, its gap is how far a difference that
# small alone carries a run on the task, the floor under any algorithm's
# gap (docs/convergence.md, "The chaos floor").
PLAIN = {"dense": 0.0, "jitter": 1e-6}  # name -> train.py --perturb
TASK_NAMES = ["lm", "cnn", "mixed"]
# Communicator::allreduce's trace line for every call: "... <key>: W B sent (dense D B), T ms".
CALL_LINE = re.compile(r": (\d+) B sent \(dense (\d+) B\)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(task, algo, seed, args, run_dir):
    """Runs one task with one algorithm on args.ranks processes; returns the
    merged result, or raises with the failing rank's output."""
    os.makedirs(run_dir, exist_ok=True)
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("COMPCOLL_")}
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(args.ranks),
                GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    if algo not in PLAIN:
        base.update(COMPCOLL_ALGO=algo, COMPCOLL_STATS_FILE=os.path.join(run_dir, "stats{rank}.json"))
        # TRACE logs every call's bytes: the ratio late in the run comes from
        # them (the stats file only has the whole run's totals).
        base["COMPCOLL_DEBUG"] = "TRACE"
        base.update(args.env)
    eval_at = sorted(set(window_steps(args.short, args.eval_window) + window_steps(args.long, args.eval_window)))
    cmd = [sys.executable, os.path.join(HERE, "train.py"), "--task", task, "--steps", str(args.long),
           "--eval-at", ",".join(map(str, eval_at)), "--seed", str(seed), "--out", run_dir,
           "--optimizer", args.optimizer, "--perturb", repr(PLAIN.get(algo, 0.0))]
    procs, logs = [], []
    t0 = time.perf_counter()
    for r in range(args.ranks):
        log = open(os.path.join(run_dir, f"log{r}.txt"), "w")
        logs.append(log)
        procs.append(subprocess.Popen(cmd, env=dict(base, RANK=str(r), LOCAL_RANK=str(r)),
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + args.run_timeout
    failed = None
    for r, pr in enumerate(procs):
        try:
            rc = pr.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rc = "timeout"
        if rc != 0 and failed is None:
            failed = (r, rc)
            for other in procs:  # one rank down: the others would wait for it
                if other.poll() is None:
                    os.killpg(other.pid, signal.SIGKILL)
    for log in logs:
        log.close()
    wall = time.perf_counter() - t0
    if failed:
        with open(os.path.join(run_dir, f"log{failed[0]}.txt")) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{task}/{algo}: rank {failed[0]} ended with {failed[1]}:\n{tail}")
    with open(os.path.join(run_dir, "wall.json"), "w") as f:
        json.dump(wall, f)
    with open(os.path.join(run_dir, "args.json"), "w") as f:
        json.dump(run_signature(task, algo, seed, args), f)
    return merge(task, algo, seed, args, run_dir, wall)


def window_steps(horizon, window):
    """The steps whose held-out evaluations are averaged into a horizon's
    figure: the horizon and the window - 1 before it, a fiftieth of the
    horizon apart (1000: 920, 940, ..., 1000 for a window of 5). One
    evaluation alone carries the noise of wherever SGD happens to be at that
    step, dense's included, which is in every algorithm's gap at once: on
    cnn jitter's mean gap over 15 seeds was -0.8 % at step 196 and +4.2 % at
    200 (docs/convergence.md, "The evaluation window")."""
    stride = max(1, horizon // 50)
    return [s for s in (horizon - j * stride for j in reversed(range(window))) if s >= 1]


def at_horizon(evals, horizon, window):
    """The held-out loss and metric at a horizon: their means over its window."""
    points = [evals[str(s)] for s in window_steps(horizon, window)]
    return {"step": horizon, "steps_averaged": len(points),
            "loss": sum(p["loss"] for p in points) / len(points),
            "metric": sum(p["metric"] for p in points) / len(points),
            "loss_at_step": evals[str(horizon)]["loss"]}


def merge(task, algo, seed, args, run_dir, wall):
    ranks = []
    for r in range(args.ranks):
        with open(os.path.join(run_dir, f"rank{r}.json")) as f:
            ranks.append(json.load(f))
    steps = len(ranks[0]["losses"])
    curve = [sum(rk["losses"][i] for rk in ranks) / len(ranks) for i in range(steps)]
    out = {"task": task, "algo": algo, "seed": seed, "label": args.label, "optimizer": args.optimizer,
           "env": args.env if algo not in PLAIN else {},
           "ranks": args.ranks, "short": args.short, "long": args.long,
           "evals": ranks[0]["evals"], "eval_window": args.eval_window,
           "at": {name: at_horizon(ranks[0]["evals"], h, args.eval_window)
                  for name, h in (("short", args.short), ("long", args.long))},
           "train_s": max(rk["train_s"] for rk in ranks),
           "wall_s": wall, "curve": curve}
    if algo in PLAIN:
        out.update(ratio=1.0, compressed_calls=0, calls=None, tail_ratio=1.0, tail_steps=max(1, steps // 10))
    else:
        stats = []
        for r in range(args.ranks):
            with open(os.path.join(run_dir, f"stats{r}.json")) as f:
                stats.append(json.load(f))
        dense_b = sum(s["dense_bytes"] for s in stats)
        wire_b = sum(s["wire_bytes"] for s in stats)
        out.update(ratio=dense_b / wire_b if wire_b else 0.0,
                   compressed_calls=stats[0]["compressed_calls"], calls=stats[0]["calls"])
        out.update(tail_ratio(args, run_dir, steps))
    return out


def tail_ratio(args, run_dir, steps):
    """The compression ratio of the calls in the last tenth of the run (the
    last 100 of 1000 steps), summed over ranks, from the per-call trace lines
    in the ranks' logs; what a warm-up or a dense start costs shows in the
    whole-run ratio, not here. None when the logs have no trace lines."""
    tail = max(1, steps // 10)
    dense_b = wire_b = 0
    for r in range(args.ranks):
        with open(os.path.join(run_dir, f"log{r}.txt"), errors="replace") as f:
            calls = [(int(m.group(1)), int(m.group(2))) for m in map(CALL_LINE.search, f) if m]
        if not calls:
            return {"tail_ratio": None, "tail_steps": tail}
        # Every step makes the same calls once DDP has rebuilt its buckets.
        last = calls[-max(1, round(len(calls) * tail / steps)):]
        wire_b += sum(w for w, _ in last)
        dense_b += sum(d for _, d in last)
    return {"tail_ratio": dense_b / wire_b if wire_b else 0.0, "tail_steps": tail}


def reused(task, algo, seed, args, run_dir):
    """The finished run in run_dir if it ran these horizons with these
    settings (its args.json), else None."""
    try:
        with open(os.path.join(run_dir, "args.json")) as f:
            if json.load(f) != run_signature(task, algo, seed, args):
                return None
        res = merge(task, algo, seed, args, run_dir, wall=float("nan"))
    except (OSError, ValueError, KeyError):
        return None
    with open(os.path.join(run_dir, "wall.json")) as f:
        res["wall_s"] = json.load(f)
    return res


def run_signature(task, algo, seed, args):
    return {"task": task, "algo": algo, "ranks": args.ranks, "short": args.short, "long": args.long,
            "eval_window": args.eval_window, "seed": seed, "optimizer": args.optimizer,
            "env": args.env if algo not in PLAIN else {}}


def parse_env(items):
    env = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k.startswith("COMPCOLL_"):
            raise SystemExit(f"--env {item}: expected COMPCOLL_NAME=VALUE")
        env[k] = v
    return env


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default=",".join(TASK_NAMES))
    p.add_argument("--algos", default=",".join(ALGOS),
                   help="comma-separated; also `jitter`: dense from weights scaled by 1 + 1e-6, "
                        "the task's chaos floor")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--short", type=int, default=200, help="short horizon (steps)")
    p.add_argument("--long", type=int, default=1000, help="long horizon (steps); the run length")
    p.add_argument("--eval-window", type=int, default=5, metavar="N",
                   help="a horizon's held-out loss and metric are the means of N evaluations, the last "
                        "at the horizon, a fiftieth of it apart (1 = the single evaluation at the horizon)")
    p.add_argument("--quick", action="store_true", help="smoke test: short 20, long 60 steps")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--seeds", default=None, metavar="S1,S2,...",
                   help="run every task and algorithm once per seed and report mean and range over them "
                        "(instead of --seed)")
    p.add_argument("--env", action="append", default=[], metavar="COMPCOLL_X=V",
                   help="extra setting for the compressed runs (repeatable)")
    p.add_argument("--optimizer", default="default", choices=["default", "sgd", "sgd0", "adam"],
                   help="override every task's optimizer (default: lm Adam, cnn and mixed SGD+momentum; "
                        "sgd0: SGD without momentum, for COMPCOLL_MOMENTUM)")
    p.add_argument("--label", default="defaults", help="name of this configuration in the report")
    p.add_argument("--out", default="convergence-out")
    p.add_argument("--run-timeout", type=float, default=1800.0, help="seconds per run")
    p.add_argument("--reuse", action="store_true",
                   help="keep the finished runs already under OUT (an interrupted suite goes on)")
    args = p.parse_args(argv)
    if args.quick:
        args.short, args.long = 20, 60
    if not 1 <= args.short <= args.long:
        p.error(f"need 1 <= --short ({args.short}) <= --long ({args.long})")
    if not 1 <= args.eval_window <= 50:
        p.error(f"--eval-window {args.eval_window}: expected 1 to 50 evaluations per horizon")
    args.env = parse_env(args.env)
    try:
        seeds = [args.seed] if args.seeds is None else [int(x) for x in args.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds {args.seeds!r}: expected integers separated by commas, e.g. 1,2,3")
    if len(set(seeds)) != len(seeds):
        p.error(f"--seeds {args.seeds!r} names a seed twice")
    tasks, algos = args.tasks.split(","), args.algos.split(",")
    for t in tasks:
        if t not in TASK_NAMES:
            p.error(f"unknown task {t!r} (tasks: {', '.join(TASK_NAMES)})")

    os.makedirs(args.out, exist_ok=True)
    results = []
    t0 = time.perf_counter()
    for seed, task, algo in itertools.product(seeds, tasks, algos):
        # One seed keeps the layout of single-seed suites (and their --reuse).
        run_dir = os.path.join(args.out, "runs", task, algo, *([] if len(seeds) == 1 else [f"seed{seed}"]))
        res = reused(task, algo, seed, args, run_dir) if args.reuse else None
        if res is None:
            shutil.rmtree(run_dir, ignore_errors=True)
            res = launch(task, algo, seed, args, run_dir)
        results.append(res)
        at = res["at"]
        tail = res.get("tail_ratio")
        print(f"seed {seed} {task:>5} {algo:>7}: loss@{args.short} {at['short']['loss']:.4f}  "
              f"loss@{args.long} {at['long']['loss']:.4f}  "
              f"metric@{args.long} {at['long']['metric']:.4f}  ratio {res['ratio']:.1f}x "
              f"(last tenth {'-' if tail is None else f'{tail:.1f}x'})  "
              f"train {res['train_s']:.1f} s", flush=True)
    print(f"{len(results)} runs in {time.perf_counter() - t0:.0f} s")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(report.summary(results), f, indent=1)
    if len(seeds) > 1:
        with open(os.path.join(args.out, "across_seeds.json"), "w") as f:
            json.dump(report.across_seeds(results), f, indent=1)
    with open(os.path.join(args.out, "curves.json"), "w") as f:
        json.dump([{k: r[k] for k in ("task", "algo", "seed", "curve")} for r in results], f)
    table = report.markdown(results)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table)
    print(table)
    report.plot(results, os.path.join(args.out, "loss.png"))
    print(f"wrote {args.out}/results.json, results.md, loss.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
