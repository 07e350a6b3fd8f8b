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

# torch's NCCL backends: "nccl" (in torch 2.15 its nccl2 backend) and the
# older one it keeps as "nccl-legacy"; a name this torch lacks is skipped.
NCCL_BACKENDS = ("NCCL", "NCCL-LEGACY")

_lock = threading.Lock()
_installed = set()  # backend names whose creator calls a notice first
_said = set()       # notices given (or passed over on ranks other than 0)


def _once(key, rank, message):
    with _lock:
        if key in _said:
            return
        _said.add(key)
    if rank == 0 and message:
        _C.warn(rank, message)


def _install(name, before):
    with _lock:
        if name in _installed:
            return
        _installed.add(name)
    _plugins.call_first(name, before)


def install_off_notice():
    """COMPCOLL_ALGO is unset, empty or dense: the first gloo or NCCL group
    names the COMPCOLL_* settings that therefore change nothing."""
    for name in ("GLOO",) + NCCL_BACKENDS:
        what_runs = f"this '{name.lower()}' group is torch's own"
        _install(name, lambda args, what_runs=what_runs: _once(
            "off", args.rank, _C.settings_unread_while_off(what_runs)))


def interposer_loaded():
    """libcompcoll_nccl.so is in this process (LD_PRELOAD): it compresses
    torch's NCCL allreduces itself."""
    try:
        with open("/proc/self/maps") as maps:
            return any("libcompcoll_nccl" in line for line in maps)
    except OSError:
        return False


def _nccl_left_alone(args):
    if interposer_loaded():
        return
    algo = os.environ.get("COMPCOLL_ALGO", "")
    _once("nccl", args.rank,
          f"COMPCOLL_ALGO={algo} turns 'gloo' groups into compcoll, but this group's cuda "
          "tensors go to torch's NCCL backend, which it leaves as it is: their allreduces (a GPU "
          "model's gradients under DDP) are not compressed. To compress them, create the group "
          "as \"compcoll\" (init_process_group(\"compcoll\"): cuda tensors compressed "
          "host-staged, docs/pytorch.md), or preload the NCCL interposer "
          "(LD_PRELOAD=libcompcoll_nccl.so, docs/gpu.md) (said once per process)")


def install_nccl_notice():
    """compcoll is on through the gloo hook: the first NCCL group says that
    its cuda tensors are not compressed."""
    for name in NCCL_BACKENDS:
        _install(name, _nccl_left_alone)
