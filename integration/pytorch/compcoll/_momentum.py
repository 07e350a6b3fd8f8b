"""COMPCOLL_MOMENTUM_HANDOVER=auto: take the momentum over from the script's
optimizer, so that DGC's momentum correction works under an unmodified
`torch.optim.SGD(momentum=m)` or `torch.optim.Adam(betas=(b1, b2))`
(docs/convergence.md, "Momentum under SGD" and "Momentum under Adam").

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

What can be taken over:
- exactly torch.optim.SGD with one momentum m > 0 for all parameter groups,
  dampening 0, not Nesterov, not maximize: handed over (the optimizer keeps
  m and gets s_t - m*s_(t-1), so that it steps by DGC's corrected update);
- exactly torch.optim.Adam or AdamW with one beta1 > 0 for all groups, not
  amsgrad, not maximize: moved. Adam's update is not linear in its input,
  so nothing handed to it reproduces DGC; instead compcoll applies the
  momentum correction with beta1 and, once the group agreed, this module
  sets the optimizer's beta1 to 0 (DGC's recipe: the momentum lives in the
  compression, the optimizer steps by what was sent). The optimizer's
  state_dict() still says the script's beta1, and a loaded state dict gets
  beta1 = 0 again at the next step; if the group turns the momentum off
  again, beta1 comes back.
An optimizer that wraps another and steps it (its `.optim`: torch's
ZeroRedundancyOptimizer, PostLocalSGDOptimizer) is looked through: the
inner optimizer's own step comes through the same hook and decides, and a
handed-over or moved momentum is the inner one's (under ZeRO each rank's
shard optimizer, which steps with the same settings on every rank).
Anything else (SGD without momentum, Nesterov, mixed groups) proposes 0 and
compcoll runs as configured; the reason is logged once on group rank 0. The
first optimizer a process steps decides; a later one of the same kind and
momentum is treated alike, one with other settings is reported once, at
WARNING.

With COMPCOLL_MOMENTUM=m set (nothing is taken over), the first optimizer
stepped once a group compressed under it is checked once per process
(check_configured_momentum): an optimizer with a momentum of its own
applies the momentum a second time, and COMPCOLL_MOMENTUM_HANDOVER=1 hands
s_t - m*s_(t-1) to an optimizer that must be SGD with momentum m to turn it
into DGC's update. Both are said at WARNING; nothing else changes.
"""
import logging
import math
import threading
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from compcoll import _C, _notices

_log = logging.getLogger("compcoll")
_lock = threading.Lock()
_installed = False
_proposal = None  # (momentum, moved, why) of the first optimizer stepped
_seen = weakref.WeakSet()
_moved = weakref.WeakKeyDictionary()  # optimizer -> the script's beta1, while compcoll applies it
_hooked = weakref.WeakSet()
_warned_second = False
_checked_configured = False


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


def adam_beta1(optimizer):
    """(beta1, why): the momentum compcoll can move out of `optimizer`, or 0.0
    and the reason it cannot."""
    name = type(optimizer).__name__
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        return 0.0, f"the optimizer is {name}, neither torch.optim.SGD nor Adam/AdamW"
    original = _moved.get(optimizer)
    if original is not None:
        return original, ""
    groups = optimizer.param_groups
    betas = {float(g["betas"][0]) for g in groups}
    if len(betas) != 1:
        return 0.0, f"{name}'s parameter groups have different beta1 {sorted(betas)}"
    (b1,) = betas
    if not 0.0 < b1 < 1.0:
        return 0.0, f"{name} with beta1 {b1}"
    for g in groups:
        if g.get("amsgrad", False):
            return 0.0, f"{name} with amsgrad=True"
        if g.get("maximize", False):
            return 0.0, f"{name} with maximize=True"
    return b1, ""


def proposal_of(optimizer):
    """(m, moved, why) that `optimizer` proposes to the group: SGD's momentum
    to hand over, Adam's beta1 to move, or 0.0 and why neither."""
    if type(optimizer) is torch.optim.SGD:
        m, why = sgd_momentum(optimizer)
        return m, False, why
    b1, why = adam_beta1(optimizer)
    return b1, b1 > 0.0, why


