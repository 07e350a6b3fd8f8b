"""An ordinary DDP script, run with COMPCOLL_ALGO set (see test_hooks.py):
one model of one bucket and one of several (bucket_cap_mb), so DDP's bucket
rebuild after the first iteration replaces buffers of the same size and of
other sizes."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
for width, cap in ((256, None), (512, 0.25)):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(128, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                        nn.Linear(width, 10))
    model = DDP(net, **({"bucket_cap_mb": cap} if cap else {}))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    for step in range(4):
        opt.zero_grad()
        x = torch.randn(16, 128, generator=g)
        nn.functional.cross_entropy(model(x), torch.randint(0, 10, (16,), generator=g)).backward()
        opt.step()
print("RESULT {}", flush=True)
dist.destroy_process_group()
