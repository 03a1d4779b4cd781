"""Sharded data-parallel training with FSDP2 (``fully_shard``) on CPU (gloo), for torchrun.

    torchrun --nproc-per-node 2 samples/fsdp2_train.py --steps 6
    torchrun --nproc-per-node 2 -m hookdbg record -o fsdp.h5 samples/fsdp2_train.py
    hookdbg show fsdp.h5 model.blocks.0.0 --step 5 --global

Each block and the root are sharded: every rank holds half of each weight, gathers the
whole for its forward and backward, and keeps half of each gradient. ``--nan-rank R
--nan-step S`` puts a NaN into rank R's half of the first block's weight before step S.
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            *(nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.LayerNorm(32)) for _ in range(3))
        )
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--nan-rank", type=int, default=-1)
    parser.add_argument("--nan-step", type=int, default=-1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    for step in range(args.steps):
        if step == args.nan_step and rank == args.nan_rank:
            with torch.no_grad():
                model.blocks[0][0].weight.to_local()[0, 0] = float("nan")
        x, y = torch.randn(16, 32, generator=data), torch.randn(16, 1, generator=data)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == 0:
            print(f"step {step}  loss {loss.item():.6f}", flush=True)
    first = model.blocks[0][0].weight.full_tensor()
    if rank == 0:
        print(f"norm of blocks.0.0.weight {first.norm().item():.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
