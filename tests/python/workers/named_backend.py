"""A script that asks for init_process_group("compcoll") by name and
allreduces one gradient-sized tensor in a backward pass; what COMPCOLL_ALGO
says comes from the environment. The RESULT line reports the algorithm the
stats name and the compressed calls."""
import torch
import torch.distributed as dist

from common import emit, init

rank, world = init("compcoll")
import compcoll  # noqa: E402

w = torch.ones(100_000, requires_grad=True)
(w * (rank + 1)).sum().backward()
dist.all_reduce(w.grad)
st = compcoll.stats()
emit({"rank": rank, "algo": st["algo"], "compressed_calls": st["compressed_calls"],
      "sum": float(w.grad[0])})
dist.destroy_process_group()
