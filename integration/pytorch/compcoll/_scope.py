"""Which allreduces count as gradient sums under COMPCOLL_TORCH_SCOPE=backward.

The backend compresses an allreduce issued during a backward pass and sends
any other exactly (integration/pytorch/csrc/issue_scope.h). Every rank must
judge a call alike, or the ranks take different routes and wait on each
other until the group's timeout. Two kinds of gradient sums are issued
outside a backward pass:

- DDP's Join (uneven inputs): a rank that has run out of data shadows each
  backward pass of the ranks still training with one allreduce of zeros per
  bucket (DistributedDataParallel._match_all_reduce_for_bwd_pass), issued
  from the Join context on the script's thread. Its peers issue theirs in
  backward, so the shadowing runs in gradient_scope(). This is the one
  place compcoll wraps a torch function, and only while a compcoll group
  exists (install_ddp_join_scope, called when a group is built).
- A script's own loop that allreduces .grad after backward(): it may say so
  with `with compcoll.gradient_scope():` (or set COMPCOLL_TORCH_SCOPE=all).
"""
import contextlib
import functools
import threading

from compcoll import _C

_lock = threading.Lock()
_join_wrapped = False


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


def _in_gradient_scope(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with gradient_scope():
            return fn(*args, **kwargs)
    wrapper.__compcoll_gradient_scope__ = True
    return wrapper


def install_ddp_join_scope():
    """Runs DDP's shadowing of the backward pass under Join in gradient_scope().
    Idempotent. A torch without the method has no such shadowing to wrap."""
    global _join_wrapped
    with _lock:
        if _join_wrapped:
            return
        _join_wrapped = True
        from torch.nn.parallel import DistributedDataParallel as DDP
        fn = getattr(DDP, "_match_all_reduce_for_bwd_pass", None)
        if fn is not None and not getattr(fn, "__compcoll_gradient_scope__", False):
            DDP._match_all_reduce_for_bwd_pass = _in_gradient_scope(fn)
