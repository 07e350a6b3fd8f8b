"""Registration of the compcoll c10d backend and the gloo -> compcoll hook.

The backend (compcoll._C, C++) is registered for devices cpu and cuda; torch
builds one backend object for both. It wraps an inner ProcessGroupGloo built
on a PrefixStore("compcoll_inner", store) of the group's store for cpu
tensors, compresses their eligible allreduces and delegates every other
operation to that inner group. When CUDA and NCCL are available, a group
created as "compcoll" also gets a device lane for cuda tensors: an inner
ProcessGroupNCCL on PrefixStore("compcoll_inner_nccl", store), built by the
backend on the first operation on a cuda tensor (a group used only with cpu
tensors never builds it), whose eligible allreduces are compressed
host-staged (see docs/pytorch.md). Without a device lane (no CUDA or NCCL,
or a group made through the gloo hook), cuda tensors go to the inner Gloo,
uncompressed, as Gloo would handle them.

The hook: torch creates a "gloo" backend through the creator registered in
torch.distributed.Backend._plugins["GLOO"]. install_gloo_hook() replaces that
creator with one that returns a compcoll backend wrapping the Gloo backend
torch would have built. Nothing else of torch is patched: the process group
still says "gloo" (dist.get_backend() == "gloo"), and every way of creating a
gloo group (init_process_group with "gloo" or no backend on a CPU machine,
new_group, torchrun) goes through it. (Once a compcoll group exists, DDP's
join hook is wrapped, compcoll._ddp_join, so is DDP's register_comm_hook,
which gives each hook an owner of its own for the error-feedback keys,
compcoll._ddp_hooks, torch.amp.GradScaler.update, whose loss-scale changes
the error-feedback state follows, compcoll._loss_scale, and DTensor's
parallel styles and reductions, which mark tensor-parallel groups:
compcoll._tensor_parallel.)
"""
import atexit
import json
import multiprocessing.util
import os
import re
import threading
import warnings

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

import compcoll_autoload
import compcoll_creators as creators
from compcoll import (_C, _activation_checkpoint, _ddp_hooks, _ddp_join, _join, _loss_scale,
                      _momentum, _notices, _sync_batchnorm, _tensor_parallel)

BACKEND_NAME = "compcoll"
DEVICES = ["cpu", "cuda"]
INNER_STORE_PREFIX = "compcoll_inner"
INNER_NCCL_STORE_PREFIX = "compcoll_inner_nccl"
TEST_STAGED_STORE_PREFIX = "compcoll_inner_staged"

# Test hook (tests/python): when True, groups created afterwards get the
# test-only device lane "staged_cpu", which stages cpu tensors through host
# copies and a second, lazily built Gloo group exactly as the cuda lane
# stages cuda tensors through NCCL, so that path runs on machines without a
# GPU. Not for use outside the tests.
_TEST_STAGED_CPU = False

_lock = threading.Lock()
_registered = False
_torch_gloo = None  # torch's own gloo creator, once the hook is installed over it
_exit_hooks = False
_groups_built = 0  # compcoll backends this process has built (compcoll.gradient_scope asks)


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


def _inner_nccl(store, rank, size, timeout, group_name=None, global_ranks=None):
    """The inner NCCL backend for cuda tensors, on its own key space of the
    group's store, with the group's timeout. Called by the backend (from C++,
    with the GIL) on the first operation on a cuda tensor."""
    inner_store = dist.PrefixStore(INNER_NCCL_STORE_PREFIX, store)
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    if global_ranks is not None:
        options.global_ranks_in_group = list(global_ranks)
    if group_name:
        options.group_name = group_name
    return dist.ProcessGroupNCCL(inner_store, rank, size, options)


def _inner_staged_cpu(store, rank, size, timeout):
    """The test lane's inner backend: another Gloo group on its own key space."""
    return dist.ProcessGroupGloo(dist.PrefixStore(TEST_STAGED_STORE_PREFIX, store), rank, size,
                                 timeout)


def _nccl_usable():
    """CUDA and NCCL are there (no CUDA context is created by asking)."""
    return dist.is_nccl_available() and torch.cuda.is_available()


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


