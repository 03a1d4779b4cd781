"""The large-tensor statistics kernel (hookdbg/recorder/blockstats.py) on a GPU: is it
right, next to float64 references, and how fast, next to ``deferred.tensor_stats``
(the path large device tensors took before it)?

    python benchmarks/blockstats.py                  # checks, then the 51M-element timing
    python benchmarks/blockstats.py --sweep          # and BLOCK x WARPS choices
    python benchmarks/blockstats.py --device cpu --quick   # the same in Triton's
                                                           # interpreter (slow: small sizes)

Checks: fp32/fp16/bf16/fp64 tensors of 1e5 to 5e7 elements with a large mean (so that
a one-pass variance would cancel), zeros, and a second set with NaN/+inf/-inf: min,
max and counts must be exact, mean within 1e-12 and std within 1e-10 of float64 two-pass
references, and the summary read back through ``StepBatch`` must say the same.

Timing: one fp32 tensor of 64 x 64 x 112 x 112 elements (resnet18's first activation
at batch 64, 224 x 224), median of CUDA-event times over repeats: the kernel alone, the
kernel and its combine, and ``tensor_stats``; and the host time of one launch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch

from hookdbg.recorder import blockstats, deferred, stats

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def reference(v: torch.Tensor) -> list[float]:
    """deferred.arena_stats's raw row, in float64 from the start (two passes)."""
    v = v.double().flatten()
    numbers = v[~v.isnan()]
    return [
        numbers.min().item(),
        numbers.max().item(),
        v.sum().item(),
        (v - v.mean()).square().sum().item(),
        v.isnan().sum().item(),
        v.isposinf().sum().item(),
        v.isneginf().sum().item(),
        (v == 0).sum().item(),
    ]


def sample(numel: int, dtype: torch.dtype, device: str, special: bool) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(numel)
    x = torch.randn(numel, generator=g, device=device) * 3 + 1000
    x[::97] = 0
    if special:
        x[[0, numel // 3, numel - 1]] = float("nan")
        x[[1, numel // 2]] = float("inf")
        x[numel // 5] = float("-inf")
    return x.to(dtype)


def check(device: str, sizes: list[int]) -> bool:
    good = True
    for dtype in DTYPES:
        for numel in sizes:
            for special in (False, True):
                x = sample(numel, dtype, device, special)
                partials = blockstats.Partials(x.device)
                assert partials.add(blockstats.flat_input(x))
                got = partials.combine().cpu()[0].tolist()
                want = reference(x)
                exact = got[:2] == want[:2] and got[4:] == want[4:]
                # with NaN/inf the sum and M2 are not finite, and not used
                mean_err = 0.0 if special else abs(got[2] - want[2]) / abs(want[2])
                std_err = 0.0 if special else abs(got[3] - want[3]) / want[3]
                batch = deferred.StepBatch(0)
                pending = batch.add(x)
                batch.launch()
                batch.read()
                summary = pending.value
                v = x.double()
                if special:
                    read_ok = summary[stats.NAN : stats.NEGINF + 1] == tuple(map(int, want[4:7]))
                else:
                    read_ok = (
                        abs(summary[stats.MEAN] - v.mean().item()) <= 1e-12 * abs(v.mean().item())
                        and abs(summary[stats.STD] - v.std(correction=0).item())
                        <= 1e-10 * v.std(correction=0).item()
                    )
                ok = exact and mean_err <= 1e-12 and std_err <= 1e-10 and read_ok
                good &= ok
                print(
                    f"{'ok  ' if ok else 'FAIL'} {dtype!s:15} {numel:>10} "
                    f"{'nan/inf' if special else 'finite ':8} exact={exact} "
                    f"mean {mean_err:.1e} M2 {std_err:.1e} read={read_ok}"
                )
    return good


def event_time(fn: Callable[[], object], repeats: int) -> float:
    """Median device time of ``fn`` in microseconds."""
    times = []
    for _ in range(repeats + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times[3:])


def timing(repeats: int) -> None:
    x = torch.randn(64, 64, 112, 112, device="cuda")
    flat = blockstats.flat_input(x)
    assert flat is not None

    def kernel() -> blockstats.Partials:
        partials = blockstats.Partials(x.device)
        partials.add(flat)
        return partials

    kernel().combine()  # compile first
    torch.cuda.synchronize()
    host = []
    for _ in range(20):
        partials = blockstats.Partials(x.device)
        t0 = time.perf_counter()
        partials.add(flat)
        host.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    new = event_time(kernel, repeats)
    both = event_time(lambda: kernel().combine(), repeats)
    old = event_time(lambda: deferred.tensor_stats(x), repeats)
    gbs = x.numel() * 4 / (new * 1e-6) / 1e9
    print(
        f"{x.numel():,} fp32 elements: kernel {new:.0f} us ({gbs:.0f} GB/s), "
        f"kernel + combine {both:.0f} us, tensor_stats {old:.0f} us "
        f"({old / both:.1f}x); host time of one launch {statistics.median(host):.1f} us"
    )


def sweep(repeats: int) -> None:
    x = torch.randn(64, 64, 112, 112, device="cuda")
    flat = blockstats.flat_input(x)
    for block in (512, 1024, 2048, 4096):
        for warps in (4, 8, 16):
            if block // (32 * warps) < 1:
                continue
            blockstats.BLOCK, blockstats.WARPS = block, warps

            def run() -> None:
                blockstats.Partials(x.device).add(flat)

            run()
            print(f"BLOCK {block:5} WARPS {warps:2}: {event_time(run, repeats):7.0f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, or cpu (Triton's interpreter)")
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument("--sweep", action="store_true", help="time BLOCK x WARPS choices")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    blockstats.KERNEL_DEVICES = frozenset({args.device})
    sizes = [100_003, 1_000_003] if args.quick else [100_003, 1_000_003, 10_000_019, 50_000_000]
    if args.device == "cpu":
        blockstats.BLOCK, blockstats.PROGRAMS = 8192, 8  # the interpreter is slow per chunk
        sizes = [100_003]
    good = check(args.device, sizes)
    if args.device == "cuda":
        timing(args.repeats)
        if args.sweep:
            sweep(args.repeats)
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
