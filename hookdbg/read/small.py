"""A closed recording's small tables, read in one go (hookdbg/store/schema.py: SMALL).

Checking and reading the columns of a file's small tables (steps, alerts, losses,
modules, ...) costs about 10 ms, nearly all of it HDF5's cost per object, some 45 of
them: a report on a run of eight ranks paid it eight times. A file its recorder closed
normally holds those tables once more, each part a zlib stream in one dataset, read
here at open and each part inflated when first read; their columns then stay unread
(``Recording.check`` compares them with it).

The copy is used only where it is whole and current: in a closed file whose end row,
read in place, says the recorder closed it with no write error (the copy is written
before the end row) and has the copy's status, and whose row counts are those
``committed`` says (a table rewritten since to another length, by another tool, is read
from its columns). Like everything in a file it is untrusted: a copy whose layout does
not add up, or a part that does not inflate, completely, to exactly the rows its count
says, is damage, refused in one line; and so is a part claiming more rows than its
bytes could hold (the bounds the columns have: hookdbg/read/storage.py).
"""

from __future__ import annotations

import os
import zlib
from functools import partial
from pathlib import Path

import h5py
import numpy as np

from hookdbg.read.checks import RecordingError, checked_dataset, optional_dataset, read_or_fail
from hookdbg.read.storage import MAX_MODULES, TABLE_RATIO, TABLE_SLACK
from hookdbg.read.tails import TableState
from hookdbg.store import schema

_PARTS = len(schema.SMALL_PARTS)
_HEAD = 2 * 8 * _PARTS  # each part's row count, then its stream's bytes (int64)
_PROGRESS = schema.SMALL_PARTS.index("progress")


class SmallTables:
    """The parts of a checked copy, each inflated (and checked) when first read."""

    def __init__(
        self, path: Path, data: bytes, counts: list[int], sizes: list[int], rows: list[np.dtype]
    ) -> None:
        self.path = path
        self._data = data
        self._parts: dict[str, np.ndarray] = {}
        starts = np.cumsum([_HEAD, *sizes[:-1]]).tolist()
        self._layout = {
            part: (start, size, count, dtype)
            for part, start, size, count, dtype in zip(
                schema.SMALL_PARTS, starts, sizes, counts, rows, strict=True
            )
        }

    def part(self, name: str) -> np.ndarray:
        """The rows of part ``name`` (of the progress table, its last row)."""
        found = self._parts.get(name)
        if found is None:
            found = self._parts[name] = self._inflated(name)
        return found

    def _inflated(self, name: str) -> np.ndarray:
        start, size, count, dtype = self._layout[name]
        where = f"{self.path} is damaged: the copy of {name!r} in {schema.SMALL}"
        total = count * dtype.itemsize
        stream = zlib.decompressobj()
        try:
            raw = stream.decompress(self._data[start : start + size], total + 1)
        except zlib.error as exc:
            raise RecordingError(f"{where} does not inflate ({exc})") from None
        whole = stream.eof and not stream.unconsumed_tail and not stream.unused_data
        if not whole or len(raw) != total:
            raise RecordingError(f"{where} does not hold the rows its count says")
        return np.frombuffer(raw, dtype=dtype)


def read_small(
    f: h5py.File,
    path: Path,
    end: h5py.Group,
    states: dict[str, TableState],
    rows: dict[str, np.dtype],
) -> SmallTables | None:
    """The copy of the small tables, its layout checked, with each part's rows as a
    dtype of ``rows``; None where the file holds no copy to use. ``states``: each
    table's rows in its columns and its tail, as ``committed`` says."""
    status = _closed_status(end, path)
    expected = _expected_counts(states)
    if status is None or expected is None:
        return None  # not closed normally: the tables say what happened
    ds = optional_dataset(f, schema.SMALL, np.dtype("u1"), path)
    if ds is None:
        return None  # a recorder before the copy was kept
    parts = read_or_fail(path, schema.SMALL, partial(ds.attrs.get, "parts"))
    if not ds.shape[0] or parts is None or [str(p) for p in parts] != list(schema.SMALL_PARTS):
        return None  # empty, or laid out by a hookdbg this one does not know
    data = read_or_fail(path, schema.SMALL, partial(ds.__getitem__, ())).tobytes()
    dtypes = [rows[part] for part in schema.SMALL_PARTS]
    counts, sizes = _layout(data, path, dtypes)
    if counts != expected:
        return None  # a table was rewritten to another length after the file was closed
    counts[_PROGRESS] = min(counts[_PROGRESS], 1)  # of the progress table, its last row
    small = SmallTables(path, data, counts, sizes, dtypes)
    if small.part(schema.END_TABLE)["status"][0] != status:
        return None
    return small


def _layout(data: bytes, path: Path, dtypes: list[np.dtype]) -> tuple[list[int], list[int]]:
    """Each part's row count and stream bytes, checked to add up and to claim no more
    rows than their bytes can hold."""
    where = f"{path} is damaged: {schema.SMALL}"
    if len(data) < _HEAD:
        raise RecordingError(f"{where} is {len(data)} bytes, shorter than its layout")
    head = np.frombuffer(data[:_HEAD], dtype="<i8").reshape(2, _PARTS)
    counts, sizes = head[0].tolist(), head[1].tolist()
    if min(counts) < 0 or min(sizes) < 0 or _HEAD + sum(sizes) != len(data):
        raise RecordingError(f"{where} does not add up: its layout says {head.tolist()}")
    for part, count, size, dtype in zip(schema.SMALL_PARTS, counts, sizes, dtypes, strict=True):
        rows = min(count, 1) if part == "progress" else count
        if rows * dtype.itemsize > TABLE_RATIO * size + TABLE_SLACK or (
            part == "modules" and count > MAX_MODULES
        ):
            raise RecordingError(
                f"{where} claims {count:,} rows of {part!r} in {size:,} bytes, more than "
                "they can hold; refusing to read it"
            )
    return counts, sizes


def _closed_status(end: h5py.Group, path: Path) -> bytes | None:
    """The in-place end row's status if it says the recorder closed the file with no
    write error (None otherwise): only then was the copy written whole before it."""
    values = {}
    size = os.path.getsize(path)
    for name in ("status", "write_failed"):
        column = checked_dataset(
            end,
            name,
            f"{schema.END_TABLE}/{name}",
            schema.END[name],
            path,
            size,
            filters=schema.END_FILTERS,
        )
        first = partial(column.__getitem__, slice(0, 1))
        got = read_or_fail(path, f"{schema.END_TABLE}/{name}", first)
        if len(got) != 1:
            return None
        values[name] = got[0]
    if not values["status"] or not np.isnan(values["write_failed"]):
        return None
    return bytes(values["status"])


def _expected_counts(states: dict[str, TableState]) -> list[int] | None:
    """The rows ``committed`` says each part's table has (None: one has a tail, which a
    closed file never has)."""
    tables = (*schema.SMALL_TABLES, "progress")
    if any(states[t][1] is not None for t in tables):
        return None
    return [*(states[t][0] for t in tables), 1]
