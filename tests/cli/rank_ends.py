"""DDP on 2 CPU ranks (gloo) where one rank ends early, for torchrun under ``hookdbg
record``: ``nan`` gives rank 1 a NaN in its batch at step 2 (run with --on-nan stop,
rank 1 stops there), ``kill`` makes rank 1 kill itself (SIGKILL) at step 2. Either way
rank 0 waits in the gradients' all-reduce for a peer that is gone, and torchrun ends
it. Usage: torchrun --nproc-per-node 2 -m hookdbg record ... rank_ends.py nan|kill"""

import os
import signal
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    how = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(rank)
    for step in range(5):
        x = torch.randn(4, 8, generator=data)
        if rank == 1 and step == 2:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            x[0, 0] = float("nan")
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
