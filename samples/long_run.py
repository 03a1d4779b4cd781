"""A long training run to steer while it trains: start it idle, record a window later.

    hookdbg record --idle -o long.h5 samples/long_run.py --steps 100000
    hookdbg ctl long.h5 status                  # from another terminal
    hookdbg ctl long.h5 record --steps 5        # the next 5 steps at full detail
    hookdbg ctl long.h5 stop                    # close the recording; training goes on

Under torchrun each rank trains a DistributedDataParallel replica (gloo, CPU), and one
`hookdbg ctl long.h5 ...` steers every rank from the same step:

    torchrun --nproc-per-node 2 -m hookdbg record --idle -o long.h5 samples/long_run.py

It stops after --steps steps, or as soon as the file --until names exists (every rank
checks it at the same steps, so they stop together).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--pause", type=float, default=0.01, help="seconds of 'data loading'")
    parser.add_argument("--until", help="stop once this file exists")
    args = parser.parse_args()
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(1 + (dist.get_rank() if distributed else 0))
    step = 0
    for step in range(args.steps):
        if args.until and step % 10 == 0 and _everyone_sees(args.until, distributed):
            break
        x = torch.randn(32, 16, generator=data)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.pause)
    if not distributed or dist.get_rank() == 0:
        print(f"trained {step} steps, last loss {loss.item():.4f}")
    if distributed:
        dist.destroy_process_group()


def _everyone_sees(path: str, distributed: bool) -> bool:
    """Whether ``path`` exists, agreed by all ranks (one all-reduce)."""
    seen = torch.tensor([float(os.path.exists(path))])
    if distributed:
        dist.all_reduce(seen, op=dist.ReduceOp.MAX)
    return bool(seen.item())


if __name__ == "__main__":
    main()
