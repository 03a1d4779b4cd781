"""Data-parallel training with DistributedDataParallel on CPU (gloo), for torchrun.

    torchrun --nproc-per-node 2 samples/ddp_train.py --steps 6
    torchrun --nproc-per-node 2 -m hookdbg record -o ddp.h5 samples/ddp_train.py

Two ways to break it on purpose, on one rank only:

* ``--nan-rank R --nan-step S``: rank R's batch holds a NaN at step S;
* ``--desync-rank R --desync-step S``: after step S, rank R nudges one weight without
  telling the others, so the replicas silently stop agreeing (a real DDP bug pattern:
  an update outside the optimizer, a rank-dependent branch, a non-deterministic op).
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--nan-rank", type=int, default=-1)
    parser.add_argument("--nan-step", type=int, default=-1)
    parser.add_argument("--desync-rank", type=int, default=-1)
    parser.add_argument("--desync-step", type=int, default=-1)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts them)
    model = DistributedDataParallel(Regressor())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own batches
    for step in range(args.steps):
        x = torch.randn(args.batch, 16, generator=data)
        y = x.sum(1, keepdim=True).sin()
        if rank == args.nan_rank and step == args.nan_step:
            x[0, 0] = float("nan")
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if rank == args.desync_rank and step == args.desync_step:
            with torch.no_grad():
                model.module.head.weight[0, 0] += 1e-3
        if rank == 0:
            print(f"step {step}  loss {loss.item():.4f}  ({world} ranks)", flush=True)
    dist.destroy_process_group()
    if rank == 0 and os.environ.get("LOCAL_RANK") is not None:
        print("done")


if __name__ == "__main__":
    main()
