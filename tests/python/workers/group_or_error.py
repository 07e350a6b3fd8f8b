"""Creates the default group ("gloo", a 120 s timeout) and runs one allreduce,
reporting the error instead of raising: what each rank saw, and when."""
import datetime
import json
import time

import torch
import torch.distributed as dist

start = time.monotonic()
result = {}
try:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    t = torch.ones(100000)
    dist.all_reduce(t)
    result["first"] = t[0].item()
except Exception as e:  # noqa: BLE001 - the test reads what it was
    result["error"] = str(e).splitlines()[0]
result["seconds"] = time.monotonic() - start
print("RESULT " + json.dumps(result), flush=True)
