"""Training on 2 CPU ranks (gloo) where one rank ends early, for torchrun under ``hookdbg
record``: ``nan`` gives rank 1 a NaN in its batch at step 2 (run with --on-nan stop,
rank 1 stops there), ``kill`` makes rank 1 kill itself (SIGKILL) at step 2: DDP, where
rank 0 then waits in the gradients' all-reduce for a peer that is gone, and torchrun
ends it. ``tp OUT``: tensor parallel whose row-parallel Linear all-reduces inside its
own forward (as torchtitan's does); rank 1's shard of the first weight goes NaN at step
2. It records itself into OUT with --on-nan stop, its checks waiting for the step's
statistics as on a GPU (so the step with the NaN runs on every rank before any stops).
Usage: torchrun --nproc-per-node 2 [-m hookdbg record ...] rank_ends.py nan|kill|tp [OUT]"""

import os
import signal
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def row_parallel_inside(model: nn.Sequential) -> nn.Module:
    """Split by columns, then by rows, with the row-parallel all-reduce moved from its
    forward hook into its forward."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    row = model[2]
    hooks = list(row._forward_hooks.values())
    row._forward_hooks.clear()
    forward = row.forward

    def reduced(x):
        out = forward(x)
        for hook in hooks:
            out = hook(row, (x,), out)
        return out

    row.forward = reduced
    return model


def main() -> None:
    how = sys.argv[1]
    dist.init_process_group("gloo")
    if how == "tp":
        from hookdbg.options import RecordOptions
        from hookdbg.ranks import rank_file
        from hookdbg.recorder import Recorder

        options = RecordOptions.build(quiet=True, on_nan="stop")
        with Recorder(rank_file(sys.argv[2], dist.get_rank()), options, defer_cpu=True):
            train(how)
        return
    train(how)
    dist.destroy_process_group()


def train(how: str) -> None:
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    model = row_parallel_inside(model) if how == "tp" else DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(rank)
    for step in range(5):
        x = torch.randn(4, 8, generator=data)
        if rank == 1 and step == 2:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif how == "tp":
                with torch.no_grad():
                    model[0].weight._local_tensor[0, 0] = float("nan")
            else:
                x[0, 0] = float("nan")
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


if __name__ == "__main__":
    main()
