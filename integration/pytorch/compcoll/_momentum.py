"""COMPCOLL_MOMENTUM_HANDOVER=auto: take the momentum over from the script's
optimizer, so that DGC's momentum correction works under an unmodified
`torch.optim.SGD(momentum=m)` (docs/convergence.md, "Momentum under SGD").

compcoll only sees gradients; the optimizer is visible here, in the process,
through torch's global optimizer step pre-hook (no torch code is patched).
At each optimizer step every compcoll group that still awaits the momentum
agrees on it (collective over the group: compcoll._C.agree_optimizer_momentum,
integration/pytorch/csrc/optimizer_momentum.cc) and, when every rank proposes
the same m > 0, applies the correction with the hand-over from its next call
on. A group agrees once. Over the step after that it counts its compressed
allreduces against the gradient buffers they reduce: the hand-over needs
exactly one allreduce of each gradient per optimizer step (DDP; no_sync()
accumulation), and where a rank made more (accumulation without no_sync)
the group turns it off again and warns. Afterwards a step costs one check
per group.

What can be taken over: exactly torch.optim.SGD with one momentum m > 0 for
all parameter groups, dampening 0, not Nesterov, not maximize (the hand-over
reproduces that update). Anything else (Adam, SGD without momentum, mixed
groups) proposes 0 and compcoll runs as configured; the reason is logged
once on group rank 0. The first optimizer a process steps decides; a later
one with other settings is reported once, at WARNING.
"""
import logging
import threading
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from compcoll import _C

_log = logging.getLogger("compcoll")
_lock = threading.Lock()
_installed = False
_proposal = None  # (momentum, why) of the first optimizer stepped
_seen = weakref.WeakSet()
_warned_second = False


def sgd_momentum(optimizer):
    """(m, why): the momentum compcoll can take over from `optimizer`, or 0.0
    and the reason it cannot."""
    name = type(optimizer).__name__
    if type(optimizer) is not torch.optim.SGD:
        return 0.0, f"the optimizer is {name}, not torch.optim.SGD"
    groups = optimizer.param_groups
    momenta = {float(g.get("momentum", 0.0)) for g in groups}
    if len(momenta) != 1:
        return 0.0, f"SGD's parameter groups have different momenta {sorted(momenta)}"
    (m,) = momenta
    if not m > 0.0:
        return 0.0, "SGD without momentum"
    if not m < 1.0:
        return 0.0, f"SGD momentum {m} is not below 1"
    for g in groups:
        if g.get("nesterov", False):
            return 0.0, "SGD with nesterov=True"
        if float(g.get("dampening", 0.0)) != 0.0:
            return 0.0, f"SGD with dampening {g.get('dampening')}"
        if g.get("maximize", False):
            return 0.0, "SGD with maximize=True"
    return m, ""


def _pre_step(optimizer, args, kwargs):
    del args, kwargs
    global _proposal, _warned_second
    with _lock:
        if optimizer not in _seen:
            _seen.add(optimizer)
            mine = sgd_momentum(optimizer)
            if _proposal is None:
                _proposal = mine
            elif mine[0] != _proposal[0] and not _warned_second:
                _warned_second = True
                _log.warning(
                    "compcoll: COMPCOLL_MOMENTUM_HANDOVER=auto follows the first optimizer this "
                    "process stepped (momentum %s); %s steps with momentum %s (%s) and its "
                    "gradients get the first one's treatment; set COMPCOLL_MOMENTUM_HANDOVER=0 "
                    "for no hand-over", _proposal[0], type(optimizer).__name__, mine[0],
                    mine[1] or "SGD")
        proposal = _proposal
    _C.agree_optimizer_momentum(proposal[0], proposal[1])


def install():
    """Registers the step pre-hook once per process (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    register_optimizer_step_pre_hook(_pre_step)
