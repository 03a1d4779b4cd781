"""The Triton kernels of hookdbg/recorder/summaries/blockstats.py, in a module of their own so that
triton is imported only when device statistics are first taken (importing it takes
0.1-0.3 s, and CPU-only recordings never need it).

``TRITON_INTERPRET=1``, set before triton is first imported, makes ``triton.jit`` run
the kernels in Triton's interpreter on CPU tensors: the tests check their arithmetic
that way on machines without a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hookdbg.recorder.summaries.rawrow import PARTIAL

# the dtypes of hookdbg/recorder/summaries/blockstats.py's DTYPES, as table_stats reads them
TRITON_DTYPES = {
    torch.float16: tl.float16,
    torch.bfloat16: tl.bfloat16,
    torch.float32: tl.float32,
    torch.float64: tl.float64,
    torch.int64: tl.int64,
    torch.int32: tl.int32,
    torch.int16: tl.int16,
    torch.int8: tl.int8,
    torch.uint8: tl.uint8,
    torch.bool: tl.uint8,  # a bool's byte, 0 or 1
}

# where ``summarise_range`` stores each column of its partial row (rawrow.PARTIAL)
_MIN, _MAX, _SUM, _M2 = (tl.constexpr(PARTIAL.index(n)) for n in ("min", "max", "sum", "m2"))
_NAN, _POSINF, _NEGINF = (tl.constexpr(PARTIAL.index(n)) for n in ("nan", "posinf", "neginf"))
_ZEROS, _COUNT, _SHIFTED = (tl.constexpr(PARTIAL.index(n)) for n in ("zeros", "count", "shifted"))
_AT_MIN, _AT_MAX = (tl.constexpr(PARTIAL.index(n)) for n in ("at_min", "at_max"))
_ABSSUM, _NEGATIVES = (tl.constexpr(PARTIAL.index(n)) for n in ("abssum", "negatives"))


@triton.jit(do_not_specialize=["first_row"])
def block_stats(x, rows, first_row, numel, per_program, BLOCK: tl.constexpr, COLUMNS: tl.constexpr):
    """Program ``p`` summarises ``x[p * per_program : (p + 1) * per_program]`` (a flat
    view in the tensor's own dtype) into row ``first_row + p`` of ``rows`` (see
    ``summarise_range``)."""
    program = tl.program_id(0).to(tl.int64)
    start = program * per_program
    end = tl.minimum(start + per_program, numel)
    summarise_range(x, start, end, rows + (first_row + program) * COLUMNS, BLOCK)


@triton.jit
def table_stats(table, rows, DTYPE: tl.constexpr, BLOCK: tl.constexpr, COLUMNS: tl.constexpr):
    """Program ``p`` summarises the range that entry ``p`` of ``table`` names into row
    ``p`` of ``rows``: many tensors of one dtype in one launch. An entry is three int64:
    the address of a tensor's first element in memory, and the first and the end
    offset of the range, in elements (whole ``BLOCK``-sized chunks from its start)."""
    program = tl.program_id(0).to(tl.int64)
    entry = table + program * 3
    x = tl.load(entry).to(tl.pointer_type(DTYPE))
    start = tl.load(entry + 1)
    end = tl.load(entry + 2)
    summarise_range(x, start, end, rows + program * COLUMNS, BLOCK)


@triton.jit
def summarise_range(x, start, end, row, BLOCK: tl.constexpr):
    """Summarise ``x[start:end]`` into ``row`` (float64: min, max, sum, M2, NaN, +inf,
    -inf, zeros, sum of |x|, values below 0, the values equal to the min and to the max,
    element count, and the sum of x - shift: rawrow.PARTIAL).

    Per BLOCK-sized chunk the mean and the sum of squared deviations are exact two-pass
    values in float64; Chan's formula merges them into the range's running totals, so
    a large mean never cancels the spread. Its means are of x - shift, where the shift
    is the tensor's first value in every range: the differences of means it takes
    are then between numbers as small as the spread, not as large as the mean (a mean
    of 1e7 is rounded by 1e-9, which puts such a difference for 1e7 plus unit noise
    off by 1e-10 of the std). The sum of x is kept apart: rebuilt from x - shift it
    would cancel where the shift is far from the mean (an outlier first). It, min, max
    and the counts are kept per lane and reduced once at the end. Lanes past the end
    are masked out of every statistic. Each lane counts the values equal to its min
    (and max) so far, from 1 again where a smaller (larger) one comes.
    """
    shift = tl.load(x).to(tl.float64)
    lanes = tl.arange(0, BLOCK)
    lo = tl.full([BLOCK], float("inf"), tl.float64)
    hi = tl.full([BLOCK], float("-inf"), tl.float64)
    nan = tl.zeros([BLOCK], tl.int32)
    posinf = tl.zeros([BLOCK], tl.int32)
    neginf = tl.zeros([BLOCK], tl.int32)
    zeros = tl.zeros([BLOCK], tl.int32)
    negatives = tl.zeros([BLOCK], tl.int32)
    at_lo = tl.zeros([BLOCK], tl.int32)
    at_hi = tl.zeros([BLOCK], tl.int32)
    count = tl.zeros([], tl.float64)
    total = tl.zeros([BLOCK], tl.float64)  # of x
    absolute = tl.zeros([BLOCK], tl.float64)  # of |x|
    shifted = tl.zeros([], tl.float64)  # of x - shift
    m2 = tl.zeros([], tl.float64)
    for offset in range(start, end, BLOCK):
        index = offset + lanes
        inside = index < end
        v = tl.load(x + index, mask=inside, other=0.0).to(tl.float64)
        n = tl.minimum(end - offset, BLOCK).to(tl.float64)
        y = tl.where(inside, v - shift, 0.0)
        chunk_sum = tl.sum(y, axis=0)
        deviation = tl.where(inside, y - chunk_sum / n, 0.0)
        chunk_m2 = tl.sum(deviation * deviation, axis=0)
        # Chan: M2 of the union = M2_a + M2_b + delta^2 * n_a * n_b / (n_a + n_b)
        delta = chunk_sum / n - shifted / tl.maximum(count, 1.0)
        m2 += chunk_m2 + delta * delta * (count * n / (count + n))
        shifted += chunk_sum
        total += v  # masked lanes hold 0
        absolute += tl.abs(v)
        count += n
        is_nan = v != v
        number = inside & ~is_nan
        low = tl.where(number, v, float("inf"))
        high = tl.where(number, v, float("-inf"))
        at_lo = tl.where(low < lo, 0, at_lo)
        at_hi = tl.where(high > hi, 0, at_hi)
        lo = tl.minimum(lo, low)
        hi = tl.maximum(hi, high)
        at_lo += (number & (low == lo)).to(tl.int32)
        at_hi += (number & (high == hi)).to(tl.int32)
        nan += is_nan.to(tl.int32)
        posinf += (v == float("inf")).to(tl.int32)
        neginf += (v == float("-inf")).to(tl.int32)
        zeros += (inside & (v == 0.0)).to(tl.int32)
        negatives += (inside & (v < 0.0)).to(tl.int32)
    smallest = tl.min(lo, axis=0)
    largest = tl.max(hi, axis=0)
    tl.store(row + _MIN, smallest)
    tl.store(row + _MAX, largest)
    tl.store(row + _AT_MIN, tl.sum(tl.where(lo == smallest, at_lo, 0), axis=0).to(tl.float64))
    tl.store(row + _AT_MAX, tl.sum(tl.where(hi == largest, at_hi, 0), axis=0).to(tl.float64))
    tl.store(row + _SUM, tl.sum(total, axis=0))
    tl.store(row + _ABSSUM, tl.sum(absolute, axis=0))
    tl.store(row + _M2, m2)
    tl.store(row + _NAN, tl.sum(nan, axis=0).to(tl.float64))
    tl.store(row + _POSINF, tl.sum(posinf, axis=0).to(tl.float64))
    tl.store(row + _NEGINF, tl.sum(neginf, axis=0).to(tl.float64))
    tl.store(row + _ZEROS, tl.sum(zeros, axis=0).to(tl.float64))
    tl.store(row + _NEGATIVES, tl.sum(negatives, axis=0).to(tl.float64))
    tl.store(row + _COUNT, count)
    tl.store(row + _SHIFTED, shifted)
