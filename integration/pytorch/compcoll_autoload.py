"""compcoll's torch entry points, kept apart from the compcoll package so
that `import torch` pays nothing for them when compression is off.

autoload()           group "torch.backends": torch runs it at `import torch`
                     (unless TORCH_DEVICE_BACKEND_AUTOLOAD=0). With
                     COMPCOLL_ALGO set to an algorithm other than dense it
                     makes the "gloo" backend resolve to compcoll at once (see
                     compcoll._backend.install_gloo_hook). Otherwise it
                     imports nothing of compcoll and only puts a small check
                     in front of torch's gloo and NCCL creators, which reads
                     the environment again as each group is created:
                     - COMPCOLL_ALGO set since `import torch` (a script that
                       sets os.environ before init_process_group, as it sets
                       MASTER_ADDR): the group is compcoll's all the same;
                     - other COMPCOLL_* variables set: the first group says
                       that they change nothing (compcoll._notices);
                     - nothing set: torch builds the group, nothing imported.
register_compcoll()  group "torch.distributed.backends": torch runs it the
                     first time the backend name "compcoll" is used.
"""
import functools
import os
import sys


def compression_requested(environ=os.environ):
    """True when COMPCOLL_ALGO names an algorithm other than dense."""
    return environ.get("COMPCOLL_ALGO", "").strip() not in ("", "dense")


def settings_given(environ=os.environ):
    """COMPCOLL_* variables other than COMPCOLL_ALGO are set."""
    return any(k.startswith("COMPCOLL_") and k != "COMPCOLL_ALGO" for k in environ)


def autoload():
    if compression_requested():
        from compcoll import _backend

        _backend.install_gloo_hook()
        return
    import compcoll_creators as creators

    creators.wrap("GLOO", _gloo_group)
    for name in creators.NCCL_BACKENDS:
        creators.wrap(name, functools.partial(_nccl_group, name))


def _gloo_group(creator, *args):
    """torch creates a gloo group, compcoll having been off at `import torch`."""
    if compression_requested():
        from compcoll import _backend

        _backend.install_gloo_hook()  # the next gloo groups go to compcoll directly
        return _backend.create_for_gloo(*args)
    _say_off("GLOO", args)
    return creator(*args)


def _nccl_group(name, creator, *args):
    """torch creates an NCCL group, compcoll having been off at `import torch`."""
    if compression_requested():
        from compcoll import _backend, _notices
        import compcoll_creators as creators

        _backend.install_gloo_hook()  # and the NCCL notice for the next NCCL groups
        _notices.nccl_left_alone(creators.creator_args(args))
    else:
        _say_off(name, args)
    return creator(*args)


_off_unsayable = False  # the fallback below was printed


def _say_off(name, args):
    """compcoll is off, yet configured: the first group says which settings
    change nothing (compcoll._notices). A notice must never break a group's
    creation: if compcoll cannot be loaded, say that instead, once."""
    global _off_unsayable
    if not settings_given():
        return
    try:
        from compcoll import _notices
        import compcoll_creators as creators

        _notices.off_notice(creators.creator_args(args), name)
    except Exception as e:  # noqa: BLE001 - anything, reported below
        if _off_unsayable:
            return
        _off_unsayable = True
        print(f"compcoll WARN COMPCOLL_ALGO is unset or dense, so compcoll is off; the other "
              f"COMPCOLL_* variables set change nothing (compcoll could not be loaded to say "
              f"more: {type(e).__name__}: {e})", file=sys.stderr)


def register_compcoll():
    from compcoll import _backend

    _backend.register()
