"""DDP's Join (uneven inputs) under compcoll.

With `with Join([ddp_model]):` a rank that has run out of inputs stays in
the Join context and, for every iteration the other ranks still train,
shadows their collectives: DDP's join hook (`_DDPJoinHook.main_hook`) issues
the allreduces of their forward and backward passes, with zeros for its
gradients. compcoll must shadow what it adds to an iteration the same way,
or the ranks call different collectives and fail (Gloo: "Is there a
distributed collective mismatch") or wait until the group's timeout:

- The gradient allreduces: the peers issue theirs in backward, where
  COMPCOLL_TORCH_SCOPE=backward compresses them; the shadowing rank issues
  its own outside any backward pass, so the join hook runs in
  compcoll.gradient_scope() and they take the same (compressed) route.
- The optimizer step: COMPCOLL_MOMENTUM_HANDOVER=auto agrees on the
  optimizer's momentum at the peers' first step and checks one allreduce
  per gradient at the third (compcoll._momentum), a collective each. After
  an iteration whose gradients were synchronized (DDP's
  require_forward_param_sync, which the hook sets), the shadowing rank takes
  part in those as a rank without an optimizer (it abstains). This assumes
  what DDP scripts do: one optimizer step per synchronized iteration
  (several optimizers stepped one after another count as one:
  check_one_allreduce_per_step moves on only after compressed calls).

The hook is wrapped once per process, when the first compcoll group is
built (the other torch functions compcoll wraps are DTensor's parallel
styles and reductions, compcoll._tensor_parallel, and DDP's
register_comm_hook, compcoll._ddp_hooks). A torch without it
(other than 2.x) has nothing to wrap, and that is said once.
"""
import functools
import logging

from compcoll import _momentum
from compcoll._scope import gradient_scope

_log = logging.getLogger("compcoll")


def _shadowing(main_hook):
    @functools.wraps(main_hook)
    def wrapper(self, *args, **kwargs):
        with gradient_scope():
            result = main_hook(self, *args, **kwargs)
        if getattr(self.ddp, "require_forward_param_sync", True):
            _momentum.shadow_step()
        return result
    wrapper.__compcoll_shadowing__ = True
    return wrapper


@functools.cache
def install():
    """Wraps DDP's join hook, once per process (a second wrapping, should two
    groups be built at once, is recognised and skipped)."""
    try:
        from torch.nn.parallel.distributed import _DDPJoinHook as hook
    except ImportError:
        hook = None
    main_hook = getattr(hook, "main_hook", None)
    if main_hook is None:
        _log.warning("compcoll: this torch has no DDP join hook (_DDPJoinHook.main_hook) to "
                     "wrap: under DDP's Join a rank out of inputs may not match its peers' "
                     "compressed allreduces; set COMPCOLL_TORCH_SCOPE=all and "
                     "COMPCOLL_MOMENTUM_HANDOVER=0 to use Join")
        return
    if not getattr(main_hook, "__compcoll_shadowing__", False):
        hook.main_hook = _shadowing(main_hook)
