"""Registration of the compcoll c10d backend and the gloo -> compcoll hook.

The backend (compcoll._C, C++) wraps an inner ProcessGroupGloo built on a
PrefixStore("compcoll_inner", store) of the group's store; it compresses the
eligible allreduces and delegates every other operation to that inner group.

The hook: torch creates a "gloo" backend through the creator registered in
torch.distributed.Backend._plugins["GLOO"]. install_gloo_hook() replaces that
creator with one that returns a compcoll backend wrapping the Gloo backend
torch would have built. Nothing else of torch is patched: the process group
still says "gloo" (dist.get_backend() == "gloo"), and every way of creating a
gloo group (init_process_group with "gloo" or no backend on a CPU machine,
new_group, torchrun) goes through it.
"""
import atexit
import json
import multiprocessing.util
import threading
import warnings

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from compcoll import _C

BACKEND_NAME = "compcoll"
INNER_STORE_PREFIX = "compcoll_inner"

_lock = threading.Lock()
_registered = False
_hooked_gloo = None  # the original gloo plugin once the hook is installed
_exit_hooks = False


def _inner_gloo(store, rank, size, timeout, group_name=None, global_ranks=None):
    """The inner Gloo backend, on its own key space of the group's store."""
    inner_store = dist.PrefixStore(INNER_STORE_PREFIX, store)
    inner = dist.ProcessGroupGloo(inner_store, rank, size, timeout)
    options = getattr(inner, "options", None)
    if options is not None:
        if global_ranks is not None and hasattr(options, "global_ranks_in_group"):
            options.global_ranks_in_group = list(global_ranks)
        if group_name and hasattr(options, "group_name"):
            options.group_name = group_name
    return inner


def _install_exit_hooks():
    """Stats files are written when a backend is destroyed; a process group
    that lives until exit is finished here instead: at interpreter exit
    (atexit) and in forked multiprocessing children (which skip atexit)."""
    global _exit_hooks
    with _lock:
        if _exit_hooks:
            return
        _exit_hooks = True
    atexit.register(_C.finish_all)
    multiprocessing.util.Finalize(None, _C.finish_all, exitpriority=100)


def _create(*args):
    """Creator for Backend.register_backend, either calling convention."""
    if len(args) == 2:  # extended_api: (_DistributedBackendOptions, backend_options)
        opts, _backend_options = args
        store, rank, size, timeout = opts.store, opts.group_rank, opts.group_size, opts.timeout
        group_name = getattr(opts, "group_id", None)
        global_ranks = getattr(opts, "global_ranks_in_group", None)
    else:  # (store, rank, size, timeout)
        store, rank, size, timeout = args
        group_name, global_ranks = None, None
    inner = _inner_gloo(store, rank, size, timeout, group_name, global_ranks)
    backend = _C.create_backend(inner, timeout)
    _install_exit_hooks()
    return backend


def register():
    """Registers the "compcoll" backend name (device cpu). Idempotent."""
    global _registered
    with _lock:
        if _registered or "COMPCOLL" in getattr(dist.Backend, "_plugins", {}):
            _registered = True
            return
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu"])
        _registered = True


def install_gloo_hook():
    """Makes the "gloo" backend resolve to compcoll (wrapping Gloo). Idempotent.

    Returns True when installed. On a torch that builds gloo outside the
    backend plugin table it warns and returns False: use
    init_process_group("compcoll") there.
    """
    global _hooked_gloo
    register()
    Backend = dist.Backend
    with _lock:
        if _hooked_gloo is not None:
            return True
        ensure = getattr(Backend, "_ensure_backend_registered", None)
        if ensure is not None:
            ensure("gloo")  # torch registers its own gloo creator lazily
        plugins = getattr(Backend, "_plugins", {})
        original = plugins.get("GLOO")
        if original is None or not hasattr(Backend, "_BackendPlugin"):
            warnings.warn(
                f"compcoll: torch {torch.__version__} builds the gloo backend outside "
                "torch.distributed.Backend._plugins, so COMPCOLL_ALGO cannot turn "
                "init_process_group('gloo') into compcoll; use init_process_group('compcoll')",
                stacklevel=2,
            )
            return False
        plugins["GLOO"] = Backend._BackendPlugin(_create, True)
        _hooked_gloo = original
        return True


def is_gloo_hooked():
    return _hooked_gloo is not None


def backend_of(group=None):
    """The compcoll backend serving cpu tensors of group (default: the
    default group), or None when that is not a compcoll backend."""
    pg = group if group is not None else c10d._get_default_group()
    try:
        b = pg._get_backend(torch.device("cpu"))
    except RuntimeError:
        return None
    return b if _C.is_compcoll(b) else None


def _require(group):
    b = backend_of(group)
    if b is None:
        raise RuntimeError("compcoll: the process group has no compcoll backend for cpu")
    return b


def stats(group=None):
    """This rank's compcoll stats (what COMPCOLL_STATS_FILE would hold) after
    every operation submitted so far."""
    return json.loads(_C.stats_json(_require(group)))


def finish(group=None):
    """Writes this rank's COMPCOLL_STATS_FILE now (idempotent)."""
    _C.finish(_require(group))


def slots(group=None):
    """The error-feedback slots of the backend (see docs/pytorch.md)."""
    return _C.slots(_require(group))


def state_entries(group=None):
    """Number of error-feedback states the communicator holds."""
    return _C.state_entries(_require(group))
