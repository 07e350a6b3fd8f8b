"""HSDP under compcoll: FSDP HYBRID_SHARD (MODE=fsdp1) or FSDP2's fully_shard
on a 2-D mesh (MODE=fsdp2), 2 replicas of 2 shards, an unmodified "gloo"
script. Each gradient shard is reduce-scattered within a replica (not
compressed) and then allreduced across replicas (compressed). Reports each
group's stats and a digest of the rank's parameter shard, which its
replica peer must hold bit for bit."""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

from common import emit, train_square_loss

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
mode = os.environ["MODE"]
steps = int(os.environ.get("STEPS", "3"))

mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
torch.manual_seed(0)
# 164,928 parameters: each shard of a rank far above COMPCOLL_MIN_ELEMS.
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 64))
if mode == "fsdp1":
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    model = FSDP(model, sharding_strategy=ShardingStrategy.HYBRID_SHARD, device_mesh=mesh,
                 use_orig_params=True, device_id=torch.device("cpu"))
else:
    from torch.distributed.fsdp import fully_shard

    fully_shard(model, mesh=mesh)

train_square_loss(model, steps, 256, lr=0.05, seed=rank)

digest = hashlib.sha256()
for p in model.parameters():
    local = p.to_local() if hasattr(p, "to_local") else p
    digest.update(local.detach().contiguous().numpy().tobytes())

import compcoll  # noqa: E402  (already imported by the autoload)

emit({"shard_digest": digest.hexdigest(),
      "groups": {"replicate": compcoll.stats(mesh.get_group("replicate")),
                 "shard": compcoll.stats(mesh.get_group("shard"))}})
dist.destroy_process_group()
