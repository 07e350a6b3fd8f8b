"""Tensor parallelism (DTensor) under compcoll.

A tensor-parallel layer allreduces one batch's activations (a row-wise
layer's output, in forward) and their gradients (a column-wise layer's
input gradient, in backward): DTensor turning a Partial placement into a
Replicate one. Those are not gradient sums of data parallelism: a residual
kept from one batch and sent with the next would corrupt both. Yet the
backward ones are issued in a backward pass, where COMPCOLL_TORCH_SCOPE
would compress them. So compcoll marks the process groups that carry tensor
parallelism, and every allreduce of a marked group takes the exact route
(CompcollBackend::mark_tensor_parallel, integration/pytorch/csrc/backend.h);
its rank 0 says so once at INFO. A mark on the group, not a scope around
the call, also holds for the collectives a torch.compile'd graph issues
later. The data-parallel groups of the same job (DDP's, FSDP's, HSDP's
replicas) are other groups and are compressed as before.

A group is marked, on every rank at the same point of the program, when:
- a parallel style (ColwiseParallel, RowwiseParallel, SequenceParallel,
  PrepareModuleInput/Output, or a style of the script's own) is applied on
  a mesh over it: parallelize_module, before any collective of the layer;
- DTensor reduces a Partial placement over it in eager code
  (Partial._reduce_value and its subclasses': the redistributions of
  DTensor used without parallelize_module), before that reduction;
- loss_parallel's log-softmax reduces over it in eager code;
- the script says so: compcoll.mark_tensor_parallel(group), for
  tensor-parallel layers of its own (autograd Functions that allreduce).
Not while torch.compile traces: a rank that finds its graph in a cache
does not trace, and the ranks must agree.

DTensor's modules are wrapped when the first compcoll group is built if they
are loaded then, or as they are imported later (an import hook that watches
for them alone), so a script that never uses DTensor does not import it. A
torch without these functions has nothing to wrap, and that is said once.
"""
import functools
import importlib.abc
import logging
import sys

import torch
import torch.distributed as dist

from compcoll import _C

_log = logging.getLogger("compcoll")

_PLACEMENTS = "torch.distributed.tensor.placement_types"
_NORMS = "torch.distributed.tensor._ops._math_ops"  # defines _NormPartial
_STYLES = "torch.distributed.tensor.parallel.style"
_LOSS = "torch.distributed.tensor.parallel.loss"
_WATCHED = (_PLACEMENTS, _NORMS, _STYLES, _LOSS)
_MARK = "__compcoll_tensor_parallel__"


def mark_group(group):
    """Marks a process group as carrying tensor parallelism: from now on
    every allreduce of it takes the exact route, in backward too and under
    either COMPCOLL_TORCH_SCOPE (its rank 0 says so once at INFO). For
    tensor-parallel layers of your own (autograd Functions that allreduce
    activations in forward or their gradients in backward); DTensor's are
    marked without it. Call it on every rank, before the group's first
    allreduce. Returns False (and does nothing) when the group is not a
    compcoll group (COMPCOLL_ALGO unset, say), True otherwise."""
    from compcoll._backend import backend_of  # _backend imports this module
    backend = backend_of(group)
    if backend is None:
        return False
    return _mark_backend(backend)


def mark_tensor_parallel(group):
    """compcoll.mark_tensor_parallel: mark_group, and where the group is not a
    compcoll group its rank 0 says once that nothing was marked (a script
    run with compression off, or with COMPCOLL_ALGO forgotten)."""
    if mark_group(group):
        return True
    from compcoll import _notices
    _notices._once("mark_tensor_parallel", dist.get_rank(group), lambda: (
        "compcoll.mark_tensor_parallel(): the group is not a compcoll group (COMPCOLL_ALGO "
        "unset, empty or dense, or a backend other than \"gloo\"/\"compcoll\"), so nothing is "
        "marked: its allreduces are torch's own, exact (said once)"))
    return False


def _mark_backend(backend):
    if not _C.is_tensor_parallel(backend):
        _C.mark_tensor_parallel(backend)
    return True


def mark(mesh, mesh_dim=None):
    """Marks the process group of mesh_dim of the DeviceMesh (every dim when
    None) as carrying tensor parallelism, where it is a compcoll group."""
    for dim in range(mesh.ndim) if mesh_dim is None else (mesh_dim,):
        mark_group(mesh.get_group(dim))


