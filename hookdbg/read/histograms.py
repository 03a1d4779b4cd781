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

from hookdbg.read.checks import H5_ERRORS, RecordingError, damaged, member
from hookdbg.store import schema

_BEST_RATIO = 1032  # deflate's best (checks.py): a column cannot hold more than this
_SLACK = 1 << 20


def checked_histograms(f: h5py.File, path: Path) -> h5py.Dataset | None:
    """The histogram column of a recording made with histograms, None without; a
    column that is not what the recorder writes is refused in one line."""
    tensors = member(f, "tensors", "table 'tensors'", path)
    if not isinstance(tensors, h5py.Group):
        return None  # reported by the tables' own checks
    where = f"tensors/{schema.HISTOGRAM}"
    ds = member(tensors, schema.HISTOGRAM, where, path)
    if ds is None:
        return None
    if not isinstance(ds, h5py.Dataset):
        raise RecordingError(f"{path} is damaged: {where} is a group, not a column")
    try:
        shape, dtype = ds.id.shape, ds.id.dtype
        plist = ds.id.get_create_plist()
        elsewhere = plist.get_layout() == h5py.h5d.VIRTUAL or plist.get_external_count()
        stored = min(ds.id.get_storage_size(), os.path.getsize(path))
    except H5_ERRORS as exc:
        raise damaged(path, exc) from None
    if elsewhere:
        raise RecordingError(
            f"{path} is damaged: {where} keeps its data in other files, which a recording "
            "never does; refusing to read it"
        )
    if shape is None or len(shape) != 2 or not 1 <= shape[1] <= schema.MAX_HISTOGRAM_BINS:
        raise RecordingError(
            f"{path} is damaged: {where} has shape {shape}, expected (rows, bins) with 1 to "
            f"{schema.MAX_HISTOGRAM_BINS} bins"
        )
    if dtype.kind not in "iu" or dtype.itemsize != 8 or dtype.names or dtype.subdtype:
        raise RecordingError(f"{path} is damaged: {where} has type {dtype}, expected int64")
    declared = shape[0] * shape[1] * 8
    if declared > stored * _BEST_RATIO + _SLACK:
        raise RecordingError(
            f"{path} is damaged: {where} claims {shape[0]:,} rows, more than its bytes on "
            "disk can hold; refusing to read it"
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