def _global_identity(rank, size, global_ranks):
    """This process's global rank and the world size, for COMPCOLL_STATS_FILE
    (one file per process, every group of it inside). The default group is
    created before is_initialized() holds: its rank is the global one."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if global_ranks:
        return int(list(global_ranks)[rank]), size
    return rank, size


def _state_tag(group_name):
    """What names a group's COMPCOLL_STATE_DIR files beside its rank and size:
    nothing for the default group (torch names it "0"), "group-<name>" for
    the others. torch names groups by a counter of group creations (or a
    hash of the ranks and that counter), the same in every run of the same
    script, so a restarted job's groups find their files again, and a
    new_group over every rank does not collide with the default group."""
    if group_name is None or str(group_name) in ("", "0"):
        return ""
    return "group-" + re.sub(r"[^A-Za-z0-9_.]", "_", str(group_name))[:64]


def _log_group(group_name):
    """What a group's log lines name beside their rank: nothing for the
    default group (its ranks are the job's), its torch name for the others
    (whose ranks are their own)."""
    return "" if group_name is None or str(group_name) in ("", "0") else str(group_name)


def _children(device_lane):
    """What builds the groups made from a group by split_group and
    merge_remote_group (torch asks the parent's backend): each is built as
    its parent was, with the same device lane, over the store torch gives it,
    and keeps its own error-feedback state."""
    def child(store, rank, size, timeout, group_name):
        return _build_group(creators.CreatorArgs(store, rank, size, timeout, group_name or None,
                                                 None), device_lane)
    return child


def _build_group(args, device_lane):
    """The backend for a group (args: compcoll_creators.creator_args, either
    calling convention of Backend.register_backend); device_lane: whether
    cuda tensors may get their own (NCCL) lane."""
    store, rank, size, timeout, group_name, global_ranks, enable_reconfigure = args
    if enable_reconfigure:
        raise ValueError(
            f"compcoll: group '{group_name or '0'}' is created with enable_reconfigure=True "
            "(torch's fault-tolerance regime, where reconfigure() sets up the group later), "
            "which compcoll does not support: create it without enable_reconfigure, or create "
            "it as \"gloo\" with COMPCOLL_ALGO unset")
    # A rank with a bad COMPCOLL_* value tells the others before it raises:
    # they would otherwise wait in the join, or fail later in the
    # configuration exchange with a closed connection that names no rank.
    try:
        _C.validate_config()
    except Exception as e:
        _join.announce_bad_configuration(store, rank, size, e)
        raise
    # A rank without COMPCOLL_ALGO would build torch's own Gloo instead, and
    # neither side would find the other before the group's timeout.
    _join.await_every_rank(store, rank, size, timeout, group_name if group_name else "0")
    inner = _inner_gloo(store, rank, size, timeout, group_name, global_ranks)
    lane, factory = None, None
    if _TEST_STAGED_CPU:
        lane = "staged_cpu"
        factory = lambda: _inner_staged_cpu(store, rank, size, timeout)  # noqa: E731
    elif device_lane and _nccl_usable():
        lane = "cuda"
        factory = lambda: _inner_nccl(store, rank, size, timeout, group_name,  # noqa: E731
                                      global_ranks)
    stats_rank, stats_world = _global_identity(rank, size, global_ranks)
    backend = _C.create_backend(inner, timeout, lane, factory, stats_rank, stats_world,
                                _state_tag(group_name), _children(device_lane),
                                _log_group(group_name), store)
    global _groups_built
    with _lock:
        _groups_built += 1
    _install_exit_hooks()
    _momentum.install()
    _ddp_join.install()
    _ddp_hooks.install()
    _loss_scale.install()
    _tensor_parallel.install()
    _sync_batchnorm.install()
    _activation_checkpoint.install()
    return backend


def _create(*args):
    """Creator of the "compcoll" backend (cpu and cuda). Asked for by name
    with COMPCOLL_ALGO unset, it runs every allreduce exact: said once per
    process on rank 0, since the script asked for compcoll and would get
    none of its compression without a word (COMPCOLL_ALGO=dense says that
    exact is meant, and is not said)."""
    group = creators.creator_args(args)
    if not os.environ.get("COMPCOLL_ALGO", "").strip():
        _notices._once("compcoll backend without an algorithm", group.rank, lambda: (
            "init_process_group(\"compcoll\") with COMPCOLL_ALGO unset: every allreduce runs "
            "exact, as Gloo's would; set COMPCOLL_ALGO to dgc, sbc, sdagc, csc, onebit or auto "
            "to compress (compcoll-info lists them), or COMPCOLL_ALGO=dense to say that exact "
            "is meant; said once per process"))
    return _build_group(group, device_lane=True)


def create_for_gloo(*args):
    """Creator behind the gloo hook: the script asked for Gloo, so cuda
    tensors stay on Gloo (uncompressed) and no NCCL group is built (Gloo
    allows several ranks per GPU, NCCL does not). A group asked for with
    enable_reconfigure stays torch's own Gloo, and rank 0 says so: compcoll
    cannot be reconfigured, and building it anyway would ignore the request."""
    group = creators.creator_args(args)
    if group.enable_reconfigure:
        _notices.reconfigure_left_to_gloo(group)
        return _torch_gloo(*args)
    if not compcoll_autoload.compression_requested():
        # COMPCOLL_ALGO was set when the hook went in and is unset (or dense)
        # now, as this group is created (a script's second phase that cleared
        # it): torch's own Gloo, as with no COMPCOLL_ALGO from the start.
        return _torch_gloo(*args)
    return _build_group(group, device_lane=False)


def register():
    """Registers the "compcoll" backend name (devices cpu and cuda). Idempotent."""
    global _registered
    with _lock:
        if _registered or "COMPCOLL" in getattr(dist.Backend, "_plugins", {}):
            _registered = True
            return
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=DEVICES)
        _registered = True


def install_gloo_hook():
    """Makes the "gloo" backend resolve to compcoll (wrapping Gloo). Idempotent.

    Returns True when installed. On a torch that builds gloo outside the
    backend plugin table it warns and returns False: use
    init_process_group("compcoll") there.
    """
    global _torch_gloo
    register()
    with _lock:
        if _torch_gloo is not None:
            return True
        original = creators.torch_plugin("GLOO")
        if original is None:
            warnings.warn(
                f"compcoll: torch {torch.__version__} builds the gloo backend outside "
                "torch.distributed.Backend._plugins, so COMPCOLL_ALGO cannot turn "
                "init_process_group('gloo') into compcoll; use init_process_group('compcoll')",
                stacklevel=2,
            )
            return False
        _torch_gloo = creators.torch_creator(original)
        creators.set_creator("GLOO", create_for_gloo, True)
    # torch's NCCL groups stay torch's: their cuda tensors are not compressed,
    # and the first one says so; unless the NCCL interposer is preloaded,
    # whose state then follows torch.amp.GradScaler as the groups' do.
    _notices.install_nccl_notice()
    _loss_scale.follow_interposer()
    return True


def is_gloo_hooked():
    """True when "gloo" groups this process creates get the compcoll backend
    (install_gloo_hook ran: the autoload with COMPCOLL_ALGO set, or
    python -m compcoll.run)."""
    return _torch_gloo is not None


def backend_of(group=None):
    """The compcoll backend serving cpu tensors of group (default: the
    default group), or None when that is not a compcoll backend. The same
    object serves the group's cuda tensors."""
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
    every operation submitted so far: totals over cpu and cuda tensors, and
    each lane's own under "devices" (a lane appears once its communicator
    exists: "cpu" always, "cuda" after the first eligible cuda allreduce)."""
    return json.loads(_C.stats_json(_require(group)))


def finish(group=None):
    """Writes this rank's COMPCOLL_STATS_FILE now (idempotent)."""
    _C.finish(_require(group))


def slots(group=None, device="cpu"):
    """The error-feedback slots of the backend's lane for device ("cpu",
    "cuda"; see docs/pytorch.md)."""
    return _C.slots(_require(group), device)


def state_entries(group=None):
    """Number of error-feedback states the communicators hold (all lanes)."""
    return _C.state_entries(_require(group))


def device_lane(group=None):
    """The name of the group's device lane ("cuda"), or None when cuda
    tensors go to Gloo uncompressed."""
    return _C.device_lane(_require(group))


def inner(group=None, device="cpu"):
    """The inner torch backend of a lane, or None while it has not been
    built (the cuda lane builds its NCCL group on first use)."""
    return _C.inner(_require(group), device)
