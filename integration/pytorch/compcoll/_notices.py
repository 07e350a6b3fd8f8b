"""What compcoll says about the torch groups it leaves alone, so that
configuration never does nothing without a word. Each notice is given once
per process, by the first group of its kind that the process creates (the
default group, usually), on that group's rank 0, before torch builds it:

- compcoll is off (COMPCOLL_ALGO unset, empty or "dense") but other
  COMPCOLL_* variables are set: a "gloo" or "nccl" group is then torch's own
  and reads none of them (a mistyped COMPCOLL_ALGO is named with the nearest
  variable). The text comes from compcoll's configuration table
  (_C.settings_unread_while_off). The autoload (compcoll_autoload) calls
  off_notice as each such group is created.
- compcoll is on, through the "gloo" hook, but a group's cuda tensors go to
  torch's NCCL backend: their allreduces (a GPU model's gradients under
  DDP) are not compressed, unless the NCCL interposer is loaded.
- compcoll is on, through the "gloo" hook, but a gloo group is asked for
  with enable_reconfigure: it stays torch's own Gloo (compcoll cannot be
  reconfigured), uncompressed.
"""
import os
import threading

import compcoll_creators as creators
from compcoll import _C
# Read at each group's creation, not at import: a script may set
# COMPCOLL_ALGO after `import torch`.
from compcoll_autoload import compression_requested

_lock = threading.Lock()
_nccl_notice_installed = False
_said = set()  # notices given (or passed over on ranks other than 0)


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


def off_notice(args, name):
    """A group of backend `name` ("GLOO", "NCCL", ...; args: its
    CreatorArgs) is being created while compcoll is off: the first such group
    names the COMPCOLL_* settings that therefore change nothing."""
    if compression_requested():
        return
    what_runs = f"this '{name.lower()}' group is torch's own"
    _once("off", args.rank, lambda: _C.settings_unread_while_off(what_runs))


def interposer_loaded():
    """libcompcoll_nccl.so is in this process (LD_PRELOAD): it compresses
    torch's NCCL allreduces itself."""
    try:
        with open("/proc/self/maps") as maps:
            return any("libcompcoll_nccl" in line for line in maps)
    except OSError:
        return False


def nccl_left_alone(args):
    """An NCCL group is being created while compcoll is on: the first one
    says that its cuda tensors are not compressed."""
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


def reconfigure_left_to_gloo(args):
    """A gloo group asked for with enable_reconfigure stays torch's own."""
    _once("reconfigure", args.rank, lambda: (
        f"group '{args.group_name or '0'}' is created with enable_reconfigure=True (torch's "
        "fault-tolerance regime, where reconfigure() sets up the group later), which compcoll "
        "does not support: it is torch's own Gloo, and its allreduces are not compressed "
        "(said once per process)"))


def install_nccl_notice():
    """compcoll is on through the gloo hook: torch's NCCL creators call
    nccl_left_alone first (once installed, whoever installs it)."""
    global _nccl_notice_installed
    with _lock:
        if _nccl_notice_installed:
            return
        _nccl_notice_installed = True
    for name in creators.NCCL_BACKENDS:
        creators.call_first(name, nccl_left_alone)
