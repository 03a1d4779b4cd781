"""What recording costs sharded training: FSDP2 and tensor parallel on 2 CPU ranks (gloo).

Each workload is trained in rounds that alternate the unrecorded baseline and
``hookdbg.record`` at ``--level stats`` in the same processes: a round runs warm-up
steps, flushes the recorder, times the next steps, and flushes again, so the timed steps
carry what recording costs as it goes (the hooks, the writer beside them) and nothing
that comes once. Rank 0 prints the median step time of each and their ratio; every rank
waits at a barrier around the timed steps, so the step time is the slowest rank's.

    python benchmarks/sharded.py             # launches itself under torchrun, 2 ranks
    python benchmarks/sharded.py --rounds 7

Workloads:

* ``fsdp2``: 8 blocks of (Linear(256, 256), GELU, LayerNorm), batch 32, each block and
  the root ``fully_shard``-ed;
* ``tp``: 4 feed-forward blocks (Linear 256 -> 1024 -> 256 with GELU), columns then rows
  split over the ranks, batch 32 x 16 tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import hookdbg

Step = Callable[[], None]


def fsdp2() -> Step:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(
        *(nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.LayerNorm(256)) for _ in range(8))
    )
    for block in model:
        fully_shard(block)
    fully_shard(model)
    return _trainer(model, lambda g: torch.randn(32, 256, generator=g))


def tp() -> Step:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    model = nn.Sequential(
        *(nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)) for _ in range(4))
    )
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    plan = {
        f"{i}.{j}": style
        for i in range(4)
        for j, style in ((0, ColwiseParallel()), (2, RowwiseParallel()))
    }
    parallelize_module(model, mesh, plan)
    return _trainer(model, lambda g: torch.randn(32, 16, 256, generator=g))


def _trainer(model: nn.Module, batch: Callable[[torch.Generator], torch.Tensor]) -> Step:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())

    def step() -> None:
        loss = model(batch(g)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    return step


def timed(step: Step, steps: int) -> float:
    """Median seconds per step, the slowest rank's (a barrier around each)."""
    times = []
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        dist.barrier()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def round_of(step: Step, recorded: bool, folder: Path, warmup: int, steps: int) -> float:
    if not recorded:
        for _ in range(warmup):
            step()
        return timed(step, steps)
    with hookdbg.record(folder / "run.h5", force=True, quiet=True) as rec:
        for _ in range(warmup):
            step()
        rec.flush()
        seconds = timed(step, steps)
        rec.flush()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    if "RANK" not in os.environ:  # not under torchrun yet: launch 2 ranks of ourselves
        launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        sys.exit(subprocess.call([*launch, __file__, *sys.argv[1:]], env=env))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / f"rank{rank}"
        folder.mkdir()
        for name, make in (("fsdp2", fsdp2), ("tp", tp)):
            step = make()
            plain, recorded = [], []
            for _ in range(args.rounds):
                plain.append(round_of(step, False, folder, args.warmup, args.steps))
                recorded.append(round_of(step, True, folder, args.warmup, args.steps))
            if rank == 0:
                base, rec = statistics.median(plain), statistics.median(recorded)
                print(
                    f"{name:6} unrecorded {base * 1e3:8.2f} ms/step   stats {rec * 1e3:8.2f} "
                    f"ms/step   ratio {rec / base:.3f}x",
                    flush=True,
                )
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
