"""Value histograms of summarised tensors (``record --histograms N``), recorder side.

What a histogram is: the counts of a floating tensor's *finite* values in ``N`` equal
bins from its finite min to its finite max (the summary's ``min`` and ``max``), the
last bin closed, exactly as ``numpy.histogram(finite_values_as_float64, N)`` counts
them. NaN and inf are not in it: the summary counts them apart. A tensor whose finite
values are all equal has them all in the middle bin (``N // 2``, where numpy puts
them); one with no finite values, an integer tensor, or a row without statistics has
all-zero counts. So a row's counts add up to ``numel - nan - posinf - neginf`` for every
floating tensor that was summarised.

How they are computed, off when ``N`` is 0 (then nothing here runs):

* CPU tensors: one pass of ``_cstats.histogram`` (C) after the summary, float64 edges
  as numpy makes them. ``torch.histc`` was measured first: 36-68 us on 1,000 floats
  (the C pass: 4 us), and 12-16% of float32 histograms one count off numpy's, because
  it bins in float32 without checking the bin's edges.
* Device tensors (and CPU tensors forced down that path with ``defer_cpu``): at the
  step's arena flush (hookdbg/recorder/summaries/deferred.py), ``segment_histograms`` bins every
  tensor in the arena at once with a fixed number of launches and no host sync
  (per-segment finite min/max spread with ``repeat_interleave(output_size=...)``, the
  same estimate-then-check-the-edges binning as the C pass, ``index_add_`` into one
  ``zeros(k * N)``); the counts travel to the host with the step's statistics. There,
  a tensor holding NaN/inf gets the min and max of its finite values in its summary
  (as on the CPU path), so that its histogram's edges can be known.
* Device tensors summarised on their own (more than ``blockstats.LARGE`` elements):
  binned at hook time into the same columns, in two Triton kernel launches where
  blockhist.py's kernels apply (the same bins, by the same float64 arithmetic), else by
  ``tensor_histogram``: ``segment_histograms`` over float64 chunks of the tensor.

A histogram rides in its summary tuple as one more element (bytes of ``N`` int64
counts, or None), after the columns of the tensors table (stats.py); the writer's
converter (``writer_layout``) moves it into the ``tensors/histogram`` column
(hookdbg/store/schema.py).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch

from hookdbg.recorder.summaries import blockhist, stats
from hookdbg.store import rows as store_rows
from hookdbg.store import schema

try:
    from hookdbg.recorder._cstats import histogram as _c_histogram
except ImportError:  # not built, or built before histograms: torch's ops instead
    _c_histogram = None

HISTOGRAM = len(stats.FIELDS)  # where a summary tuple holds its histogram
_KINDS = {d: kind for d, (kind, _) in stats.C_KINDS.items() if d.is_floating_point}  # binned
_INF = float("inf")


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def summarising(bins: int) -> Callable[[torch.Tensor], tuple]:
    """``stats.summarise`` with the tensor's histogram added to the summary."""
    return partial(_summarise, bins)


def _summarise(bins: int, t: torch.Tensor) -> tuple:
    t = stats.local(t)  # a DTensor's shard
    summary = stats.summarise(t)
    return (*summary, host_histogram(t, summary, bins))


def host_histogram(t: torch.Tensor, summary: tuple, bins: int) -> bytes | None:
    """The counts of ``t``'s finite values (bytes of ``bins`` int64), computed now;
    None where there are none to count (see the module docstring)."""
    if t.dtype not in _KINDS or summary[stats.NAN] < 0:
        return None
    finite = summary[stats.NUMEL] - summary[stats.NAN] - summary[stats.POSINF]
    finite -= summary[stats.NEGINF]
    if finite <= 0:
        return None
    lo, hi = summary[stats.MIN], summary[stats.MAX]
    if lo == hi:
        return one_bin(finite, bins)
    v = stats.local(t).detach()
    if _c_histogram is not None and v.is_cpu and type(v) in _PLAIN:  # C reads data_ptr
        v = v if v.is_contiguous() else v.contiguous()
        return _c_histogram(v.data_ptr(), v.numel(), _KINDS[v.dtype], lo, hi, bins)
    values = v.reshape(-1).double()  # no extension, or a device tensor read at once
    lengths = torch.full((1,), values.numel(), device=values.device)
    lo_end = torch.full((1,), lo, dtype=torch.float64, device=values.device)
    hi_end = torch.full((1,), hi, dtype=torch.float64, device=values.device)
    counts = segment_histograms(values, lengths, lo_end, hi_end, bins)
    return counts.cpu().numpy().astype(np.int64).tobytes()


