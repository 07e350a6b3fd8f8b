"""What compcoll says about the torch groups it leaves alone, so that
configuration never does nothing without a word. Each notice is given once
per process, by the first group of its kind that the process creates (the
default group, usually), on that group's rank 0, before torch builds it:

- compcoll is off (COMPCOLL_ALGO unset, empty or "dense") but other
  COMPCOLL_* variables are set: a "gloo" or "nccl" group is then torch's own
  and reads none of them (a mistyped COMPCOLL_ALGO is named with the nearest
  variable). The text comes from compcoll's configuration table
  (_C.settings_unread_while_off).
- compcoll is on, through the "gloo" hook, but a group's cuda tensors go to
  torch's NCCL backend: their allreduces (a GPU model's gradients under
  DDP) are not compressed, unless the NCCL interposer is loaded.
"""
import os
import threading

from compcoll import _C, _plugins
# Read at each group's creation, not at import: a script may set
# COMPCOLL_ALGO after `import torch` and call compcoll.install_gloo_hook().
from compcoll_autoload import compression_requested

# torch's NCCL backends: "nccl" (in torch 2.15 its nccl2 backend) and the
# older one it keeps as "nccl-legacy"; a name this torch lacks is skipped.
NCCL_BACKENDS = ("NCCL", "NCCL-LEGACY")

_lock = threading.Lock()
_installed = set()  # (backend name, notice) pairs whose creator calls it first
_said = set()       # notices given (or passed over on ranks other than 0)


def _once(key, rank, message):
    """Gives notice `key` once per process; `message` is a callable, so its
    text is made only by the one call that may say it."""
    with _lock:
        if key in _said:
            return
        _said.add(key)
    if rank == 0:
        text = message()
        if text:
            _C.warn(rank, text)


def _install(name, key, before):
    """Puts notice `key` in front of backend `name`'s creator, once: a
    backend may carry several notices (the off notice, then the NCCL notice
    once a script turns compcoll on itself), never one twice."""
    with _lock:
        if (name, key) in _installed:
            return
        _installed.add((name, key))
    _plugins.call_first(name, before)


def install_off_notice():
    """COMPCOLL_ALGO is unset, empty or dense: the first gloo or NCCL group
    names the COMPCOLL_* settings that therefore change nothing. It is
    installed at `import torch`; a script that turns compcoll on after that
    (COMPCOLL_ALGO set, then compcoll.install_gloo_hook()) does not get it.
    (install_gloo_hook() replaces the gloo creator, this notice with it: a
    hooked gloo group is compcoll's, which names unread settings itself.)"""
    def off_notice(args, what_runs):
        if compression_requested():
            return
        _once("off", args.rank, lambda: _C.settings_unread_while_off(what_runs))

    for name in ("GLOO",) + NCCL_BACKENDS:
        _install(name, "off", lambda args, name=name: off_notice(
            args, f"this '{name.lower()}' group is torch's own"))


def interposer_loaded():
    """libcompcoll_nccl.so is in this process (LD_PRELOAD): it compresses
    torch's NCCL allreduces itself."""
    try:
        with open("/proc/self/maps") as maps:
            return any("libcompcoll_nccl" in line for line in maps)
    except OSError:
        return False


def _nccl_left_alone(args):
    # Nothing to say where nothing would be compressed anyway: the gloo hook
    # installed by a script with COMPCOLL_ALGO unset runs dense.
    if not compression_requested() or interposer_loaded():
        return
    _once("nccl", args.rank, _nccl_notice_text)


def _nccl_notice_text():
    algo = os.environ.get("COMPCOLL_ALGO", "")
    return (f"COMPCOLL_ALGO={algo} turns 'gloo' groups into compcoll, but this group's cuda "
            "tensors go to torch's NCCL backend, which it leaves as it is: their allreduces (a GPU "
            "model's gradients under DDP) are not compressed. To compress them, create the group "
            "as \"compcoll\" (init_process_group(\"compcoll\"): cuda tensors compressed "
            "host-staged, docs/pytorch.md), or preload the NCCL interposer "
            "(LD_PRELOAD=libcompcoll_nccl.so, docs/gpu.md) (said once per process)")


def install_nccl_notice():
    """compcoll is on through the gloo hook: the first NCCL group says that
    its cuda tensors are not compressed."""
    for name in NCCL_BACKENDS:
        _install(name, "nccl", _nccl_left_alone)
