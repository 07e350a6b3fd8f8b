"""Activation checkpointing under compcoll.

torch.utils.checkpoint (use_reentrant=False) recomputes a checkpointed
region's forward inside the backward pass, where COMPCOLL_TORCH_SCOPE=backward
compresses allreduces. An allreduce in that forward (a layer centring its
activations on their mean over the ranks, say) sums activations, not
gradients: compressed, the recomputed activations differ from the ones the
loss was computed with, and a residual of activations is carried into the
next batch. The recomputation runs inside whichever autograd node first
unpacks a tensor the region saved, a Function of the script's own too, so
the node alone cannot tell it (csrc/issue_scope.h, activations_node): the
recomputation's context (torch's _recomputation_hook) runs in a values scope
of the recomputation kind, and its allreduces take the exact route on every
rank (all ranks recompute alike), said once at INFO by rank 0.

The reentrant form recomputes inside CheckpointFunctionBackward, which
activations_node names. Wrapped once per process, when the first compcoll
group is built (as compcoll._sync_batchnorm).
"""
import functools

from compcoll import _C

_RECOMPUTATION = 2  # csrc/issue_scope.h, ValuesKind::kRecomputation


@functools.cache  # once per process
def install():
    try:
        from torch.utils import checkpoint
        hook = checkpoint._recomputation_hook
        enter, leave = hook.__enter__, hook.__exit__
    except (ImportError, AttributeError):
        return  # a torch without it; the autograd node check still applies

    def __enter__(self):
        self._compcoll_saved_scope = _C._enter_values_scope(_RECOMPUTATION)
        try:
            return enter(self)
        except BaseException:
            _C._exit_values_scope(self._compcoll_saved_scope)
            raise

    def __exit__(self, *exc):
        try:
            return leave(self, *exc)
        finally:
            _C._exit_values_scope(self._compcoll_saved_scope)

    hook.__enter__ = __enter__
    hook.__exit__ = __exit__
