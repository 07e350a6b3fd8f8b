"""DDP comm hooks under compcoll: one owner per registered hook.

compcoll keeps one error-feedback state per tensor it compresses, and finds
a tensor's state by its buffer (csrc/buffer_slots.h). A hook that reduces a
fresh tensor each call (fp16_compress_hook: `bucket.buffer().to(float16)`)
frees it once the call is done, and the next fresh tensor of that shape
takes the freed one's state. Within one model that is the same bucket, a
step later. With two models of one architecture, each with such a hook and
each trained in a backward pass of its own (two towers, an actor and a
critic, a GAN's generator and discriminator), the two models' buckets would
take turns on one state, each carrying the other's residual into its own
gradient, silently.

So every hook registered on a DDP model while compcoll is loaded runs with
an owner of its own (csrc/issue_scope.h: current_owner), numbered in order
of registration, and a state never passes between owners. The hook itself,
its signature, name and result are unchanged; DDP's built-in C++ hooks
(`_register_builtin_comm_hook`) have no Python call to wrap and keep the
shared keys (docs/pytorch.md, "Error-feedback keys").

A hook that compresses gradients itself (PowerSGD's two hooks: low-rank
factors with their own error feedback; or any hook registered with a
PowerSGDState, such as torch's fp16/bf16 compress wrappers around them) gets an owner marked as such
(csrc/issue_scope.h, kSelfCompressingOwner): everything it issues, and its
callbacks, take the exact route. Compressing its factors again zeroes whole
factors, and its orthogonalization then turns them into NaN at the next
step. Said once at WARN when such a hook is registered: COMPCOLL_ALGO
changes nothing for that model.

A hook that reduces gradients without allreduce (DDP's quantization hooks:
all_gather of their own 8-bit values) gives compcoll nothing to compress,
since compcoll compresses allreduce only: said once at WARN when such a hook
is registered, or the user who set COMPCOLL_ALGO would never hear that it
changed nothing.

Wrapped once per process, when the first compcoll group is built (DDP
needs its process group before a hook can be registered).
"""
import functools
import itertools

import torch.distributed as dist

from compcoll import _C, _notices

_owners = itertools.count(1)  # 0: calls outside any wrapped hook
# torch's own hooks that compcoll must treat apart, by name (their module
# is torch.distributed.algorithms.ddp_comm_hooks.*), with what is said once
# at WARN when one is registered.
_SELF_COMPRESSING = 1 << 62  # csrc/issue_scope.h: kSelfCompressingOwner
_SELF_COMPRESSING_HOOKS = ("powerSGD_hook", "batched_powerSGD_hook")
_GATHERING_HOOKS = ("quantization_pertensor_hook", "quantization_perchannel_hook")


def _torch_hook_name(hook):
    """The name of torch's DDP comm hook behind `hook` (also behind
    functools.partial, as DDPCommHookType registers them), or None for a
    hook of any other module."""
    fn = hook.func if isinstance(hook, functools.partial) else hook
    if "ddp_comm_hooks" not in getattr(fn, "__module__", ""):
        return None
    return getattr(fn, "__name__", None)


def _is_powersgd_state(state):
    """PowerSGD's hooks take a PowerSGDState: so does any hook wrapped
    around them (torch's fp16_compress_wrapper and bf16_compress_wrapper,
    or the user's own), whose name is not PowerSGD's."""
    try:
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState
    except ImportError:
        return False
    return isinstance(state, PowerSGDState)


def _say_once(name, state, text):
    group = state if isinstance(state, dist.ProcessGroup) else getattr(state, "process_group", None)
    try:
        rank = dist.get_rank(group)
    except (RuntimeError, ValueError):
        rank = 0
    _notices._once("ddp comm hook:" + name, rank, lambda: text)


def _say_self_compressing(name, state):
    _say_once(name, state, (
        f"DDP comm hook {name} compresses the gradients itself (low-rank factors with an error "
        "feedback of its own): compcoll sends what it issues exactly, so COMPCOLL_ALGO changes "
        "nothing for that model (compressing its factors again zeroes whole factors and turns "
        "PowerSGD's orthogonalization into NaN); said once per process"))


def _say_gathering(name, state):
    _say_once(name, state, (
        f"DDP comm hook {name} reduces the gradients with all_gather of its own 8-bit values and "
        "issues no allreduce, and compcoll compresses allreduce only: COMPCOLL_ALGO changes "
        "nothing for that model (its gathers go through as they are; without the hook, DDP's "
        "allreduce is compressed); said once per process"))


def _owned(hook, owner):
    @functools.wraps(hook)  # DDP inspects the signature and the name
    def wrapper(state, bucket):
        saved = _C._enter_owner(owner)
        try:
            return hook(state, bucket)
        finally:
            _C._exit_owner(saved)
    wrapper.__compcoll_owner__ = owner
    return wrapper


def _registering(register_comm_hook):
    @functools.wraps(register_comm_hook)
    def wrapper(self, state, hook):
        if callable(hook) and not hasattr(hook, "__compcoll_owner__"):
            owner = next(_owners)
            name = _torch_hook_name(hook)
            if name in _SELF_COMPRESSING_HOOKS or _is_powersgd_state(state):
                owner |= _SELF_COMPRESSING
                _say_self_compressing(name or getattr(hook, "__name__", "hook"), state)
            elif name in _GATHERING_HOOKS:
                _say_gathering(name, state)
            hook = _owned(hook, owner)
        return register_comm_hook(self, state, hook)
    wrapper.__compcoll_owners__ = True
    return wrapper


@functools.cache
def install():
    """Wraps DistributedDataParallel.register_comm_hook, once per process."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if not getattr(DDP.register_comm_hook, "__compcoll_owners__", False):
        DDP.register_comm_hook = _registering(DDP.register_comm_hook)