def _restore_beta1_in_saved(optimizer, state_dict):
    """state_dict post-hook: a checkpoint holds the script's beta1, not the 0
    compcoll runs the optimizer with (a resumed run moves it again)."""
    original = _moved.get(optimizer)
    if original is not None:
        for g in state_dict["param_groups"]:
            g["betas"] = (original, g["betas"][1])
    return state_dict


def _set_beta1(optimizer, b1):
    for g in optimizer.param_groups:
        if float(g["betas"][0]) != b1:
            g["betas"] = (b1, g["betas"][1])


def _follow(optimizer, moved_now):
    """Sets the optimizer's beta1 to 0 while a group applies the moved
    momentum, and back to the script's when none does any more."""
    original = _moved.get(optimizer)
    if moved_now > 0.0:
        if original is None:
            m, moved, _ = proposal_of(optimizer)
            # moved_now went through a float: compare at float precision.
            if not (moved and math.isclose(m, moved_now, rel_tol=1e-6)):
                return  # another kind or momentum: reported once in _pre_step
            _moved[optimizer] = m
            if optimizer not in _hooked:
                _hooked.add(optimizer)
                optimizer.register_state_dict_post_hook(_restore_beta1_in_saved)
            _log.info("compcoll: %s's beta1 %s is applied by compcoll's momentum correction; the "
                      "optimizer runs with beta1 = 0 (its state_dict() keeps %s)",
                      type(optimizer).__name__, m, m)
        _set_beta1(optimizer, 0.0)  # again after a load_state_dict
    elif original is not None:
        del _moved[optimizer]
        _set_beta1(optimizer, original)
        _log.info("compcoll: %s's beta1 is %s again (no group applies it any more)",
                  type(optimizer).__name__, original)


def wrapped_optimizer(optimizer):
    """The optimizer `optimizer` wraps and steps (ZeroRedundancyOptimizer's
    and PostLocalSGDOptimizer's `.optim`), or None."""
    inner = getattr(optimizer, "optim", None)
    return inner if isinstance(inner, torch.optim.Optimizer) and inner is not optimizer else None


def _optimizer_momentum(optimizer):
    """(kind, m): SGD's momentum or Adam's beta1 as the script set it (one
    value over the groups: the first group's); another optimizer's
    `momentum` (RMSprop's) or beta1 (NAdam's, RAdam's, ...), which compcoll
    does not take over but can name; or (None, 0.0) for an optimizer with
    neither."""
    name = type(optimizer).__name__
    groups = optimizer.param_groups
    if type(optimizer) is torch.optim.SGD:
        return name, float(groups[0].get("momentum", 0.0))
    if type(optimizer) in (torch.optim.Adam, torch.optim.AdamW):
        original = _moved.get(optimizer)
        return name, original if original is not None else float(groups[0]["betas"][0])
    try:
        if "momentum" in groups[0]:
            return name, float(groups[0]["momentum"])
        if "betas" in groups[0]:
            return name, float(groups[0]["betas"][0])
    except (TypeError, ValueError, IndexError):
        pass
    return None, 0.0


def _momentum_word(optimizer):
    """How `optimizer` names its momentum: "momentum" (SGD, RMSprop) or
    "beta1" (the Adam family)."""
    return "momentum" if "momentum" in optimizer.param_groups[0] else "beta1"


