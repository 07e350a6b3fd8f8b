"""An unmodified DDP script compiled with torch.compile, compression from
the environment (test_ddp.py). MODE=ddp_optimizer: torch.compile(DDP(...)),
dynamo's DDPOptimizer splitting the graph at the buckets, whose
allreduces are DDP's own. MODE=python_reducer: compiled autograd with
optimize_ddp="python_reducer": every parameter's gradient is allreduced as
a temporary functional collective, freed before the next one. Reports the
parameters' hash and, per step, the error-feedback key and event of every
compressed call. BACKEND: torch.compile's backend (aot_eager, the test's:
no C++ compile; inductor fuses the python reducer's allreduces into one
temporary bucket per step, which keeps one state as well)."""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from common import emit

torch.set_num_threads(1)
mode = os.environ["MODE"]
if mode == "python_reducer":
    torch._dynamo.config.optimize_ddp = "python_reducer"
    torch._dynamo.config.compiled_autograd = True
dist.init_process_group("gloo")  # compcoll from the environment
rank = dist.get_rank()
import compcoll  # noqa: E402  (only to read the key trace for the test)
from compcoll import _C  # noqa: E402

torch.manual_seed(0)
# Two weights of one shape (256 x 256) and one of another (256 x 128): the
# python reducer's temporaries of one shape must not share a state.
net = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                    nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
model = DDP(net)
compiled = torch.compile(model, backend=os.environ.get("BACKEND", "aot_eager"))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(rank)
backend = compcoll.backend_of()
steps = []
for step in range(int(os.environ.get("STEPS", "6"))):
    x = torch.randn(32, 128, generator=g)
    y = torch.randint(0, 10, (32,), generator=g)
    opt.zero_grad()
    loss = nn.functional.cross_entropy(compiled(x), y)
    seen = len(_C.key_trace(backend))
    if mode == "python_reducer":
        with torch._dynamo.compiled_autograd._enable(torch.compile(backend=os.environ.get("BACKEND", "aot_eager"))):
            loss.backward()
    else:
        loss.backward()
    steps.append([[k, n, e] for k, n, e in _C.key_trace(backend)[seen:]])
    opt.step()
digest = hashlib.sha1(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
emit({"rank": rank, "hash": digest.hexdigest(), "steps": steps, "stats": compcoll.stats()})
dist.destroy_process_group()
