"""SyncBatchNorm's backward pass under compcoll.

torch.nn.SyncBatchNorm's backward allreduces the batch statistics of its
input gradient (sum_dy and sum_dy_xmu, 2C floats; torch/nn/modules/
_functions.py) from inside the backward pass, where COMPCOLL_TORCH_SCOPE=
backward compresses allreduces. They are not gradient sums: sparsified, most
channels would get zero statistics this step, every input gradient of the
batch would be wrong, and what was not sent would be added to the next
batch's. So the Function's backward runs in a values scope: its allreduces
take the exact route on every rank (all ranks run it, so they decide alike),
under every COMPCOLL_TORCH_SCOPE (=all takes allreduces issued outside a
backward pass for gradients; these are values inside one).

Wrapped once per process, when the first compcoll group is built (as the
other torch functions compcoll wraps: compcoll._tensor_parallel,
compcoll._ddp_join, compcoll._ddp_hooks).
"""
import functools

from compcoll import _C


@functools.cache  # once per process
def install():
    try:
        from torch.nn.modules import _functions
        function = _functions.SyncBatchNorm
        original = function.backward
    except (ImportError, AttributeError):
        return  # a torch without it has no SyncBatchNorm backward to keep exact

    @functools.wraps(original)
    def backward(ctx, *grad_outputs):
        saved = _C._enter_values_scope()
        try:
            return original(ctx, *grad_outputs)
        finally:
            _C._exit_values_scope(saved)

    function.backward = staticmethod(backward)
