"""Tensor parallelism beside data parallelism under compcoll: an unmodified
"gloo" script, 4 ranks on a 2-D mesh (2 data-parallel replicas x 2
tensor-parallel shards). A column-wise and a row-wise linear layer are
sharded over "tp" (DTensor: the row-wise output is allreduced in forward,
the column-wise input gradient in backward); DDP over "dp" sums the
gradients. Reports each group's stats and a digest of the rank's
parameters, which its data-parallel peer must hold bit for bit.

IMPORT=late imports DTensor's tensor-parallel API after the process group
exists (compcoll then wraps DTensor as it is imported), else before.
COMPILE=1 compiles the model (torch.compile, aot_eager) and leaves DDP out
(torch cannot compile DDP over TP): the collectives then run from compiled
graphs, and every rank has its own batch. Last, a Partial DTensor is made
Replicate on a fresh 1-D mesh, without a parallel style, and then over the
data-parallel group."""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn

from common import emit

late = os.environ.get("IMPORT") == "late"
if not late:
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
steps = int(os.environ.get("STEPS", "4"))
if late:
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))


class Block(nn.Module):
    """An input layer, a tensor-parallel MLP (its input needs a gradient,
    so the column-wise layer allreduces one in backward: 32 x 512 = 16,384
    elements, COMPCOLL_MIN_ELEMS) and a head."""

    def __init__(self):
        super().__init__()
        self.inp, self.up = nn.Linear(64, 512), nn.Linear(512, 1024)
        self.down, self.head = nn.Linear(1024, 512), nn.Linear(512, 10)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        return self.head(torch.relu(self.down(torch.relu(self.up(h)))) + h)


torch.manual_seed(0)
model = parallelize_module(Block(), mesh["tp"], {"up": ColwiseParallel(),
                                                 "down": RowwiseParallel()})
if os.environ.get("COMPILE") == "1":
    # Pure tensor parallelism, compiled (DDP over TP does not compile in
    # torch itself): the collectives run from the compiled graphs.
    model.compile(backend="aot_eager")
else:
    model = DDP(model, device_mesh=mesh["dp"])
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(mesh.get_local_rank("dp"))  # one batch per replica
losses = []
for _ in range(steps):
    x = torch.randn(32, 64, generator=g)
    loss = nn.functional.cross_entropy(model(x), torch.randint(0, 10, (32,), generator=g))
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())

# DDP over TP keeps the sharded weights as DTensor attributes between its
# hooks, not as parameters: read every layer's weight and bias by name.
digest = hashlib.sha256()
for layer in ("inp", "up", "down", "head"):
    for name in ("weight", "bias"):
        t = getattr(getattr(model.module if isinstance(model, DDP) else model, layer), name)
        local = t.to_local() if hasattr(t, "to_local") else t
        digest.update(local.detach().contiguous().numpy().tobytes())

import compcoll  # noqa: E402  (already imported by the autoload)
from torch.distributed.tensor import DTensor, Partial, Replicate  # noqa: E402

# DTensor without a parallel style: a Partial tensor made Replicate on a
# fresh 1-D mesh over every rank reduces exactly and marks that group.
flat = init_device_mesh("cpu", (world,))
flat_backend = compcoll.backend_of(flat.get_group())
marked_before = compcoll._C.is_tensor_parallel(flat_backend)
summed = DTensor.from_local(torch.full((16384,), 0.1), flat, [Partial()]).redistribute(
    flat, [Replicate()]).to_local()

# The same over the data-parallel group, whose DDP compressed: it is marked
# from then on, and its rank 0 says so at WARN (compression ends there).
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
over_dp = DeviceMesh.from_group(mesh.get_group("dp"), "cpu")
DTensor.from_local(torch.full((16384,), 0.1), over_dp, [Partial()]).full_tensor()

emit({"digest": digest.hexdigest(), "losses": losses,
      "groups": {"dp": compcoll.stats(mesh.get_group("dp")),
                 "tp": compcoll.stats(mesh.get_group("tp"))},
      "partial": {"marked_before": marked_before,
                  "marked_after": compcoll._C.is_tensor_parallel(flat_backend),
                  "exact": bool(torch.equal(summed, torch.full((16384,), 0.1) * world))}})
dist.destroy_process_group()
