"""A data-parallel training script that checkpoints: steps [--start, --stop)
of a small MLP whose gradients travel as one persistent flat buffer
(dist.all_reduce on init_process_group("gloo"); compression from the
environment only). The batches depend on (rank, step) alone, so a run
resumed from a checkpoint sees the data an uninterrupted one does.

--ckpt DIR: load DIR/rank{r}.pt first when --start > 0; save it after
--stop. --compcoll-state: the checkpoint includes compcoll.state_dict()
(and loading restores it); without it, state travels only if
COMPCOLL_STATE_DIR is set. --compcoll-from-rank R: every rank loads
compcoll's part of rank R's checkpoint (the "save on rank 0, load
everywhere" mistake). --compcoll-none-on-rank R: that rank passes None (it
has no checkpoint). --compcoll-garbage-on-rank R: that rank passes a dict
that is not a state_dict (it raises ValueError; recorded in "restored"). --adam: torch.optim.Adam instead of SGD with momentum
0.9. Prints RESULT {"params": [...], "losses": [...]}.
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--start", type=int, required=True)
    p.add_argument("--stop", type=int, required=True)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--compcoll-state", action="store_true")
    p.add_argument("--adam", action="store_true")
    p.add_argument("--compcoll-from-rank", type=int, default=None)
    p.add_argument("--compcoll-none-on-rank", type=int, default=None)
    p.add_argument("--compcoll-garbage-on-rank", type=int, default=None)
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    if args.adam:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    params = list(model.parameters())
    flat = torch.zeros(sum(q.numel() for q in params))  # one persistent buffer: one key
    path = os.path.join(args.ckpt, f"rank{rank}.pt")
    restored = None
    if args.start > 0:
        ck = torch.load(path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        if args.compcoll_state:
            import compcoll
            theirs = ck["compcoll"]
            if args.compcoll_from_rank is not None:
                theirs = torch.load(os.path.join(args.ckpt, f"rank{args.compcoll_from_rank}.pt"))["compcoll"]
            if args.compcoll_none_on_rank == rank:
                theirs = None
            if args.compcoll_garbage_on_rank == rank:
                theirs = {"format": "not compcoll's"}
            try:
                restored = compcoll.load_state_dict(None, theirs)
            except ValueError as e:
                restored = f"ValueError: {e}"

    losses = []
    for step in range(args.start, args.stop):
        gen = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(32, 64, generator=gen)
        y = torch.randint(0, 10, (32,), generator=gen)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        torch.cat([q.grad.reshape(-1) for q in params], out=flat)
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        off = 0
        for q in params:
            q.grad.copy_(flat[off:off + q.numel()].view_as(q))
            off += q.numel()
        opt.step()
        losses.append(loss.item())

    ck = {"model": model.state_dict(), "opt": opt.state_dict()}
    if args.compcoll_state:
        import compcoll
        ck["compcoll"] = compcoll.state_dict()
    os.makedirs(args.ckpt, exist_ok=True)
    torch.save(ck, path)
    out = torch.cat([q.detach().reshape(-1) for q in params])
    print("RESULT " + json.dumps({"params": out.view(torch.int32).tolist(), "losses": losses,
                                  "restored": restored}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
