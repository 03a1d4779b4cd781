"""A closed recording's small tables, read in one go (hookdbg/store/schema.py: SMALL).

Checking and reading the columns of a file's small tables (steps, alerts, losses,
modules, ...) costs about 10 ms, nearly all of it HDF5's cost per object, some 45 of
them: a report on a run of eight ranks paid it eight times. A file its recorder closed
normally holds those tables once more, as one zlib stream in one dataset, read here;
their columns then stay unread (``Recording.check`` compares them with it).

The copy is used only where it is whole and current: in a closed file whose end row,
read in place, says the recorder closed it (the copy is written before the end row) and
agrees with the copy's, and whose row counts agree with ``committed`` (a table rewritten
since, by another tool, is read from its columns). Like everything in a file it is
untrusted: a copy that does not inflate, completely, to exactly the rows its counts
say is damage, refused in one line, and so is one claiming more rows than its bytes
could hold (the bounds the columns have: hookdbg/read/storage.py).
"""

from __future__ import annotations

import os
import zlib
from functools import partial
from pathlib import Path

import h5py
import numpy as np

from hookdbg.read.checks import RecordingError, checked_dataset, member, read_or_fail
from hookdbg.read.storage import MAX_MODULES, TABLE_RATIO, TABLE_SLACK
from hookdbg.read.tails import TableState
from hookdbg.store import schema

_COUNTS = 8 * len(schema.SMALL_PARTS)  # the stream's first bytes: a row count per part


def read_small(
    f: h5py.File,
    path: Path,
    end: h5py.Group,
    states: dict[str, TableState],
    rows: dict[str, np.dtype],
) -> dict[str, np.ndarray] | None:
    """Each part of the copy (schema.SMALL_PARTS) as rows of its dtype in ``rows``
    (the progress table's last row only); None where the file holds no copy to use.
    ``states``: each table's rows in its columns and its tail, as ``committed`` says."""
    found = member(f, schema.SMALL, schema.SMALL, path)
    if found is None:
        return None  # a recorder before the copy was kept
    size = os.path.getsize(path)
    ds = checked_dataset(
        f, schema.SMALL, schema.SMALL, np.dtype("u1"), path, size, filters=schema.NO_FILTERS
    )
    if not ds.shape[0]:
        return None  # not closed normally (yet)
    status = _closed_status(end, path, size)
    expected = _expected_counts(states)
    if status is None or expected is None:
        return None
    data = read_or_fail(path, schema.SMALL, lambda: ds[()]).tobytes()
    parts = _unpacked(data, path, expected, rows)
    if parts is None or parts[schema.END_TABLE]["status"][0] != status:
        return None
    return parts


def _closed_status(end: h5py.Group, path: Path, size: int) -> bytes | None:
    """The in-place end row's status if it says the recorder closed the file with no
    write error (None otherwise): only then was the copy written whole before it."""
    values = {}
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
        got = read_or_fail(
            path, f"{schema.END_TABLE}/{name}", partial(column.__getitem__, slice(0, 1))
        )
        if len(got) != 1:
            return None
        values[name] = got[0]
    if not values["status"] or not np.isnan(values["write_failed"]):
        return None
    return bytes(values["status"])


def _expected_counts(states: dict[str, TableState]) -> list[int] | None:
    """The rows ``committed`` says each part's table has (None: one has a tail, which a
    closed file never has)."""
    tables = schema.SMALL_PARTS[:-1]
    if any(states[t][1] is not None for t in tables):
        return None
    return [*(states[t][0] for t in tables), 1]


def _unpacked(
    data: bytes, path: Path, expected: list[int], rows: dict[str, np.dtype]
) -> dict[str, np.ndarray] | None:
    """The copy's parts; None if its counts are not ``expected`` (a table was rewritten
    after the file was closed)."""
    where = f"{path} is damaged: {schema.SMALL}"
    stream = zlib.decompressobj()
    try:
        head = stream.decompress(data, _COUNTS)
        counts = np.frombuffer(head, dtype="<i8").tolist() if len(head) == _COUNTS else None
        if counts != expected:
            if counts is None or min(counts) < 0:
                raise RecordingError(f"{where} does not begin with its row counts")
            return None
        dtypes = [rows[part] for part in schema.SMALL_PARTS]
        last = schema.SMALL_PARTS.index("progress")
        counts[last] = min(counts[last], 1)  # of the progress table, its last row
        total = sum(n * d.itemsize for n, d in zip(counts, dtypes, strict=True))
        if total > TABLE_RATIO * len(data) + TABLE_SLACK or counts[0] > MAX_MODULES:
            raise RecordingError(
                f"{where} claims {total:,} bytes of rows, more than its {len(data):,} "
                "bytes can hold; refusing to read it"
            )
        raw = stream.decompress(stream.unconsumed_tail, total + 1)
    except zlib.error as exc:
        raise RecordingError(f"{where} does not inflate ({exc})") from None
    whole = stream.eof and not stream.unconsumed_tail and not stream.unused_data
    if not whole or len(raw) != total:
        raise RecordingError(f"{where} does not hold the rows its counts say")
    out, offset = {}, 0
    for part, n, dtype in zip(schema.SMALL_PARTS, counts, dtypes, strict=True):
        out[part] = np.frombuffer(raw, dtype=dtype, count=n, offset=offset)
        offset += n * dtype.itemsize
    return out
