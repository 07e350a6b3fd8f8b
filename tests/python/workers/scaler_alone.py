"""A torch.amp.GradScaler on CPU with no process group: one overflowed step
(the scale halves, the step is skipped), then a good one. Under the NCCL
interposer compcoll's wrappers tell it both (test_loss_scale.py)."""
import torch

from common import emit

torch.set_num_threads(1)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
p = torch.nn.Parameter(torch.ones(4))
opt = torch.optim.SGD([p], lr=0.1)
scales = []
for overflow in (True, False):
    opt.zero_grad()
    loss = (p * (float("inf") if overflow else 1.0)).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    scales.append(scaler.get_scale())
emit({"scales": scales})
