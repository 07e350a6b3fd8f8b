"""compcoll's torch entry points, kept apart from the compcoll package so
that `import torch` pays nothing for them when compression is off.

autoload()           group "torch.backends": torch runs it at `import torch`
                     (unless TORCH_DEVICE_BACKEND_AUTOLOAD=0). With
                     COMPCOLL_ALGO unset, empty or "dense" it returns at once
                     and imports nothing: torch behaves as without compcoll.
                     Otherwise it makes the "gloo" backend resolve to
                     compcoll (see compcoll._backend.install_gloo_hook).
register_compcoll()  group "torch.distributed.backends": torch runs it the
                     first time the backend name "compcoll" is used.
"""
import os


def compression_requested(environ=os.environ):
    """True when COMPCOLL_ALGO names an algorithm other than dense."""
    return environ.get("COMPCOLL_ALGO", "").strip() not in ("", "dense")


def autoload():
    if not compression_requested():
        return
    from compcoll import _backend

    _backend.install_gloo_hook()


def register_compcoll():
    from compcoll import _backend

    _backend.register()