def one_bin(count: int, bins: int) -> bytes:
    """All of a constant tensor's ``count`` values in the middle bin."""
    counts = np.zeros(bins, dtype=np.int64)
    counts[bins // 2] = count
    return counts.tobytes()


# -- on the device, at the arena flush ---------------------------------------------


def finite_bounds(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each segment's min and max over its finite values ([k, 2]; +inf and -inf for a
    segment with none), without reading anything back."""
    finite = values.isfinite()

    def reduce(fill: float, how: str) -> torch.Tensor:
        kept = torch.where(finite, values, fill)
        return torch.segment_reduce(kept, how, lengths=lengths, unsafe=True)

    return torch.stack([reduce(_INF, "min"), reduce(-_INF, "max")], dim=1)


def segment_histograms(
    values: torch.Tensor, lengths: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, bins: int
) -> torch.Tensor:
    """Histograms ([k, bins], float64 counts) of the finite values of consecutive
    segments of float64 ``values`` with these ``lengths``, each from its ``lo`` to its
    ``hi``: a fixed number of launches, nothing read back (no ``bincount``, whose
    output size would need one)."""
    total = values.numel()
    k = lengths.numel()

    def spread(x: torch.Tensor) -> torch.Tensor:
        return x.repeat_interleave(lengths, output_size=total)

    lo_e, hi_e = spread(lo), spread(hi)
    width = hi_e - lo_e
    # a tensor divisor: torch divides a CUDA tensor by a Python number as a
    # multiplication by its reciprocal, one rounding off numpy's edges
    step = width / torch.full((), float(bins), dtype=width.dtype, device=width.device)
    weight = values.isfinite() & (values >= lo_e) & (values <= hi_e)
    estimate = ((values - lo_e) / width * bins).nan_to_num_(0.0, 0.0, 0.0)
    index = estimate.clamp_(0, bins - 1).to(torch.int64)
    # numpy's edges, i * step + lo (two roundings), and hi last: move each value
    # across the edge its estimate got wrong
    index -= (values < index * step + lo_e).to(torch.int64)
    right = torch.where(index + 1 >= bins, hi_e, (index + 1) * step + lo_e)
    index += ((values >= right) & (index < bins - 1)).to(torch.int64)
    index.clamp_(min=0)  # -inf (not counted) fell below the first edge: keep it in its segment
    index = torch.where(width == 0, bins // 2, index)  # a constant tensor: the middle bin
    index += (
        torch.arange(k, device=values.device)
        .mul_(bins)
        .repeat_interleave(lengths, output_size=total)
    )
    counts = torch.zeros(k * bins, dtype=torch.float64, device=values.device)
    counts.index_add_(0, index, weight.to(torch.float64))
    return counts.view(k, bins)


def arena_histograms(values: torch.Tensor, lengths: list[int], bins: int) -> torch.Tensor:
    """Raw histogram columns for ``deferred.arena_stats``'s rows: [k, 2 + bins], the
    finite min and max, then the counts."""
    n = torch.tensor(lengths, dtype=torch.int64).to(values.device, non_blocking=True)
    bounds = finite_bounds(values, n)
    counts = segment_histograms(values, n, bounds[:, 0], bounds[:, 1], bins)
    return torch.cat([bounds, counts], dim=1)


def large_histogram(t: torch.Tensor, bins: int, chunk: int) -> torch.Tensor:
    """``tensor_histogram``'s columns for a tensor summarised on its own, queued in two
    Triton kernel launches where blockhist.py's kernels apply."""
    row = blockhist.histogram(t, bins)
    return tensor_histogram(t, bins, chunk) if row is None else row


def no_histogram(bins: int, device: torch.device) -> torch.Tensor:
    """The same columns for a tensor that has no histogram (an integer one): no
    finite range (``with_histogram`` gives None), no counts."""
    row = torch.zeros(1, 2 + bins, dtype=torch.float64, device=device)
    row[0, 0], row[0, 1] = _INF, -_INF
    return row


def tensor_histogram(t: torch.Tensor, bins: int, chunk: int) -> torch.Tensor:
    """The same columns ([1, 2 + bins]) for a tensor too large for the arena: binned
    ``chunk`` elements at a time in float64, so no float64 copy of all of it exists."""
    v = t.detach().reshape(-1)
    finite = v.isfinite()
    lo = torch.where(finite, v, _INF).min().double()
    hi = torch.where(finite, v, -_INF).max().double()
    counts = torch.zeros(1, bins, dtype=torch.float64, device=v.device)
    for start in range(0, v.numel(), chunk):
        part = v[start : start + chunk].double()
        n = torch.full((1,), part.numel(), device=v.device)  # a fill: no host copy
        counts += segment_histograms(part, n, lo[None], hi[None], bins)
    return torch.cat([lo[None, None], hi[None, None], counts], dim=1)


def with_histogram(summary: tuple, raw: np.ndarray) -> tuple:
    """A deferred summary with its histogram columns (``arena_histograms``) attached;
    a tensor holding NaN/inf gets its finite min and max, which place its bins."""
    lo, hi = float(raw[0]), float(raw[1])
    if lo > hi:  # no finite values
        return (*summary, None)
    if not stats.is_finite(summary):
        summary = (*summary[: stats.MIN], lo, hi, *summary[stats.MAX + 1 :])
    return (*summary, raw[2:].astype(np.int64).tobytes())


# -- on the writer thread ------------------------------------------------------------


def writer_layout(bins: int) -> dict[str, Any]:
    """The writer's ``converters`` and ``tables``: with ``bins``, tensor rows carry
    their histograms into the ``histogram`` column of ``schema.tensors_dtype(bins)``."""
    if not bins:
        return {"converters": store_rows.CONVERTERS, "tables": schema.TABLES}
    return {
        "converters": {**store_rows.CONVERTERS, "tensors": partial(tensor_rows, bins)},
        "tables": schema.tables(bins),
    }


def tensor_rows(bins: int, rows: list) -> np.ndarray:
    """``store.rows.tensor_rows`` plus the histogram column (zeros where none)."""
    counts = np.zeros((len(rows), bins), dtype=np.int64)
    plain = []
    for i, row in enumerate(rows):
        summary = row[-1]
        if summary is not None and len(summary) > HISTOGRAM:
            if summary[HISTOGRAM] is not None:
                counts[i] = np.frombuffer(summary[HISTOGRAM], dtype=np.int64)
            row = (*row[:-1], summary[:HISTOGRAM])
        plain.append(row)
    table = store_rows.tensor_rows(plain)
    out = np.empty(len(table), dtype=schema.tensors_dtype(bins))
    for name in schema.TENSORS.names or ():
        out[name] = table[name]
    out[schema.HISTOGRAM] = counts
    return out
