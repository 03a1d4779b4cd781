"""The two Triton kernels of hookdbg/recorder/summaries/blockhist.py, in a module of its own for
the reason blockkernel.py is one: triton is imported only when the first large device
tensor is binned.

Both read a flat view of the tensor in its own dtype, program ``p`` the elements
``[p * per_program, (p + 1) * per_program)`` in ``BLOCK``-sized chunks, as
``block_stats`` does. Launched one after the other on the same stream, they need no
synchronisation between them: ``bin_values`` starts once ``finite_range`` has finished.

The binning arithmetic is ``histograms.segment_histograms``'s, operation for operation
in float64, so that every value lands in the bin numpy puts it in. That needs each
multiply and add rounded on its own: the launch passes ``enable_fp_fusion=False``, or
the compiler would fuse ``i * step + lo`` into one fused multiply-add (one rounding).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def finite_range(x, ranges, counts, numel, per_program, bins, BLOCK: tl.constexpr):
    """Program ``p`` writes the min and max of the finite values of its part of ``x``
    to ``ranges[2p]`` and ``ranges[2p + 1]`` (float64; +inf and -inf where there are
    none). Program 0 also zeroes the ``bins`` float64 ``counts`` that ``bin_values``
    adds into, which saves a launch."""
    program = tl.program_id(0).to(tl.int64)
    start = program * per_program
    end = tl.minimum(start + per_program, numel)
    lanes = tl.arange(0, BLOCK)
    lo = tl.full([BLOCK], float("inf"), tl.float64)
    hi = tl.full([BLOCK], float("-inf"), tl.float64)
    for offset in range(start, end, BLOCK):
        index = offset + lanes
        inside = index < end
        v = tl.load(x + index, mask=inside, other=0.0).to(tl.float64)
        finite = inside & (tl.abs(v) < float("inf"))  # false for NaN too
        lo = tl.minimum(lo, tl.where(finite, v, float("inf")))
        hi = tl.maximum(hi, tl.where(finite, v, float("-inf")))
    tl.store(ranges + 2 * program, tl.min(lo, axis=0))
    tl.store(ranges + 2 * program + 1, tl.max(hi, axis=0))
    for first in range(0, bins, BLOCK):
        tl.store(counts + first + lanes, 0.0, mask=(first + lanes < bins) & (program == 0))


@triton.jit
def bin_values(
    x,
    ranges,
    row,
    numel,
    per_program,
    programs,
    BLOCK: tl.constexpr,
    RANGES: tl.constexpr,
    BINS: tl.constexpr,
    BINS_POW2: tl.constexpr,
):
    """Every program reduces the ``programs`` partial ranges of ``finite_range`` (at
    most ``RANGES``) to the tensor's finite ``lo`` and ``hi``, program 0 writes them to
    ``row[0]`` and ``row[1]``; each then bins its part of ``x`` into a local histogram
    and adds it atomically into ``row[2 : 2 + BINS]`` (float64 counts: exact, in any
    order, up to 2**53).

    The bin of a value, as ``segment_histograms`` finds it: the estimate
    ``(v - lo) / width * BINS`` (NaN and inf taken as 0, clamped to the bins,
    truncated), then one bin down if ``v`` is below the estimate's left edge, one up if
    it is at or past its right edge, edges being ``i * step + lo`` (two roundings) and
    ``hi`` last; all values in the middle bin where ``lo == hi``. Counted: the finite
    values from ``lo`` to ``hi``, that is all finite values.
    """
    program = tl.program_id(0).to(tl.int64)
    p = tl.arange(0, RANGES)
    mine = p < programs
    lo = tl.min(tl.load(ranges + 2 * p, mask=mine, other=float("inf")), axis=0)
    hi = tl.max(tl.load(ranges + 2 * p + 1, mask=mine, other=float("-inf")), axis=0)
    tl.store(row, lo, mask=program == 0)
    tl.store(row + 1, hi, mask=program == 0)
    width = hi - lo
    step = width / BINS
    start = program * per_program
    end = tl.minimum(start + per_program, numel)
    lanes = tl.arange(0, BLOCK)
    counts = tl.zeros([BINS_POW2], tl.int32)
    for offset in range(start, end, BLOCK):
        index = offset + lanes
        inside = index < end
        v = tl.load(x + index, mask=inside, other=0.0).to(tl.float64)
        counted = inside & (tl.abs(v) < float("inf")) & (v >= lo) & (v <= hi)
        estimate = (v - lo) / width * BINS
        estimate = tl.where(tl.abs(estimate) < float("inf"), estimate, 0.0)
        estimate = tl.minimum(tl.maximum(estimate, 0.0), BINS - 1)
        i = estimate.to(tl.int32)
        i -= (v < i.to(tl.float64) * step + lo).to(tl.int32)
        right = tl.where(i + 1 >= BINS, hi, (i + 1).to(tl.float64) * step + lo)
        i += ((v >= right) & (i < BINS - 1)).to(tl.int32)
        i = tl.where(width == 0.0, BINS // 2, i)
        counts += tl.histogram(i, BINS_POW2, mask=counted)
    bins = tl.arange(0, BINS_POW2)
    tl.atomic_add(
        row + 2 + bins, counts.to(tl.float64), mask=(bins < BINS) & (counts > 0), sem="relaxed"
    )
