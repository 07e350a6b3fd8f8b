"""PowerSGD (its DDP comm hook) on a model whose factors are large enough to
be compressed (Linear(64, 20000) -> Linear(20000, 1): P and Q of 20,001 and
20,064 elements, above COMPCOLL_MIN_ELEMS), under COMPCOLL_ALGO from the
environment. Compressing the factors again zeroed whole factors and
PowerSGD's orthogonalization turned them into NaN from the next step on;
the RESULT line says whether every parameter stayed finite, whether the
ranks agree, and what the stats counted. TEST_WRAPPER=fp16|bf16 registers
torch's fp16_compress_wrapper / bf16_compress_wrapper around the hook (a
hook of another name, found by its PowerSGDState)."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from common import emit, init, parameters_identical, train_regression

rank, world = init("gloo")
import compcoll  # noqa: E402

torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(64, 20_000), nn.ReLU(), nn.Linear(20_000, 1)))
state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                    start_powerSGD_iter=2, min_compression_rate=1)
hook = powerSGD_hook.powerSGD_hook
wrapper = os.environ.get("TEST_WRAPPER", "")
if wrapper:
    hook = getattr(default_hooks, f"{wrapper}_compress_wrapper")(hook)
model.register_comm_hook(state, hook)
# The fp16 wrapper's rounding makes this model diverge at 0.01 on plain Gloo
# too (inf by step 5, the same losses bit for bit): a smaller step there.
losses = train_regression(model, 6, seed=100 + rank, lr=0.001 if wrapper else 0.01)
identical, finite = parameters_identical(model, world)
st = compcoll.stats()
emit({"rank": rank, "finite": finite, "losses": losses, "identical": identical,
      "calls": st["calls"], "compressed_calls": st["compressed_calls"]})
dist.destroy_process_group()
