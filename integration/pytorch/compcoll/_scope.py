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

from compcoll import _C


@contextlib.contextmanager
def gradient_scope():
    """Allreduces this thread issues inside count as gradient sums: compressed
    under COMPCOLL_TORCH_SCOPE=backward as if issued in a backward pass (with
    what their callbacks issue). Every rank must issue them in the scope."""
    saved = _C._enter_gradient_scope()
    try:
        yield
    finally:
        _C._exit_gradient_scope(saved)
