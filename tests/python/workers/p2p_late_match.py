"""A receive posted while the group's worker is busy (a compressed
allreduce in flight), whose matching send comes later than the group's
timeout (3 s): as with Gloo, a receive's clock starts when its work is
waited on, so it completes, and the group stays usable. Rank 0 receives,
rank 1 sends after 4.5 s; rank 0 waits only after 6 s. The RESULT line
says what each rank saw."""
import json
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import compcoll

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=3))
rank = dist.get_rank()
result = {"backend": dist.group.WORLD._get_backend(torch.device("cpu")).name()}
t = torch.randn(300_000)
with compcoll.gradient_scope():
    busy = dist.all_reduce(t, async_op=True)  # the worker is busy
if rank == 0:
    out = torch.zeros(4)
    r = dist.irecv(out, src=1)  # queued behind the allreduce
    busy.wait()
    time.sleep(6)
    try:
        r.wait()
        result["received"] = out.tolist()
    except Exception as e:  # noqa: BLE001 - the test reads what it was
        result["recv_error"] = str(e)[:300]
else:
    busy.wait()
    time.sleep(4.5)
    dist.send(torch.full((4,), 7.0), dst=0)
try:
    x = torch.ones(4)
    dist.all_reduce(x)
    result["next"] = x.tolist()
except Exception as e:  # noqa: BLE001
    result["next_error"] = str(e)[:300]
print("RESULT " + json.dumps(result), flush=True)
dist.destroy_process_group()
