"""While an operation is in flight, the backend holds no reference to the
caller's tensors: its worker and the inner backend work on aliases
(integration/pytorch/csrc/python_free.h). A thread other than the caller's
that dropped a reference to a Python-visible tensor would have to take the
GIL, and one that does so while the interpreter finalizes aborts the
process ("terminate called without an active exception").

Rank 1 joins every operation 0.3 s late, so that rank 0 counts the
references of its tensors (Tensor._use_count: 1 is the Python object's
own) while the operation is in flight, and again after wait().

RESULT {"counts": {op: [[before...], [during...], [after...]]}, "ok": {op: bool}}
on rank 0; rank 1 prints {"rank": 1}.
"""
import time

import torch.distributed as dist

from common import emit, init
from op_kinds import op_kinds

rank, world = init("gloo")
import compcoll  # noqa: E402

LATE_S = 0.3


counts, ok = {}, {}
for name, make in op_kinds(rank, world, compcoll).items():
    watched, issue = make()
    dist.barrier()
    if rank == 1:
        time.sleep(LATE_S)
    before = [t._use_count() for t in watched]
    work = issue()
    during = [t._use_count() for t in watched]
    late = not work.is_completed()
    work.wait()
    del work
    after = [t._use_count() for t in watched]
    counts[name] = [before, during, after]
    # In flight on rank 0 (rank 1 is late), and nothing beyond the Python
    # object's own reference, then or after.
    ok[name] = (late or rank == 1) and before == during == after == [1] * len(watched)

dist.barrier()
emit({"rank": rank, "counts": counts, "ok": ok})
dist.destroy_process_group()
