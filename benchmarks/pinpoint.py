"""What naming the op of a NaN/inf origin costs (hookdbg/recorder/alerts/pinpoint.py).

Before an origin nothing: no op-level check is installed, so a healthy run pays nothing
for it (the recorder's per-call path does not change). At an origin, one of two costs:

* the re-run of a forward origin: its forward once more on copies of its inputs and
  buffers, under the op-level check (time and the copies' memory);
* the watch, on for up to three steps after an origin it cannot run again: every op
  of those steps passes through the check, and torch's anomaly mode keeps each autograd
  node's forward stack.

This measures both on resnet18 (16 x 3 x 64 x 64, a training step: forward, backward,
SGD) in one process, interleaved with the plain step, CPU time, medians of rounds:

    python benchmarks/pinpoint.py
    python benchmarks/pinpoint.py --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator

import torch
import torchvision

from hookdbg.recorder.alerts.pinpoint import OpCheck, rerun


def _cpu() -> float:
    return time.process_time()


@contextlib.contextmanager
def _watch() -> Iterator[None]:
    """The watch as the recorder runs it: the check, with anomaly mode's stacks."""
    before = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
    torch.set_anomaly_enabled(True, False)
    try:
        with OpCheck(lambda: False):
            yield
    finally:
        torch.set_anomaly_enabled(*before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model = torchvision.models.resnet18(num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    def timed(
        body: Callable[[], None], around: Callable[[], contextlib.AbstractContextManager]
    ) -> float:
        with around():
            t0 = _cpu()
            for _ in range(args.steps):
                body()
            return (_cpu() - t0) / args.steps

    step()  # warm-up
    plain, watched, reruns = [], [], []
    for _ in range(args.rounds):
        plain.append(timed(step, contextlib.nullcontext))
        watched.append(timed(step, _watch))
        t0 = _cpu()
        found = rerun(
            model.layer3,
            (torch.randn(16, 128, 8, 8),),
            {},
            "",
            lambda: False,
            contextlib.nullcontext,
        )
        reruns.append(_cpu() - t0)
        assert isinstance(found, str)  # finite values: nothing to name, but all of it ran
    base = statistics.median(plain)
    print("resnet18, 16 x 3 x 64 x 64, CPU time per training step (median of rounds)")
    print(f"  plain step                       {base * 1e3:8.1f} ms")
    print(
        f"  step under the watch             {statistics.median(watched) * 1e3:8.1f} ms   "
        f"{statistics.median(watched) / base:5.2f}x"
    )
    print(f"  re-run of layer3 (forward only)  {statistics.median(reruns) * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
