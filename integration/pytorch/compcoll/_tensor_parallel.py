"""Tensor parallelism (DTensor) under compcoll.

DTensor turns a Partial placement into a Replicate one with an allreduce:
in a tensor-parallel layer's forward pass (a row-wise layer's output) and in
its backward pass (a column-wise layer's input gradient). Those sum one
batch's activations or their gradients. They are not gradient sums of data
parallelism: a residual kept from one batch and sent with the next would
corrupt both. COMPCOLL_TORCH_SCOPE=backward would compress the backward ones
(they are issued in a backward pass), so every allreduce DTensor's
placements issue runs in compcoll's tensor-parallel scope, where the backend
takes the exact route whatever the scope setting and says so once at INFO
(integration/pytorch/csrc/issue_scope.h). The data-parallel sums of the
same job (DDP's buckets, FSDP's and HSDP's) do not go through placements and
are compressed as before.

What is wrapped, once per process: `_reduce_value` of Partial and of each of
its subclasses (every redistribution from Partial to Replicate, embedding's
masked partial, the norm reductions), and loss_parallel's `_log_softmax`,
which allreduces directly. DTensor's modules are wrapped when the first
compcoll group is built if they are loaded then, or as they are imported
later (an import hook that watches for them alone), so a script that never
uses DTensor does not pay for importing it. A torch without these functions
has nothing to wrap, and that is said once.
"""
import functools
import importlib.abc
import logging
import sys

from compcoll import _C

_log = logging.getLogger("compcoll")

_PLACEMENTS = "torch.distributed.tensor.placement_types"
_NORMS = "torch.distributed.tensor._ops._math_ops"  # defines _NormPartial
_LOSS = "torch.distributed.tensor.parallel.loss"
_WATCHED = (_PLACEMENTS, _NORMS, _LOSS)
_MARK = "__compcoll_tensor_parallel__"


def _in_scope(fn):
    """fn, with the allreduces it issues in the tensor-parallel scope."""
    if getattr(fn, _MARK, False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _C._enter_tensor_parallel_scope()
        try:
            return fn(*args, **kwargs)
        finally:
            _C._exit_tensor_parallel_scope()
    setattr(wrapper, _MARK, True)
    return wrapper


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


@functools.cache
def _say_nothing_to_wrap():
    _log.warning("compcoll: this torch's DTensor has no Partial._reduce_value to wrap: "
                 "the allreduces of tensor-parallel layers issued in backward may be "
                 "compressed as gradient sums (docs/pytorch.md, \"Which allreduces are "
                 "compressed\")")


def _wrap_partials():
    placements = sys.modules.get(_PLACEMENTS)
    partial = getattr(placements, "Partial", None)
    if partial is None or "_reduce_value" not in vars(partial):
        _say_nothing_to_wrap()
        return
    for cls in (partial, *_subclasses(partial)):
        if "_reduce_value" in vars(cls):
            cls._reduce_value = _in_scope(vars(cls)["_reduce_value"])


def _wrap_loss():
    loss = sys.modules.get(_LOSS)
    if loss is not None and callable(getattr(loss, "_log_softmax", None)):
        loss._log_softmax = _in_scope(loss._log_softmax)


def _wrap_loaded():
    if _PLACEMENTS in sys.modules:
        _wrap_partials()  # Partial's subclasses in modules loaded by now
    _wrap_loss()


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Wraps DTensor's modules as they finish loading; finds nothing itself."""

    def find_spec(self, name, path, target=None):
        if name not in _WATCHED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_and_wrap(module):
            exec_module(module)
            _wrap_loaded()
            if all(watched in sys.modules for watched in _WATCHED) and self in sys.meta_path:
                sys.meta_path.remove(self)  # nothing left to watch for
        loader.exec_module = exec_and_wrap  # this module's own loader instance
        return spec


@functools.cache
def install():
    """Once per process, when the first compcoll group is built."""
    _wrap_loaded()
    if not all(name in sys.modules for name in _WATCHED):
        sys.meta_path.insert(0, _WrapOnImport())
