"""A GPU script's usual start: one process per GPU, init_process_group("nccl"),
an allreduce of a cuda tensor. It knows nothing about compcoll. Without a GPU
torch refuses the group (after compcoll has said its piece).

With NCCL_GROUP_SETS_ALGO=NAME the script turns compcoll on itself, after
`import torch`: COMPCOLL_ALGO=NAME, then compcoll.install_gloo_hook()."""
import json
import os

import torch
import torch.distributed as dist

if os.environ.get("NCCL_GROUP_SETS_ALGO"):
    import compcoll

    os.environ["COMPCOLL_ALGO"] = os.environ["NCCL_GROUP_SETS_ALGO"]
    compcoll.install_gloo_hook()
if torch.cuda.is_available():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
t = torch.ones(100000, device="cuda")
dist.all_reduce(t)
print("RESULT " + json.dumps({"rank": dist.get_rank(), "first": t[0].item()}), flush=True)
dist.destroy_process_group()
