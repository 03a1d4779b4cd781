"""A tensor-parallel MLP on two ranks whose rank 1 divides by 0 in a module between its
column- and row-parallel Linears from step 2 on (x / 0: inf, which w2 turns NaN); a
step whose gradients are not finite on some rank is skipped on all, so the NaN comes
again. Run under torchrun by tests/recorder/test_pinpoint.py."""

import faulthandler

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

faulthandler.dump_traceback_later(150, exit=True)  # a rank stuck in a collective
dist.init_process_group("gloo")
RANK = dist.get_rank()
STEP = [0]


class Risky(nn.Module):
    def forward(self, x):
        if RANK == 1 and STEP[0] >= 2:
            x = x / (x - x)  # rank 1's shard over 0: inf, made NaN by w2's matmul
        return x


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(8, 16)
        self.risky = Risky()
        self.w2 = nn.Linear(16, 8)

    def forward(self, x):
        return self.w2(self.risky(self.w1(x)))


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), MLP(), nn.Linear(8, 1))
parallelize_module(
    model[1], init_device_mesh("cpu", (2,)), {"w1": ColwiseParallel(), "w2": RowwiseParallel()}
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(5):
    STEP[0] = step
    torch.manual_seed(step)  # the same batch on both ranks
    loss = model(torch.randn(4, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    grads = [
        p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in model.parameters()
    ]
    ok = torch.tensor([float(all(bool(torch.isfinite(g).all()) for g in grads))])
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if ok.item() == 1.0:
        opt.step()
    print(f"rank {RANK} step {step} loss {loss.item():.6f}", flush=True)
dist.destroy_process_group()
