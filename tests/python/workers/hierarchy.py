"""The host hierarchy under the PyTorch backend (see test_hierarchy.py).

usage: hierarchy.py PER_HOST

Ranks r // PER_HOST share a host (COMPCOLL_HOST_ID, set before the group is
made); the backend's communicator builds the hierarchy from the group's
ranks. Three allreduces of seeded tensors, a NaN from the last rank in the
second; prints the digest of every result.
"""
import hashlib
import os
import sys

import torch
import torch.distributed as dist

from common import emit, init

PER_HOST = int(sys.argv[1])
os.environ["COMPCOLL_HOST_ID"] = f"pytorch-test-host-{int(os.environ['RANK']) // PER_HOST}"
rank, world = init("compcoll")

gen = torch.Generator().manual_seed(7 + rank)
digests, nan_seen = [], False
for step in range(3):
    t = torch.randn(50_003, generator=gen) * (rank + 1)
    if step == 1 and rank == world - 1:
        t[17] = float("nan")
    dist.all_reduce(t)
    digests.append(hashlib.sha256(t.numpy().tobytes()).hexdigest())
    if step == 1:
        nan_seen = bool(torch.isnan(t[17]))
emit({"rank": rank, "digests": digests, "nan": nan_seen})
dist.destroy_process_group()
