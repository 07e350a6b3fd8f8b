"""Error-feedback state in training checkpoints.

    sd = {"model": model.state_dict(), "opt": opt.state_dict(),
          "compcoll": compcoll.state_dict()}            # every rank
    torch.save(sd, f"ckpt-rank{rank}.pt")               # state is per rank
    ...
    compcoll.load_state_dict(None, sd["compcoll"])      # after init_process_group

The residuals, momenta and step counters of compressed allreduces are per
rank, so each rank saves and loads its own. A checkpoint is used only by the
same rank of a group of the same size and compression settings (the
configuration hash); otherwise the state starts fresh and an INFO line
(COMPCOLL_DEBUG=INFO) says why. A malformed checkpoint is an error.
See docs/pytorch.md ("Checkpoints").
"""
from compcoll import _C
from compcoll._backend import _require

_FORMAT = "compcoll-state"
_VERSION = 1


def state_dict(group=None):
    """This rank's error-feedback state of group (default: the default group),
    taken after every operation submitted so far, as a dict that torch.save
    can store: {"format", "version", "algo", "lanes": {lane: bytes}}."""
    b = _require(group)
    return {"format": _FORMAT, "version": _VERSION, "algo": _C.algo(b), "lanes": _C.save_state(b)}


def load_state_dict(group, state_dict):
    """Restores what state_dict() returned (on the same rank) into group's
    backend (None: the default group), before any operation submitted after
    this call. Returns {lane: True if its state was restored, False if it
    started fresh (another rank, size or configuration; INFO says which)}."""
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
    return _C.load_state(_require(group), {k: bytes(v) for k, v in lanes.items()})