def configured_momentum_notice(optimizer, m, handed_over):
    """What is wrong with stepping `optimizer` under COMPCOLL_MOMENTUM=m
    (handed_over: COMPCOLL_MOMENTUM_HANDOVER=1), or None when nothing is."""
    kind, own = _optimizer_momentum(optimizer)
    if kind is None:
        return None
    if handed_over:
        sgd_m, why = sgd_momentum(optimizer)
        if sgd_m > 0.0 and math.isclose(sgd_m, m, rel_tol=1e-6):
            return None
        what = why if not sgd_m > 0.0 else f"SGD with momentum {sgd_m}"
        return (f"COMPCOLL_MOMENTUM_HANDOVER=1 hands the optimizer s_t - {m:g}*s_(t-1), which "
                f"is DGC's update only under torch.optim.SGD with momentum {m:g} (no dampening, "
                f"not Nesterov), but {what}: the parameters do not move as DGC's momentum "
                "correction would (with no momentum in the optimizer the momentum is cancelled). "
                f"Set the optimizer's momentum to {m:g}, or COMPCOLL_MOMENTUM_HANDOVER=0 with the "
                "optimizer's momentum at 0")
    if not own > 0.0:
        return None
    takeable = proposal_of(optimizer)[0] > 0.0  # what auto would take over or move
    if kind == "SGD":
        fix = ("set the optimizer's momentum to 0" +
               (", or keep it equal to COMPCOLL_MOMENTUM and set COMPCOLL_MOMENTUM_HANDOVER=1, or "
                "unset COMPCOLL_MOMENTUM and let COMPCOLL_MOMENTUM_HANDOVER=auto take the "
                "optimizer's over" if takeable else ""))
    else:
        fix = (f"set the optimizer's {_momentum_word(optimizer)} to 0" +
               (", or unset COMPCOLL_MOMENTUM and let COMPCOLL_MOMENTUM_HANDOVER=auto move the "
                "optimizer's beta1 into compcoll" if takeable else ""))
    return (f"COMPCOLL_MOMENTUM={m:g} applies DGC's momentum correction to the gradients "
            f"compcoll compresses, and {kind} runs a momentum of its own ({own:g}) on top: the "
            "momentum is applied twice and the steps are larger and later than either alone "
            f"would make them; {fix}")


def untaken_momentum_notice(optimizer, why):
    """What to say when COMPCOLL_MOMENTUM_HANDOVER=auto follows `optimizer`
    and cannot take its momentum over (why: proposal_of's reason), or None
    when it has none (SGD without momentum, an optimizer compcoll cannot
    read)."""
    kind, own = _optimizer_momentum(optimizer)
    if kind is None or not own > 0.0:
        return None
    nesterov = any(g.get("nesterov", False) for g in optimizer.param_groups)
    return (f"COMPCOLL_MOMENTUM_HANDOVER=auto cannot take over the momentum of this optimizer "
            f"({why}; momentum {own:g}): DGC's momentum correction stays off, and the optimizer "
            "runs its momentum on the sparse, delayed updates compcoll delivers, which trains "
            "worse than either (docs/convergence.md, \"Momentum under SGD\"). Set the "
            f"optimizer's {_momentum_word(optimizer)} to 0 and "
            f"COMPCOLL_MOMENTUM={own:g}" + (" COMPCOLL_NESTEROV=1" if nesterov else "") +
            (", or use plain torch.optim.SGD (no dampening, not Nesterov), whose momentum is "
             "taken over" if kind == "SGD" else ""))


def check_configured_momentum(optimizer):
    """Once per process, at the first step after a group compressed under
    COMPCOLL_MOMENTUM: says at WARNING on rank 0 what configured_momentum_notice
    finds. Local (no collective): every rank runs the same script."""
    global _checked_configured
    if _checked_configured:
        return
    configured = _C.configured_momentum()
    if configured is None:
        return  # nothing compressed under a configured momentum yet
    _checked_configured = True
    _say_once("configured momentum", configured_momentum_notice(optimizer, *configured))