def _tracing(args, kwargs):
    """True while torch.compile traces the call (dynamo, or AOTAutograd with
    fake tensors). A mark is made only where the code runs eagerly: a rank
    whose compiled graph came from a cache does not trace, and the ranks
    must mark alike. Compiled code is marked through the parallel styles,
    which parallelize_module applies eagerly, or by mark_group()."""
    if torch.compiler.is_compiling():
        return True
    from torch._guards import detect_fake_mode
    return detect_fake_mode([*args, *kwargs.values()]) is not None


def _marking(fn, mesh_of):
    """fn, marking the group that mesh_of(*args) names before it runs."""
    if getattr(fn, _MARK, False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not _tracing(args, kwargs):
            mark(*mesh_of(*args, **kwargs))
        return fn(*args, **kwargs)
    setattr(wrapper, _MARK, True)
    return wrapper


def _reduce_mesh(self, tensor, mesh, mesh_dim, *rest, **kwargs):
    return mesh, mesh_dim  # Partial._reduce_value(self, tensor, mesh, mesh_dim)


def _style_mesh(self, module, device_mesh, *rest, **kwargs):
    return (device_mesh,)  # ParallelStyle._apply(self, module, device_mesh)


def _log_softmax_mesh(x, dim, half_to_float, mesh, mesh_dim, *rest, **kwargs):
    return mesh, mesh_dim  # loss._log_softmax(x, dim, half_to_float, mesh, mesh_dim)


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


@functools.cache
def _say_nothing_to_wrap(what):
    _log.warning("compcoll: this torch's DTensor has no %s to wrap: the allreduces of "
                 "tensor-parallel layers issued in backward may be compressed as gradient "
                 "sums (docs/pytorch.md, \"Which allreduces are compressed\")", what)


def _wrap_methods(base, method, mesh_of):
    for cls in (base, *_subclasses(base)):
        if method in vars(cls) and not getattr(vars(cls)[method], "__isabstractmethod__", False):
            setattr(cls, method, _marking(vars(cls)[method], mesh_of))


def _wrap_partials(placements):
    partial = getattr(placements, "Partial", None)
    if partial is None or "_reduce_value" not in vars(partial):
        _say_nothing_to_wrap("Partial._reduce_value")
        return
    _wrap_methods(partial, "_reduce_value", _reduce_mesh)


def _wrap_styles(style):
    base = getattr(style, "ParallelStyle", None)
    if base is None:
        _say_nothing_to_wrap("ParallelStyle")
        return
    _wrap_methods(base, "_apply", _style_mesh)
    if not getattr(base, _MARK, False):
        # The script's own styles, defined after this: wrapped as defined.
        inherited = base.__dict__.get("__init_subclass__")

        def init_subclass(cls, **kwargs):
            if inherited is not None:
                inherited.__func__(cls, **kwargs)
            else:
                super(base, cls).__init_subclass__(**kwargs)
            if "_apply" in vars(cls):
                cls._apply = _marking(vars(cls)["_apply"], _style_mesh)
        base.__init_subclass__ = classmethod(init_subclass)
        setattr(base, _MARK, True)


def _wrap_loaded():
    if _PLACEMENTS in sys.modules:
        _wrap_partials(sys.modules[_PLACEMENTS])  # with the subclasses loaded by now
    if _STYLES in sys.modules:
        _wrap_styles(sys.modules[_STYLES])
    loss = sys.modules.get(_LOSS)
    if loss is not None and callable(getattr(loss, "_log_softmax", None)):
        loss._log_softmax = _marking(loss._log_softmax, _log_softmax_mesh)


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
        exec_module = getattr(spec.loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_and_wrap(module):
            exec_module(module)
            _wrap_loaded()
            if all(watched in sys.modules for watched in _WATCHED) and self in sys.meta_path:
                sys.meta_path.remove(self)  # nothing left to watch for
        spec.loader.exec_module = exec_and_wrap  # this module's own loader instance
        return spec


@functools.cache
def install():
    """Once per process, when the first compcoll group is built."""
    _wrap_loaded()
    if not all(name in sys.modules for name in _WATCHED):
        sys.meta_path.insert(0, _WrapOnImport())
