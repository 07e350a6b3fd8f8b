"""An ordinary DDP training script: it knows nothing about compcoll.

It asks for "gloo" and is launched by torchrun or with torchrun's variables.
The last line reports what it got (for the tests; not needed for training).
With SCRIPT_SETS_ENV (JSON), the script sets those variables itself, after
`import torch` and before init_process_group, as scripts set MASTER_ADDR.
"""
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

torch.set_num_threads(1)
os.environ.update(json.loads(os.environ.get("SCRIPT_SETS_ENV", "{}")))
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(rank)
for step in range(5):
    x = torch.randn(32, 128, generator=g)
    y = torch.randint(0, 10, (32,), generator=g)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
cpu = dist.group.WORLD._get_backend(torch.device("cpu")).name()
print("RESULT " + json.dumps({"rank": rank, "backend": dist.get_backend(), "cpu_backend": cpu,
                              "compcoll_imported": "compcoll" in __import__("sys").modules}),
      flush=True)
dist.destroy_process_group()
