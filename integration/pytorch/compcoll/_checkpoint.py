"""Error-feedback state in training checkpoints.

    sd = {"model": model.state_dict(), "opt": opt.state_dict(),
          "compcoll": compcoll.state_dict()}            # every rank
    torch.save(sd, f"ckpt-rank{rank}.pt")               # state is per rank
    ...
    compcoll.load_state_dict(None, sd["compcoll"])      # after init_process_group

The residuals, momenta and step counters of compressed allreduces are per
rank, so each rank saves and loads its own. Loading is collective: every rank
of the group calls load_state_dict (a rank without a checkpoint passes None),
and the ranks restore together or none does. A checkpoint is used only by the
same rank of a group of the same size and compression settings (the
configuration hash); otherwise the state starts fresh and a WARN line says
why. A malformed checkpoint is an error.
See docs/pytorch.md ("Checkpoints").
"""
import torch.distributed as dist

from compcoll import _C, _notices
from compcoll._backend import backend_of

_FORMAT = "compcoll-state"
_VERSION = 1

def _say_once(key, group, message):
    """A WARN line once per process, by the group's rank 0: the same script
    runs with compcoll off (a dense baseline), and a checkpoint at every
    epoch must not repeat it."""
    _notices._once("checkpoint:" + key, dist.get_rank(group), lambda: message)


_OFF = ("the process group has no compcoll backend (COMPCOLL_ALGO unset, empty or dense, or a "
        "backend other than \"gloo\"/\"compcoll\"), so there is no error-feedback state")


def state_dict(group=None):
    """This rank's error-feedback state of group (default: the default group),
    taken after every operation submitted so far, as a dict that torch.save
    can store: {"format", "version", "algo", "lanes": {lane: bytes}}. On a
    group compcoll does not serve (the same script with compression off) it
    holds no lanes, and that is said once: a checkpoint never fails for it."""
    b = backend_of(group)
    if b is None:
        _say_once("state_dict", group, f"compcoll.state_dict: {_OFF}; the dict holds none")
        return {"format": _FORMAT, "version": _VERSION, "algo": None, "lanes": {}}
    return {"format": _FORMAT, "version": _VERSION, "algo": _C.algo(b), "lanes": _C.save_state(b)}


def _lanes_of(state_dict):
    """The {lane: bytes} of a state_dict() result (None: none), or ValueError."""
    if state_dict is None:
        state_dict = {"format": _FORMAT, "version": _VERSION, "algo": None, "lanes": {}}
    if not isinstance(state_dict, dict) or state_dict.get("format") != _FORMAT:
        raise ValueError("compcoll.load_state_dict: not a compcoll.state_dict() result "
                         f"(got {type(state_dict).__name__})")
    if state_dict.get("version") != _VERSION:
        raise ValueError(f"compcoll.load_state_dict: version {state_dict.get('version')!r}, "
                         f"this compcoll reads version {_VERSION}")
    lanes = state_dict.get("lanes")
    if not isinstance(lanes, dict) or not all(
            isinstance(k, str) and isinstance(v, (bytes, bytearray)) for k, v in lanes.items()):
        raise ValueError("compcoll.load_state_dict: 'lanes' must map lane names to bytes")
    return lanes


def load_state_dict(group, state_dict):
    """Restores what state_dict() returned (on the same rank) into group's
    backend (None: the default group), before any operation submitted after
    this call. Collective: every rank of the group calls it, with its own
    state_dict, or None where it has none; the ranks restore together or
    none does (a restore on some ranks only would, under the momentum
    hand-over, make the replicas drift apart). Returns {lane: True if its
    state was restored, False if it started fresh (another rank, size or
    configuration, or another rank could not restore; a WARN says which)};
    on a group compcoll does not serve, every lane is False (said once)."""
    b = backend_of(group)
    try:
        lanes = _lanes_of(state_dict)
    except ValueError:
        # The other ranks are in the collective load by now: take part,
        # offering nothing (they start fresh and say another rank had
        # none), then raise here.
        if b is not None:
            _C.load_state(b, {})
        raise
    if b is None:
        # Compression off now: nothing to restore into. A checkpoint of a
        # compressed run is said to go unused; one of an uncompressed run
        # (no lanes) matches.
        if lanes:
            _say_once("load_state_dict", group, f"compcoll.load_state_dict: {_OFF}: the checkpoint's "
                      f"state (lanes {', '.join(sorted(lanes))}) is not used")
        return {k: False for k in lanes}
    return _C.load_state(b, {k: bytes(v) for k, v in lanes.items()})
