"""Point-to-point operations posted while the group's worker is busy with a
compressed allreduce (see test_reliability.py): each rank posts a receive
and then a send to its peer, as a ring exchange does, then a
batch_isend_irecv. Plain Gloo completes them; so must compcoll. The group's
timeout is short so that a hang fails the run instead of waiting 30
minutes. The RESULT line says what every receive got and how long it took."""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=20))
rank, world = dist.get_rank(), dist.get_world_size()
peer = (rank + 1) % world
src = (rank - 1) % world
backend = dist.group.WORLD._get_backend(torch.device("cpu")).name()

got, seconds = [], []
for round_ in range(3):
    big = torch.randn(4_000_000)
    if rank == 0:
        time.sleep(0.3)  # the others' workers wait in the allreduce meanwhile
    t0 = time.time()
    busy = dist.all_reduce(big, async_op=True)
    out = torch.zeros(16)
    r = dist.irecv(out, src=src)
    s = dist.isend(torch.full((16,), float(100 * round_ + rank)), dst=peer)
    s.wait()
    r.wait()
    busy.wait()
    got.append(out[0].item())
    # The same through batch_isend_irecv, again behind a busy worker.
    busy = dist.all_reduce(big, async_op=True)
    out2 = torch.zeros(16)
    ops = [dist.P2POp(dist.irecv, out2, src), dist.P2POp(dist.isend, torch.full((16,), -1.0 - rank), peer)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    busy.wait()
    got.append(out2[0].item())
    seconds.append(round(time.time() - t0, 2))

print("RESULT " + __import__("json").dumps({"backend": backend, "got": got, "src": src,
                                             "seconds": seconds}), flush=True)
dist.destroy_process_group()
