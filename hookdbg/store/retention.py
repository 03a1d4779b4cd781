"""What a recording keeps under ``--keep-last N``: the full detail of its last N recorded
segments (training steps and eval batches), and the whole run's step rows, losses,
alerts, flight-recorder dumps and everything else.

Under SWMR HDF5 never frees file space, so dropping rows means writing the file anew:
the writer (hookdbg/store/writer.py) does so each time the file holds 2N recorded
segments, copying what is kept into a new file that then replaces the old one, so a
file holds at most 2N segments' detail and each row is copied about once. This module
says which rows are kept; the writer owns the files.
"""

from __future__ import annotations

from collections.abc import Iterator

import h5py
import numpy as np

from hookdbg.store import schema

# the tables whose rows belong to one module call or tensor of one segment
DETAIL = frozenset({"calls", "tensors", "captures"})
# the info row that says from which segment on the detail is kept
KEPT = "kept_from"


def rows(
    columns: list[tuple[str, h5py.Dataset]], sealed: int, tail: np.ndarray, block: int
) -> Iterator[np.ndarray]:
    """A table's rows, its columns' first ``sealed`` and then its unsealed ``tail``, in
    blocks of at most ``block`` rows: never the whole table in memory."""
    for start in range(0, sealed, block):
        stop = min(start + block, sealed)
        out = np.empty(stop - start, dtype=tail.dtype)
        for field, ds in columns:
            out[field] = ds[start:stop]
        yield out
    if len(tail):
        yield tail


def kept(table: str, block: np.ndarray, first: int) -> np.ndarray:
    """The rows of ``block`` a file keeping the detail from segment ``first`` on holds."""
    if table in DETAIL:
        keep = block["segment"] >= first
        if table == "captures":  # the flight recorder's dumps, whenever they were
            keep |= block["reason"] == schema.CaptureReason.FLIGHT
        return block[keep]
    if table == "info":  # the new file says anew where its detail starts
        return block[block["key"] != KEPT.encode()]
    return block


def first_kept(recorded: list[int], keep_last: int) -> int | None:
    """The segment the detail is kept from, once the file holds ``2 * keep_last``
    recorded segments (their ids in ``recorded``, in order); None before, and when
    every segment is kept (``keep_last`` 0)."""
    if not keep_last or len(recorded) < 2 * keep_last:
        return None
    return recorded[-keep_last]
