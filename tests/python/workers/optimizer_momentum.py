"""DDP on init_process_group("gloo") with compression from the environment
and an optimizer named per rank: --opt NAME (every rank) or --opt-rank1 NAME
(rank 1 only), NAME one of sgd:M, sgd-nesterov:M, adam[:B1], adamw[:B1],
adam-amsgrad, each also as zero-NAME (torch's ZeroRedundancyOptimizer over
it). --second NAME steps a second optimizer (on its own small model)
after the first. --schedule steps a OneCycleLR schedule (cycle_momentum on,
its default) after each step. --accumulate N runs N backward passes per step without
no_sync(). --reload S reloads the optimizer from its own state_dict() after
step S. Runs --steps steps and prints RESULT {"momentum":
compcoll.stats()["optimizer_momentum"], "moved": ...["optimizer_momentum_moved"],
"beta1": the optimizer's live beta1 after the last step, "beta1_saved": the
one its state_dict() holds, "beta1_after": the live one at a step after
destroy_process_group, "losses": [...], "params": sha256 of the model's
parameters}."""
import argparse
import datetime
import hashlib
import json

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def make(name, params):
    if name.startswith("zero-"):  # torch's ZeroRedundancyOptimizer around the rest
        from torch.distributed.optim import ZeroRedundancyOptimizer

        inner = make(name[len("zero-"):], [torch.zeros(1, requires_grad=True)])
        return ZeroRedundancyOptimizer(params, optimizer_class=type(inner), **inner.defaults)
    kind, _, m = name.partition(":")
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=float(m))
    if kind == "sgd-nesterov":
        return torch.optim.SGD(params, lr=0.05, momentum=float(m), nesterov=True)
    if kind in ("adam", "adamw"):
        cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
        return cls(params, lr=1e-3, betas=(float(m or 0.9), 0.999))
    if kind == "rmsprop":
        return torch.optim.RMSprop(params, lr=1e-3, momentum=float(m or 0))
    if kind == "adam-amsgrad":
        return torch.optim.Adam(params, lr=1e-3, amsgrad=True)
    raise SystemExit(f"unknown optimizer {name}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--opt", default="sgd:0.9")
    p.add_argument("--opt-rank1")
    p.add_argument("--second")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--reload", type=int, default=-1)
    p.add_argument("--schedule", action="store_true",
                   help="a OneCycleLR schedule, cycle_momentum on (its default)")
    p.add_argument("--rank0-probe", default="",
                   help="rank 0 alone first fits a local model with this optimizer")
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
    rank = dist.get_rank()
    if args.rank0_probe and rank == 0:
        # A probe (a learning-rate finder, say) no other rank steps.
        probe = nn.Linear(8, 1)
        popt = make(args.rank0_probe, probe.parameters())
        for _ in range(3):
            popt.zero_grad()
            probe(torch.randn(4, 8)).pow(2).mean().backward()
            popt.step()
        dist.barrier()
    elif args.rank0_probe:
        dist.barrier()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 10)))
    name = args.opt_rank1 if (rank == 1 and args.opt_rank1) else args.opt
    opt = make(name, model.parameters())
    second = make(args.second, nn.Linear(4, 4).parameters()) if args.second else None
    schedule = (torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=args.steps)
                if args.schedule else None)
    losses = []
    for step in range(args.steps):
        gen = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(32, 64, generator=gen)
        y = torch.randint(0, 10, (32,), generator=gen)
        opt.zero_grad()
        for _ in range(args.accumulate):  # without no_sync(): one allreduce per backward
            loss = F.cross_entropy(model(x), y)
            loss.backward()
        opt.step()
        if second is not None:
            second.step()
        if schedule is not None:
            schedule.step()
        losses.append(loss.item())
        if step == args.reload:
            opt.load_state_dict(opt.state_dict())
    import compcoll

    stats = compcoll.stats()
    # ZeRO: its shard optimizer's (ZeRO's own state_dict() is collective, and
    # its step broadcasts: nothing of it after destroy_process_group)
    own = getattr(opt, "optim", opt)
    betas = [g.get("betas", (None,))[0] for g in own.param_groups]
    saved = [g.get("betas", (None,))[0] for g in own.state_dict()["param_groups"]]
    dist.destroy_process_group()
    digest = hashlib.sha256()
    for q in model.parameters():
        digest.update(q.detach().numpy().tobytes())
    after = [None]
    if own is opt:
        opt.step()  # no compcoll group any more: the script's beta1 comes back
        after = [g.get("betas", (None,))[0] for g in opt.param_groups]
    print("RESULT " + json.dumps({"momentum": stats["optimizer_momentum"],
                                  "moved": stats["optimizer_momentum_moved"], "beta1": betas[0],
                                  "beta1_saved": saved[0], "beta1_after": after[0],
                                  "losses": losses, "params": digest.hexdigest()}), flush=True)


if __name__ == "__main__":
    main()
