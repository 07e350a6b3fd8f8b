"""FSDP under compcoll: gradients go through reduce-scatter, which compcoll
does not compress (see test_hooks.py). An unmodified "gloo" script (the
environment turns it into compcoll): FSDP FULL_SHARD trains on the default
group, FSDP2's fully_shard on a subgroup. Reports each group's stats."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy

from common import emit, train_square_loss

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()


def model():
    torch.manual_seed(0)
    # 41,802 parameters: gradients far above COMPCOLL_MIN_ELEMS.
    return nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 32))


def train(m, steps=2):
    train_square_loss(m, steps, 128, lr=0.01, seed=rank)


train(FSDP(model(), sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True,
           device_id=torch.device("cpu")))  # FSDP on cpu tensors: Gloo
out = {"full_shard_backend": dist.group.WORLD._get_backend(torch.device("cpu")).name()}

sub = dist.new_group(backend="gloo")  # also compcoll through the hook
try:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh.from_group(sub, "cpu")
    m2 = model()
    fully_shard(m2, mesh=mesh)
    train(m2)
    out["fsdp2"] = True
except ImportError:
    out["fsdp2"] = False

import compcoll  # noqa: E402  (already imported by the autoload)

out["groups"] = {"world": compcoll.stats(), "sub": compcoll.stats(sub)}
emit(out)
dist.destroy_process_group()
