"""Histograms of large device tensors in two kernel launches each, without waiting.

Why: with ``--histograms N`` a device tensor of more than ``blockstats.LARGE``
elements was binned by ``histograms.tensor_histogram``: about 30 float64 elementwise
torch ops over the whole tensor, ``deferred.ARENA`` elements at a time. On an H100 a
recorded step of resnet18 at 224x224 (batch 64) with ``--histograms 32`` cost 98 times
the unrecorded step (statistics alone: 3.5 times).

How: two Triton kernels (histkernel.py), launched at hook time one after the other on
the tensor's stream, so that later in-place changes to the tensor cannot reach them and
nothing is read back:

1. ``finite_range`` reads the tensor once, in its own dtype: each of at most
   ``PROGRAMS`` programs writes the min and max of the finite values of its range.
   Program 0 also zeroes the counts.
2. ``bin_values`` reads it a second time: each program reduces those partial ranges
   (a few KB, from the cache) to the finite ``lo`` and ``hi``, bins its range into a
   local histogram (``tl.histogram``) and adds it atomically into the tensor's counts.

So a large tensor costs two launches and one allocation (no fill) for its histogram,
three launches with its statistics (blockstats.py). The result is the row
``tensor_histogram`` makes, ``[1, 2 + N]`` float64 (finite lo, hi, then the counts),
and the bins are the same: the kernel repeats ``histograms.segment_histograms``'s
float64 arithmetic operation for operation (numpy's edges ``i * step + lo``, each
multiply and add rounded on its own, ``hi`` the last edge, the estimate corrected
across the edge it got wrong), a tensor whose finite values are all equal has them in
the middle bin, and one with no finite value gets lo = +inf > hi = -inf and no counts
(``histograms.with_histogram`` then stores none).

Where the kernels do not apply, ``histograms.tensor_histogram`` still bins: the same
tensors as blockstats.py's (no Triton, a device not in ``KERNEL_DEVICES``, another
dtype, a tensor subclass, elements not in one dense block), and any tensor after a
launch has failed on this machine (then the kernels are off for the rest of the process,
with a RuntimeWarning). The tests set ``KERNEL_DEVICES`` to ``{"cpu"}`` under
``TRITON_INTERPRET=1`` to check the kernels' arithmetic without a GPU.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import TYPE_CHECKING

import torch

from hookdbg.recorder.summaries import blockstats

if TYPE_CHECKING:
    from triton.runtime.jit import KernelInterface

BLOCK = 1024  # elements per chunk, in both kernels
WARPS = 8  # per program: 4 elements of a chunk per thread
PROGRAMS = 1024  # at most, per tensor (``bin_values`` reads this many partial ranges)
KERNEL_DEVICES = frozenset({"cuda"})  # device types whose tensors the kernels bin


@functools.cache
def _kernels() -> tuple[KernelInterface, KernelInterface] | None:
    """The two Triton kernels, imported on first use; None where Triton is missing."""
    try:
        from hookdbg.recorder.summaries.histkernel import bin_values, finite_range
    except ImportError:
        return None
    return finite_range, bin_values


def _turn_off(error: Exception) -> None:
    global KERNEL_DEVICES
    KERNEL_DEVICES = frozenset()
    warnings.warn(
        f"hookdbg: the Triton histogram kernels failed ({error!r}); large tensors are "
        "binned with torch's kernels from now on",
        RuntimeWarning,
        stacklevel=2,
    )


def flat_input(t: torch.Tensor) -> torch.Tensor | None:
    """The 1-D view of ``t`` the kernels read, or None where they do not apply (see the
    module docstring): only floating tensors have histograms."""
    if t.device.type not in KERNEL_DEVICES or _kernels() is None or not t.is_floating_point():
        return None
    return blockstats.dense_view(t)


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def histogram(t: torch.Tensor, bins: int) -> torch.Tensor | None:
    """``histograms.tensor_histogram(t, bins, ...)``'s row ([1, 2 + bins] float64: the
    finite min and max, then the counts), queued on ``t``'s device in two launches and
    not read back; None where the kernels do not apply or could not run here."""
    flat = flat_input(t)
    kernels = _kernels()
    if flat is None or kernels is None:
        return None
    finite_range, bin_values = kernels
    numel = flat.numel()
    programs, per_program = blockstats.split_into(numel, BLOCK, PROGRAMS)
    # one allocation: the row, then each program's finite min and max
    buffer = torch.empty(2 + bins + 2 * programs, dtype=torch.float64, device=flat.device)
    row, ranges = buffer[: 2 + bins], buffer[2 + bins :]
    # Triton launches on the current device
    on_device = torch.cuda.device(flat.device) if flat.is_cuda else contextlib.nullcontext()
    try:
        with on_device:
            finite_range[(programs,)](
                flat, ranges, row[2:], numel, per_program, bins, BLOCK=BLOCK, num_warps=WARPS
            )
            bin_values[(programs,)](
                flat,
                ranges,
                row,
                numel,
                per_program,
                programs,
                BLOCK=BLOCK,
                RANGES=_pow2(PROGRAMS),
                BINS=bins,
                BINS_POW2=_pow2(bins),
                num_warps=WARPS,
                enable_fp_fusion=False,  # i * step + lo in two roundings, as numpy
            )
    except Exception as error:  # a compiler or driver that does not fit this machine
        _turn_off(error)
        return None
    return row.view(1, -1)
