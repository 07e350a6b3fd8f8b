"""The process group's lifecycle in one process (REINIT_MODE):
- reinit: DDP trains, the group is destroyed (DDP still holding its
  backend), and a group is created again on another port, which trains
  too; reports each phase's state files, by name and hash.
- fork: a child forked after the group was made exits normally; reports
  how long it took (it must not finish the parent's groups)."""
import hashlib
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from common import emit

mode = os.environ["REINIT_MODE"]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def files(d):
    return {name: hashlib.sha1(open(os.path.join(d, name), "rb").read()).hexdigest()[:12]
            for name in sorted(os.listdir(d))} if d and os.path.isdir(d) else {}


def train(steps, seed):
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(seed * 10 + rank)
    for _ in range(steps):
        x, y = torch.randn(32, 256, generator=g), torch.randint(0, 8, (32,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


out = {}
if mode == "reinit":
    state_dir = os.environ.get("COMPCOLL_STATE_DIR")
    held = []
    for phase in (1, 2):
        store = os.path.join(os.environ["TEST_DIR"], f"store{phase}")
        dist.init_process_group("gloo", init_method=f"file://{store}",
                                rank=rank, world_size=world, timeout=timedelta(seconds=30))
        held.append(train(6, phase))  # DDP keeps its backend alive past destroy
        dist.barrier()
        dist.destroy_process_group()
        time.sleep(0.2)
        out[f"files_after_phase{phase}"] = files(state_dir)
elif mode == "fork":
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    train(2, 1)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os._exit(0) if os.environ.get("FORK_HARD_EXIT") else None
        raise SystemExit(0)  # a normal exit: atexit hooks run
    _, status = os.waitpid(pid, 0)
    out["child_exit_s"] = time.monotonic() - start
    out["child_status"] = status
    dist.destroy_process_group()
emit(out)
