"""Which thread frees the storage of a delegated operation's tensors when the
caller lets go of everything before the operation is done.

The storage's Python object exists (the script read it, as
all_gather_object's tensor/bytes conversions do), so the thread that drops
the storage's last reference frees that object under the GIL. It must be a
caller's thread: an inner backend's thread (Gloo's runLoop) that asks for
the GIL while the interpreter finalizes is ended by CPython inside a
destructor, and the process aborts after its last line
(csrc/deferred_release.h).

Rank 1 joins every operation 0.3 s late. Rank 0 issues it, drops the work,
the tensors and the storages at once, waits until the operation is done on
the inner backend's side, then makes another call into the backend (a
barrier). Each storage's weakref callback records the thread that freed
it. Two phases: the worker idle (the operation is issued at once) and the
worker busy with a compressed allreduce (the operation is queued).

RESULT {"freed_by": {phase/op: ["main" | "other:THREAD" | "not freed", ...]},
"kept": works still kept at the end} on rank 0; rank 1 prints {"rank": 1}.
"""
import gc
import threading
import time
import weakref

import torch
import torch.distributed as dist

from common import emit, init
from op_kinds import DELEGATED, op_kinds

rank, world = init("gloo")
import compcoll  # noqa: E402

LATE_S = 0.3
MAIN = threading.get_ident()


def watch(tensors, log):
    """Weakrefs to the tensors' storage objects; each logs who frees it."""
    refs = []
    for i, t in enumerate(tensors):
        def freed(_, i=i):
            log[i] = "main" if threading.get_ident() == MAIN else "other:" + open(f"/proc/self/task/{threading.get_native_id()}/comm").read().strip()
        refs.append(weakref.ref(t.untyped_storage(), freed))
    return refs


freed_by = {}
kinds = op_kinds(rank, world, compcoll)
# A receive whose work is dropped before it completes is cancelled (Gloo's
# point-to-point works are not run by its threads): not this case.
COLLECTIVES = [name for name in DELEGATED if name != "irecv"]
for phase in ("idle", "queued"):
    for name in COLLECTIVES:
        watched, issue = kinds[name]()
        log = ["not freed"] * len(watched)
        refs = watch(watched, log)
        dist.barrier()
        if rank == 1:
            time.sleep(LATE_S)
        busy = None
        if phase == "queued":
            # The worker is held by this allreduce until rank 1 joins, so
            # the delegated operation waits in its queue.
            g = torch.randn(200_000)
            with compcoll.gradient_scope():
                busy = dist.all_reduce(g, async_op=True)
        work = issue()
        del work, watched, issue
        gc.collect()
        if busy is not None:
            busy.wait()
            del busy, g
        time.sleep(LATE_S + 0.3)  # done on every thread of the inner backend
        dist.barrier()  # a call into the backend, on this thread
        gc.collect()
        if rank == 0:
            freed_by[f"{phase}/{name}"] = list(log)
        del refs

dist.barrier()
# What waits to be let go now: the works of the operations still shared
# (this barrier's own), not one per operation issued so far.
kept = compcoll._C._deferred_releases()
emit({"rank": rank, "freed_by": freed_by, "kept": kept} if rank == 0 else {"rank": rank})
dist.destroy_process_group()