def schedule_notice(optimizer, taken):
    """What to say (None: nothing) when `optimizer`'s momentum is no longer
    the one compcoll took over at its first step, `taken` = (m, moved, why):
    a momentum schedule (OneCycleLR's or CyclicLR's cycle_momentum=True, on by
    default) or a script that sets it. compcoll keeps applying m (agreeing on
    another is a collective of every rank), so the schedule would otherwise
    change nothing, silently."""
    m, moved = taken[0], taken[1]
    if not m > 0.0 or not optimizer.param_groups:
        return None
    group = optimizer.param_groups[0]
    if moved:
        original = _moved.get(optimizer)
        if original is None or "betas" not in group:
            return None
        now = float(group["betas"][0])
        if now == 0.0 or math.isclose(now, original, rel_tol=1e-6):
            return None  # compcoll's own 0, or the script's value unchanged
        what = f"beta1 is now {now}"
    else:
        if type(optimizer) is not torch.optim.SGD:
            return None
        now = float(group.get("momentum", 0.0))
        if math.isclose(now, m, rel_tol=1e-6):
            return None
        what = f"momentum is now {now}"
    return (f"compcoll: {type(optimizer).__name__}'s {what}, not the {m} that "
            "COMPCOLL_MOMENTUM_HANDOVER=auto took over at its first step (a momentum schedule, "
            "such as OneCycleLR's or CyclicLR's cycle_momentum=True, or a script that sets it): "
            f"compcoll's momentum correction keeps applying {m}, so the new value changes "
            "nothing; set cycle_momentum=False to keep one momentum, or "
            "COMPCOLL_MOMENTUM_HANDOVER=0 to leave the momentum to the optimizer")


def _say_once(key, text):
    """text (None: nothing to say) at WARNING on the job's rank 0, once per
    process (compcoll._notices)."""
    if text is None:
        return
    try:
        rank = torch.distributed.get_rank()
    except (RuntimeError, ValueError):
        rank = 0
    _notices._once("momentum:" + key, rank, lambda: text + " (said once per process)")


def _pre_step(optimizer, args, kwargs):
    del args, kwargs
    global _proposal, _warned_second
    # Every optimizer's, wrappers' too: where the hand-over's mirrors of
    # reallocated tensors are counted from (integration/pytorch/csrc/lane.h).
    _C._note_optimizer_step()
    if wrapped_optimizer(optimizer) is not None:
        return  # the inner optimizer's step comes through this hook too, and decides
    with _lock:
        check_configured_momentum(optimizer)
    pending = _C.momentum_agreement_pending()
    with _lock:
        if optimizer not in _seen and (pending or _proposal is not None):
            # Seen only once a group awaits the agreement (it compressed
            # something): an optimizer stepped before that (a probe model of
            # one rank, fitted before training) is not the one followed.
            _seen.add(optimizer)
            mine = proposal_of(optimizer)
            if _proposal is None:
                _proposal = mine
                if not mine[0] > 0.0:
                    _say_once("untaken momentum", untaken_momentum_notice(optimizer, mine[2]))
            elif mine[:2] != _proposal[:2] and not _warned_second:
                _warned_second = True
                _say_once("second optimizer", (
                    f"COMPCOLL_MOMENTUM_HANDOVER=auto follows the first optimizer this process "
                    f"stepped (momentum {_proposal[0]}); {type(optimizer).__name__} steps with "
                    f"momentum {mine[0]} ({mine[2] or ('Adam' if mine[1] else 'SGD')}) and its "
                    f"gradients get the first one's treatment; set COMPCOLL_MOMENTUM_HANDOVER=0 "
                    f"for no hand-over"))
        # Before any group awaits the agreement nothing is fixed yet: this
        # optimizer's own proposal (no group takes it up).
        proposal = _proposal or proposal_of(optimizer)
    moved_now = _C.agree_optimizer_momentum(proposal[0], proposal[1], proposal[2])
    with _lock:
        if optimizer in _seen and _proposal is not None:
            # Before _follow sets Adam's beta1 back to 0: what the script set.
            _say_once("momentum schedule", schedule_notice(optimizer, _proposal))
        _follow(optimizer, moved_now)


def shadow_step():
    """Takes part, without an optimizer, in what a step does collectively: a
    rank out of inputs under DDP's Join, for each of its peers' steps
    (compcoll._ddp_join). Nothing to do before a group was built."""
    with _lock:
        if not _installed:
            return
    _C.agree_optimizer_momentum(None, False, "")


def install():
    """Registers the step pre-hook once per process (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    register_optimizer_step_pre_hook(_pre_step)
