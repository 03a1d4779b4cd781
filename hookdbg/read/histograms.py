"""The optional ``tensors/histogram`` column (``record --histograms N``), checked
before it is trusted like every other column (hookdbg/read/checks.py).

The column is 2-D, one row of N int64 counts per tensors row (hookdbg/store/schema.py
says what they count); a recording made without histograms has none, and reads as
before. It is read through the tensors table by name:
``rec.tensors(columns=[..., "histogram"])`` gives a ``histogram`` field of N counts
per row; ``bin_edges`` gives a row's edges.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np

from hookdbg.read.checks import RecordingError, checked_dataset, member
from hookdbg.store import schema


def checked_histograms(f: h5py.File, path: Path) -> h5py.Dataset | None:
    """The histogram column of a recording made with histograms, None without; a
    column that is not what the recorder writes is refused in one line."""
    tensors = member(f, "tensors", "table 'tensors'", path)
    if not isinstance(tensors, h5py.Group):
        return None  # reported by the tables' own checks
    where = f"tensors/{schema.HISTOGRAM}"
    if member(tensors, schema.HISTOGRAM, where, path) is None:
        return None
    size = os.path.getsize(path)
    ds = checked_dataset(tensors, schema.HISTOGRAM, where, np.dtype("<i8"), path, size, dims=2)
    if not 1 <= ds.shape[1] <= schema.MAX_HISTOGRAM_BINS:
        raise RecordingError(
            f"{path} is damaged: {where} has shape {ds.shape}, expected (rows, bins) with 1 to "
            f"{schema.MAX_HISTOGRAM_BINS} bins"
        )
    return ds


def histogram_dtype(column: h5py.Dataset) -> np.dtype:
    """How a row of the column reads: N int64 counts."""
    return np.dtype(("<i8", (int(column.shape[1]),)))


def bin_edges(low: float, high: float, bins: int) -> np.ndarray:
    """The N + 1 edges of a row's histogram from its ``min`` and ``max``, as
    numpy.histogram makes them (a constant tensor's span is widened by 0.5 each way,
    which puts its values in the middle bin)."""
    if low == high:
        low, high = low - 0.5, high + 0.5
    return np.linspace(low, high, bins + 1)
