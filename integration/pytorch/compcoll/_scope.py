"""Which allreduces count as gradient sums under COMPCOLL_TORCH_SCOPE=backward.

The backend compresses an allreduce issued during a backward pass and sends
any other exactly (integration/pytorch/csrc/issue_scope.h). Every rank must
judge a call alike, or the ranks take different routes and wait on each
other until the group's timeout. Two kinds of gradient sums are issued
outside a backward pass:

- DDP's Join (uneven inputs): a rank that has run out of data shadows each
  backward pass of the ranks still training with one allreduce of zeros per
  bucket, from the Join context on the script's thread, in this scope
  (compcoll._ddp_join).
- A script's own loop that allreduces .grad after backward(): it may say so
  with `with compcoll.gradient_scope():` (or set COMPCOLL_TORCH_SCOPE=all).
"""
import contextlib

import torch.distributed as dist

from compcoll import _C, _notices


@contextlib.contextmanager
def gradient_scope():
    """Allreduces this thread issues inside count as gradient sums: compressed
    under COMPCOLL_TORCH_SCOPE=backward as if issued in a backward pass (with
    what their callbacks issue). Every rank must issue them in the scope.
    Entered while this process has no compcoll group (COMPCOLL_ALGO unset,
    say), it changes nothing, and rank 0 says so once."""
    from compcoll import _backend  # _backend imports the modules that import this one
    if _backend._groups_built == 0 and dist.is_initialized():
        _notices._once("gradient_scope", dist.get_rank(), lambda: (
            "compcoll.gradient_scope(): no process group of this process is a compcoll group "
            "(COMPCOLL_ALGO unset, empty or dense, or a backend other than \"gloo\"/\"compcoll\"), "
            "so the scope changes nothing: its allreduces are torch's own (said once)"))
    saved = _C._enter_gradient_scope()
    try:
        yield
    finally:
        _C._exit_gradient_scope(saved)
