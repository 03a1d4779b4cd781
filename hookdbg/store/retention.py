"""What a recording keeps under ``--keep-last N``: the full detail of its last N recorded
training steps (and of the eval batches among and after them), and the whole run's step
rows, losses, alerts, flight-recorder dumps and everything else.

Under SWMR HDF5 never frees file space, so dropping rows means writing the file anew:
the writer (hookdbg/store/writer.py) copies what is kept into a new file that then
replaces the old one. It does so when the detail it would drop is at least as large as
what it must copy (``Ledger``), so each row is copied about once on average however
long the run, and the file stays within about twice what it keeps. This module says
which rows are kept and when; the writer owns the files.
"""

from __future__ import annotations

from collections.abc import Iterator

import h5py
import numpy as np

from hookdbg.store import schema

# the tables whose rows belong to one module call or tensor of one segment
DETAIL = frozenset({"calls", "device_times", "tensors", "captures"})
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


def keeps_capture(segment: int, reason: int, first: int) -> bool:
    """Whether a file keeping the detail from segment ``first`` on holds a capture of
    ``segment`` (``kept``'s rule for one row)."""
    return segment >= first or reason == schema.CaptureReason.FLIGHT


class Ledger:
    """What the file holds, as ``--keep-last`` weighs it: its recorded segments
    (segment, step, whether a training step), the bytes of each segment's detail rows,
    and the bytes of everything else (rows as the writer holds them, captured bytes)."""

    def __init__(self, keep_last: int) -> None:
        self.keep_last = keep_last
        self.recorded: list[tuple[int, int, bool]] = []
        self.detail: dict[int, int] = {}
        self.other = 0

    def add(self, table: str, rows: np.ndarray) -> None:
        """Rows the writer appended to ``table``."""
        size = rows.dtype.itemsize
        if table == "steps":
            chosen = rows[rows["recorded"] == 1]
            self.recorded += zip(
                chosen["segment"].tolist(),
                chosen["step"].tolist(),
                (chosen["kind"] == schema.StepKind.TRAIN).tolist(),
                strict=True,
            )
        if table not in DETAIL:
            self.other += size * len(rows)
            return
        bytes_per_row = np.full(len(rows), size, dtype=np.int64)
        if table == "captures":
            bytes_per_row += rows["nbytes"]
            flight = rows["reason"] == schema.CaptureReason.FLIGHT
            self.other += int(bytes_per_row[flight].sum())
            rows, bytes_per_row = rows[~flight], bytes_per_row[~flight]
        segments, where = np.unique(rows["segment"], return_inverse=True)
        for segment, total in zip(
            segments.tolist(), np.bincount(where, bytes_per_row).tolist(), strict=True
        ):
            self.detail[segment] = self.detail.get(segment, 0) + int(total)

    def first_kept(self) -> int | None:
        """The segment to keep the detail from, when writing the file anew is due: the
        first segment of the Nth last recorded training step, once the detail before
        it outweighs what a new file would copy; None before."""
        training = [step for _, step, train in self.recorded if train]
        if len(training) <= self.keep_last:
            return None
        from_step = training[-self.keep_last]
        first = min(segment for segment, step, _ in self.recorded if step >= from_step)
        dropped = sum(n for segment, n in self.detail.items() if segment < first)
        copied = self.other + sum(n for segment, n in self.detail.items() if segment >= first)
        return first if dropped and dropped >= copied else None

    def kept_from(self, first: int) -> None:
        """The file was written anew keeping the detail of segments ``first`` on."""
        self.recorded = [r for r in self.recorded if r[0] >= first]
        self.detail = {s: n for s, n in self.detail.items() if s >= first}
