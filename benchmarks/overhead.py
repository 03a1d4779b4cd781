"""How much slower training runs under ``hookdbg record``: ratios, not absolute times.

Every configuration is measured interleaved with the unrecorded baseline in the same
process (rounds of: baseline, timing, shapes, stats, ...), and each ratio compares
medians, so a machine that is busy for a while slows all of them alike.

    python benchmarks/overhead.py            # resnet18 + NumNet MLP, ~2 minutes
    python benchmarks/overhead.py --quick    # fewer rounds

Targets (docs/performance.md): resnet18 train step (16x3x64x64, CPU) at ``stats``
<= 1.10x, at ``timing`` <= 1.03x; <= 12 us per tiny-module call at ``stats``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "samples"))

from numnet_mlp import NumNet

import hookdbg

LEVELS = ("timing", "shapes", "stats")


def resnet_step() -> tuple[Callable[[], None], int]:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))
    return _train_step(model, opt, x, y)


def mlp_step() -> tuple[Callable[[], None], int]:
    torch.manual_seed(0)
    model = NumNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(64, 8, 8), torch.randint(0, 10, (64,))
    return _train_step(model, opt, x, y)


def _train_step(
    model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> tuple[Callable[[], None], int]:
    criterion = nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad()
        criterion(model(x), y).backward()
        opt.step()

    calls = []
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: calls.append(m))
    step()
    handle.remove()
    return step, len(calls)


def measure(
    step: Callable[[], None], level: str | None, steps: int, workdir: Path
) -> list[tuple[float, float]]:
    """(wall, CPU) seconds per step for ``steps`` steps (after one warm-up step) at
    ``level``. CPU time (all threads of this process) does not count time the machine
    gave to other tenants, so on a shared machine it is the steadier of the two."""
    recorder = None
    if level is not None:
        recorder = hookdbg.record(workdir / f"{level}.h5", level=level, force=True, quiet=True)
        recorder.start()
    try:
        step()
        times = []
        for _ in range(steps):
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            times.append((time.perf_counter() - t0, time.process_time() - c0))
        return times
    finally:
        if recorder is not None:
            recorder.close()


def compare(
    name: str, make: Callable[[], tuple[Callable[[], None], int]], rounds: int, steps: int
) -> dict[str, float]:
    step, calls = make()
    results: dict[str | None, list[tuple[float, float]]] = {None: [], **{lv: [] for lv in LEVELS}}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for level in (None, *LEVELS):
                results[level] += measure(step, level, steps, Path(tmp))
            print(f"  {name}: round {r + 1}/{rounds}", end="\r", file=sys.stderr)

    def medians(level: str | None) -> tuple[float, float]:
        rows = results[level]
        return statistics.median(w for w, _ in rows), statistics.median(c for _, c in rows)

    base_wall, base_cpu = medians(None)
    print(
        f"{name}: {calls} module calls per step, unrecorded step {base_wall * 1e3:.2f} ms wall, "
        f"{base_cpu * 1e3:.2f} ms CPU (medians)"
    )
    out = {}
    for level in LEVELS:
        wall, cpu = medians(level)
        out[level] = cpu / base_cpu
        per_call_wall = (wall - base_wall) / calls * 1e6
        per_call_cpu = (cpu - base_cpu) / calls * 1e6
        print(
            f"  {level:7s} wall {wall / base_wall:5.3f}x ({per_call_wall:+7.1f} us/call)   "
            f"CPU {cpu / base_cpu:5.3f}x ({per_call_cpu:+7.1f} us/call)"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (noisier)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rounds = 3 if args.quick else 8
    print(f"torch {torch.__version__}, {args.threads} threads, {rounds} rounds")
    compare("resnet18 16x3x64x64 train step", resnet_step, rounds, steps=4)
    compare("NumNet MLP 64x8x8 train step", mlp_step, rounds, steps=40)


if __name__ == "__main__":
    main()
