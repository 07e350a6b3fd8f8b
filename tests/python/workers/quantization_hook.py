"""DDP's quantization comm hook (TEST_HOOK: quantization_pertensor_hook or
quantization_perchannel_hook) under COMPCOLL_ALGO from the environment. It
reduces gradients with all_gather of its own 8-bit values and issues no
allreduce, so compcoll has nothing to compress: the model still trains the
same on every rank, and rank 0 says once at WARN that COMPCOLL_ALGO changes
nothing for that model. The RESULT line says whether the ranks agree and
what the stats counted."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import DDPCommHookType, register_ddp_comm_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from common import emit, init, parameters_identical, train_regression

rank, world = init("gloo")
import compcoll  # noqa: E402

torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 1)))
# Through torch's own registration helper, as a user names the hook.
register_ddp_comm_hook(DDPCommHookType[os.environ["TEST_HOOK"]], model)
losses = train_regression(model, 4, seed=100 + rank)
identical, _ = parameters_identical(model, world)
st = compcoll.stats()
emit({"rank": rank, "losses": losses, "identical": identical, "calls": st["calls"],
      "compressed_calls": st["compressed_calls"]})
dist.destroy_process_group()
