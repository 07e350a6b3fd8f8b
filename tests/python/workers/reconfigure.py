"""A group asked for with enable_reconfigure (torch's fault-tolerance regime:
reconfigure() sets the group up later), as "gloo" under COMPCOLL_ALGO or as
"compcoll" (RECONFIGURE_BACKEND). Reports which backend torch got, or the
error."""
import os

import torch
import torch.distributed as dist

from common import emit

backend = os.environ["RECONFIGURE_BACKEND"]
if backend == "compcoll":
    import compcoll  # noqa: F401  registers the backend
try:
    dist.init_process_group(backend, init_method="env://", enable_reconfigure=True)
except Exception as e:  # noqa: BLE001 - reported to the test
    emit({"error": f"{type(e).__name__}: {e}"})
else:
    cpu = dist.group.WORLD._get_backend(torch.device("cpu"))
    emit({"cpu_backend": cpu.name(), "supports_reconfigure": cpu.supports_reconfigure})
