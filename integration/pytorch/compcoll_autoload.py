"""compcoll's torch entry points, kept apart from the compcoll package so
that `import torch` pays nothing for them when compression is off.

autoload()           group "torch.backends": torch runs it at `import torch`
                     (unless TORCH_DEVICE_BACKEND_AUTOLOAD=0). With
                     COMPCOLL_ALGO unset, empty or "dense" and no other
                     COMPCOLL_* variable set it returns at once and imports
                     nothing: torch behaves as without compcoll. With other
                     COMPCOLL_* variables set it only arranges for the first
                     gloo or NCCL group to say that they change nothing
                     (compcoll._notices). Otherwise it makes the "gloo"
                     backend resolve to compcoll (see
                     compcoll._backend.install_gloo_hook).
register_compcoll()  group "torch.distributed.backends": torch runs it the
                     first time the backend name "compcoll" is used.
"""
import os


def compression_requested(environ=os.environ):
    """True when COMPCOLL_ALGO names an algorithm other than dense."""
    return environ.get("COMPCOLL_ALGO", "").strip() not in ("", "dense")


def settings_given(environ=os.environ):
    """COMPCOLL_* variables other than COMPCOLL_ALGO are set."""
    return any(k.startswith("COMPCOLL_") and k != "COMPCOLL_ALGO" for k in environ)


def autoload():
    if not compression_requested():
        if settings_given():
            _install_off_notice()
        return
    from compcoll import _backend

    _backend.install_gloo_hook()


def _install_off_notice():
    """compcoll is off, yet configured: the first gloo or NCCL group will say
    which settings change nothing (compcoll._notices). A notice must never
    break `import torch`: if compcoll cannot be loaded, say that instead."""
    try:
        from compcoll import _notices

        _notices.install_off_notice()
    except Exception as e:  # noqa: BLE001 - anything, reported below
        import sys

        print(f"compcoll WARN COMPCOLL_ALGO is unset or dense, so compcoll is off; the other "
              f"COMPCOLL_* variables set change nothing (compcoll could not be loaded to say "
              f"more: {type(e).__name__}: {e})", file=sys.stderr)


def register_compcoll():
    from compcoll import _backend

    _backend.register()
