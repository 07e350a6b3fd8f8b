"""Bytes on the wire per DDP step with dgc at density 0.001, from compcoll's
own stats, for the wire encodings in TEST_ENCODINGS (e.g. "fp32/u32,fp16/varint,fp8/rice")."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from common import emit, init

rank, world = init("gloo")
import compcoll  # noqa: E402

STEPS = 6
out = {"rank": rank}
for enc in os.environ["TEST_ENCODINGS"].split(","):
    values, indices = enc.split("/")
    os.environ.update(COMPCOLL_ALGO="dgc", COMPCOLL_DENSITY="0.001", COMPCOLL_VALUE_DTYPE=values,
                      COMPCOLL_INDEX_CODING=indices)
    group = dist.new_group(backend="compcoll")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                              nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 10)),
                process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    steps, prev = [], compcoll.stats(group)
    for _ in range(STEPS):
        opt.zero_grad()
        x = torch.randn(16, 512, generator=g)
        nn.functional.cross_entropy(model(x), torch.randint(0, 10, (16,), generator=g)).backward()
        opt.step()
        st = compcoll.stats(group)
        steps.append({"dense_bytes": st["dense_bytes"] - prev["dense_bytes"],
                      "wire_bytes": st["wire_bytes"] - prev["wire_bytes"],
                      "compressed_calls": st["compressed_calls"] - prev["compressed_calls"],
                      "calls": st["calls"] - prev["calls"]})
        prev = st
    out[enc] = {"steps": steps, "total": prev}
    del model, opt
    dist.destroy_process_group(group)
emit(out)
dist.destroy_process_group()
