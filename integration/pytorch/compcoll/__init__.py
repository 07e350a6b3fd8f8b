"""compcoll: compressed allreduce (dgc, sbc, sdagc, csc, onebit) for torch.distributed.

Importing this package registers the "compcoll" c10d backend (devices cpu
and cuda; cuda tensors are compressed through an inner NCCL group, host-staged):

    import torch.distributed as dist
    dist.init_process_group("compcoll", ...)

With the package installed and COMPCOLL_ALGO set, `init_process_group("gloo")`
in an unmodified script gets the compcoll backend too (torch's backend
autoload; or `python -m compcoll.run script.py` where autoload cannot reach).
See docs/pytorch.md.
"""
# torch first: `import torch` runs torch's backend autoload, which (with
# COMPCOLL_ALGO set) imports compcoll._backend. Had _backend's own
# `import torch` started that, autoload would meet a half-imported _backend
# (`import compcoll` before `import torch` failed with a circular import).
import torch  # noqa: F401

try:
    from compcoll import _C  # noqa: F401
except ImportError as e:
    # Usually torch was installed or upgraded after compcoll was built: the
    # extension's torch symbols are gone ("undefined symbol: _ZN3c10...").
    raise ImportError(
        f"compcoll: its extension compcoll._C cannot be loaded into torch {torch.__version__} "
        f"({e}). It is compiled against the torch it runs with: rebuild it after installing or "
        "upgrading torch (bash scripts/install-python-package.sh, or python3 -m pip install "
        "--no-build-isolation ./ in the source tree), or unset COMPCOLL_ALGO to run without "
        "compcoll") from e

from compcoll._backend import (  # noqa: F401
    BACKEND_NAME,
    backend_of,
    device_lane,
    finish,
    inner,
    install_gloo_hook,
    is_gloo_hooked,
    register,
    slots,
    state_entries,
    stats,
)
from compcoll._checkpoint import load_state_dict, state_dict  # noqa: F401
from compcoll._scope import gradient_scope  # noqa: F401
from compcoll._tensor_parallel import mark_tensor_parallel  # noqa: F401

# The public API (docs/pytorch.md, "The Python API"); the rest is internal.
__all__ = [
    "BACKEND_NAME", "backend_of", "device_lane", "finish", "gradient_scope", "inner",
    "install_gloo_hook", "is_gloo_hooked", "load_state_dict", "mark_tensor_parallel",
    "register", "slots", "state_dict", "state_entries", "stats",
]

register()
