"""The large-tensor kernels on a GPU: the statistics kernel
(hookdbg/recorder/summaries/blockstats.py) and the two histogram kernels
(hookdbg/recorder/summaries/blockhist.py). Are they right, next to float64
references and numpy.histogram, and how fast, next to the torch paths large device
tensors took before them (``deferred.tensor_stats``,
``histograms.tensor_histogram``)? Exits 1 on any mismatch.

    python benchmarks/blockstats.py                  # checks, then the 51M-element timings
    python benchmarks/blockstats.py --sweep          # and BLOCK x WARPS choices
    python benchmarks/blockstats.py --device cpu --quick   # the same in Triton's
                                                           # interpreter (slow: small sizes)

Statistics checks: fp32/fp16/bf16/fp64 tensors of 1e5 to 5e7 elements with a large mean
(so that a one-pass variance would cancel), zeros, and a second set with NaN/+inf/-inf:
min, max and counts must be exact, mean within 1e-12 and std within 1e-10 of float64
two-pass references, and the summary read back through ``StepBatch`` must say the same.

Histogram checks: fp32/fp16/bf16 tensors of 1e5 to 5e7 elements (normal values, zeros,
subnormals on both sides of an edge at 0, and a second set with NaN/+inf/-inf), 32 bins
(and 1000 up to 1e6 elements): the kernels' row and the histogram ``StepBatch`` reads
back must equal ``numpy.histogram`` of the finite values in float64, the range its
finite min and max.

Timings: one fp32 tensor of 64 x 64 x 112 x 112 elements (resnet18's first activation
at batch 64, 224 x 224), median of CUDA-event times over repeats: the statistics kernel
alone, with its combine, and ``tensor_stats``; the two histogram kernels and
``tensor_histogram`` (32 and 1024 bins); and the host time of a launch.
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

import numpy as np
import torch

from hookdbg.recorder.summaries import blockhist, blockstats, deferred, histograms, stats

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


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
                want = deferred.exact_row(x)
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


def histogram_sample(numel: int, dtype: torch.dtype, device: str, special: bool) -> torch.Tensor:
    """Normal values from -8 to 8 exactly (so that an edge lies at 0 for an even number
    of bins), zeros, and subnormals of the dtype on both sides of 0 (a kernel that
    flushed them to 0 would put the negative ones one bin up; not in bf16 on the CPU,
    whose Triton interpreter does flush them)."""
    g = torch.Generator(device=device).manual_seed(numel + 1)
    x = (torch.randn(numel, generator=g, device=device) * 2).clamp(-7.5, 7.5).to(dtype)
    x[[0, 1]] = torch.tensor([-8.0, 8.0], dtype=dtype, device=device)
    x[2::101] = 0
    if device != "cpu" or dtype != torch.bfloat16:
        tiny = torch.finfo(dtype).tiny
        x[3::1009] = tiny / 2
        x[4::1013] = -tiny / 4
    if special:
        x[[5, numel // 3, numel - 1]] = float("nan")
        x[[6, numel // 2]] = float("inf")
        x[numel // 5] = float("-inf")
    return x


def check_histograms(device: str, sizes: list[int]) -> bool:
    good = True
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for numel in sizes:
            for special in (False, True):
                x = histogram_sample(numel, dtype, device, special)
                values = x.double().cpu().numpy()
                finite = values[np.isfinite(values)]
                for bins in (32, 1000) if numel <= 1_000_003 else (32,):
                    want, edges = np.histogram(finite, bins=bins)
                    row = blockhist.histogram(x, bins)
                    assert row is not None, "the histogram kernels did not run"
                    got = row.cpu().numpy()[0]
                    exact = np.array_equal(got[2:], want) and (got[0], got[1]) == (
                        edges[0],
                        edges[-1],
                    )
                    batch = deferred.StepBatch(0, bins)
                    pending = batch.add(x)
                    batch.launch()
                    batch.read()
                    summary = pending.value
                    read = np.frombuffer(summary[histograms.HISTOGRAM], dtype=np.int64)
                    read_ok = np.array_equal(read, want) and (
                        summary[stats.MIN],
                        summary[stats.MAX],
                    ) == (finite.min(), finite.max())
                    ok = exact and read_ok
                    good &= ok
                    off = int(np.abs(got[2:] - want).sum())
                    print(
                        f"{'ok  ' if ok else 'FAIL'} histogram {dtype!s:15} {numel:>10} "
                        f"{'nan/inf' if special else 'finite ':8} {bins:5} bins: "
                        f"exact={exact} (counts off by {off}) read={read_ok}"
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


def histogram_timing(repeats: int) -> None:
    x = torch.randn(64, 64, 112, 112, device="cuda")
    for bins in (32, 1024):
        assert blockhist.histogram(x, bins) is not None  # compile first
        torch.cuda.synchronize()
        host = []
        for _ in range(20):
            t0 = time.perf_counter()
            blockhist.histogram(x, bins)
            host.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        new = event_time(lambda bins=bins: blockhist.histogram(x, bins), repeats)
        old = event_time(
            lambda bins=bins: histograms.tensor_histogram(x, bins, deferred.ARENA), repeats
        )
        gbs = 2 * x.numel() * 4 / (new * 1e-6) / 1e9
        print(
            f"{x.numel():,} fp32 elements, {bins} bins: histogram kernels {new:.0f} us "
            f"({gbs:.0f} GB/s over two passes), tensor_histogram {old:.0f} us "
            f"({old / new:.1f}x); host time per tensor {statistics.median(host):.1f} us "
            "(two launches)"
        )


def histogram_sweep(repeats: int) -> None:
    x = torch.randn(64, 64, 112, 112, device="cuda")
    for block in (512, 1024, 2048, 4096):
        for warps in (4, 8, 16):
            if block // (32 * warps) < 1:
                continue
            blockhist.BLOCK, blockhist.WARPS = block, warps
            blockhist.histogram(x, 32)
            took = event_time(lambda: blockhist.histogram(x, 32), repeats)
            print(f"histogram BLOCK {block:5} WARPS {warps:2}: {took:7.0f} us")


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
    blockstats.KERNEL_DEVICES = blockhist.KERNEL_DEVICES = frozenset({args.device})
    sizes = [100_003, 1_000_003] if args.quick else [100_003, 1_000_003, 10_000_019, 50_000_000]
    if args.device == "cpu":
        blockstats.BLOCK, blockstats.PROGRAMS = 8192, 8  # the interpreter is slow per chunk
        blockhist.BLOCK, blockhist.PROGRAMS = 8192, 8
        sizes = [100_003]
    good = check(args.device, sizes)
    good &= check_histograms(args.device, sizes)
    if args.device == "cuda":
        timing(args.repeats)
        histogram_timing(args.repeats)
        if args.sweep:
            sweep(args.repeats)
            histogram_sweep(args.repeats)
    print("all checks passed" if good else "MISMATCHES: see the FAIL lines")
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
