"""Lazy access to one columnar table of a recording.

Nothing is read until asked for, and then only the columns asked for: a query for one
module's output std over a long run reads the ``module``, ``slot`` and ``std`` columns
and nothing else. Rows are in the order they were recorded, and the ``step`` column of
``calls`` and ``tensors`` never decreases, so a step range becomes a row range by
binary search (a few chunk reads, however long the run).

A read that fails (a corrupt chunk, a filter HDF5 lacks) raises ``RecordingError``
with one line, like a failed open; so does a code column (phase, slot, ...) holding a
value that names nothing.

While a recording is written (or after it was cut short) the rows after a table's last
whole chunk are its *tail* (hookdbg/store/schema.py), kept apart from its columns: they
read as the table's last rows.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import h5py
import numpy as np

from hookdbg.read.checks import RecordingError, check_column_values, read_or_fail
from hookdbg.read.tails import TableState

T = TypeVar("T")


class Table:
    """``columns`` gives the stored ones, checked (an older schema may lack some of
    ``dtype``'s); it is called when the table is first used (``check``), so that a
    report reads, and checks, only the tables it needs. ``derived`` fills the columns
    it lacks: name -> the column to copy, or a constant. ``committed`` says how many
    rows of the columns the writer vouched for: rows past it were being written when
    writing stopped. From schema version 5 ``state`` says it instead, with the rows
    after those, the table's tail (a structured array holding at least the stored and
    optional columns), both from one snapshot of the file (hookdbg/read/tails.py) that
    ``refresh`` is given anew. ``swmr``: the file is read as it is written. ``held``
    gives every row, from the copy a closed file keeps of its small tables
    (hookdbg/read/small.py); its columns are then read only by ``check(stored=True)``."""

    def __init__(
        self,
        name: str,
        columns: Callable[[], dict[str, h5py.Dataset]],
        dtype: np.dtype,
        path: Path,
        derived: dict[str, str | float | bytes] | None = None,
        committed: Callable[[], int] | None = None,
        optional: dict[str, tuple[h5py.Dataset, np.dtype]] | None = None,
        state: TableState | None = None,
        swmr: bool = False,
        held: Callable[[], np.ndarray] | None = None,
    ) -> None:
        self.name = name
        self._open = columns
        # columns only some recordings have (a histogram per row), read only when
        # named: name -> (checked dataset, how one row reads)
        self._extra = {n: ds for n, (ds, _) in (optional or {}).items()}
        self.optional = {n: dtype for n, (_, dtype) in (optional or {}).items()}
        self._columns: dict[str, h5py.Dataset] = {}
        self.dtype = dtype
        self._path = path
        self._derived = derived or {}
        self._stored = [n for n in dtype.names or () if n not in self._derived]
        self._committed = committed
        self._swmr = swmr
        self._state = state
        self.held = held
        self._checked = False
        self._compared = held is None  # its columns hold what the copy holds
        self._main = 0  # rows read from the columns; the tail's follow them
        self._tail: np.ndarray | None = None
        self._length = 0
        self._cache: dict[str, np.ndarray] = {}

    def check(self, stored: bool = False) -> None:
        """Check the columns (hookdbg/read/checks.py) and count the rows, once: before
        anything of the table is read. A held table has its rows; ``stored``: check its
        columns nonetheless, and that they hold those rows."""
        if not self._checked:
            if self.held is None:
                self._columns = {**self._open(), **self._extra}
                self._length = self._measure(self._state, refresh=False)
            else:
                rows = self.held()
                self._main, self._tail, self._length = 0, rows, len(rows)
            self._checked = True
        if stored and not self._compared:
            n = self._length
            columns = Table(
                self.name, self._open, self.dtype, self._path, self._derived, state=(n, None)
            )
            if columns.read().tobytes() != self.read().tobytes():
                raise RecordingError(
                    f"{self._path} is damaged: table {self.name!r} holds other rows than "
                    "its copy among the small tables"
                )
            self._compared = True

    def _h5(self, what: str, read: Callable[[], T]) -> T:
        return read_or_fail(self._path, f"{self.name}/{what}", read)

    def _load(self, name: str, start: int, stop: int) -> np.ndarray:
        values = self._h5(name, lambda: self._columns[name][start:stop])
        if len(values) != stop - start:  # only an optional column can be shorter
            raise RecordingError(
                f"{self._path} is damaged: {self.name}/{name} holds fewer rows than the table"
            )
        check_column_values(self.name, name, values, self._path)
        return values

    def __len__(self) -> int:
        self.check()
        return self._length

    def refresh(self, state: TableState | None = None) -> bool:
        """See rows appended since the last look (``state``: as of a new snapshot of a
        version 5 file); True if there are new ones."""
        if not self._swmr:
            return False  # a file closed by its writer does not change
        self.check()
        before = self._length
        self._length = self._measure(state, refresh=True)
        if self._length != before:  # rows are only ever added: a new length is new rows
            self._cache.clear()
        return self._length != before

    def _measure(self, state: TableState | None, refresh: bool) -> int:
        """The table's rows now: the committed state first, then the columns, which the
        writer wrote before it committed them."""
        sealed, self._tail = (None, None) if state is None else state
        if refresh:
            self._refresh_columns()
        # while a file is written one column may be a batch ahead of another
        shortest = self._shortest()
        if sealed is not None and shortest < sealed and self._swmr and not refresh:
            # a live file's column handles, shared with an earlier reader, may still
            # hold the lengths they had then: the committed state read since is newer
            self._refresh_columns()
            shortest = self._shortest()
        if sealed is None:
            self._main = shortest if self._committed is None else min(shortest, self._committed())
        elif shortest < sealed:
            raise RecordingError(
                f"{self._path} is damaged: table {self.name!r} holds {shortest:,} rows, "
                f"its committed state {sealed:,}"
            )
        else:
            self._main = sealed
        return self._main + (0 if self._tail is None else len(self._tail))

    def _refresh_columns(self) -> None:
        for name in [*self._stored, *self._extra]:
            self._h5(name, self._columns[name].refresh)

    def _shortest(self) -> int:
        return min(self._h5(n, partial(_length, self._columns[n])) for n in self._stored)

    def column(self, name: str, rows: slice | None = None) -> np.ndarray:
        """One column (whole, cached, or a row range)."""
        self.check()
        if name in self._derived:
            source = self._derived[name]
            if isinstance(source, str):
                return self.column(source, rows).astype(self.dtype[name])
            start, stop, _ = (rows or slice(None)).indices(self._length)
            return np.full(max(stop - start, 0), source, dtype=self.dtype[name])
        if rows is None:
            cached = self._cache.get(name)
            if cached is None:
                cached = self._cache[name] = self._rows_of(name, 0, self._length)
            return cached
        start, stop, _ = rows.indices(self._length)
        if name in self._cache:
            return self._cache[name][start:stop]
        return self._rows_of(name, start, stop)

    def _rows_of(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start``..``stop`` of a column: from the columns, then the tail."""
        main = self._main
        stop = max(stop, start)
        if self._tail is None or (start < main and stop <= main):
            return self._load(name, start, min(stop, main))
        from_tail = self._tail[name][max(start - main, 0) : stop - main]
        check_column_values(self.name, name, from_tail, self._path)
        if start >= main:
            return from_tail
        return np.concatenate([self._load(name, start, main), from_tail])

    def read(
        self, columns: list[str] | tuple[str, ...] | None = None, rows: slice | None = None
    ) -> np.ndarray:
        """Rows as a numpy structured array, with only ``columns`` (default: all)."""
        self.check()
        names = list(columns or self.dtype.names or ())
        dtype = np.dtype([(n, self._field(n)) for n in names])
        start, stop, _ = (rows or slice(None)).indices(self._length)
        out = np.empty(max(stop - start, 0), dtype=dtype)
        for name in names:
            out[name] = self.column(name, slice(start, stop))
        return out

    def take(self, rows: np.ndarray, columns: list[str] | tuple[str, ...]) -> np.ndarray:
        """Rows at sorted indices ``rows``: read in runs of nearby rows, so that a few
        matches scattered over a long table do not read all of it."""
        dtype = np.dtype([(n, self._field(n)) for n in columns])
        out = np.empty(len(rows), dtype=dtype)
        if not len(rows):
            return out
        breaks = np.flatnonzero(np.diff(rows) > 8192) + 1
        for chunk in np.split(np.arange(len(rows)), breaks):
            lo, hi = int(rows[chunk[0]]), int(rows[chunk[-1]]) + 1
            block = self.read(columns, slice(lo, hi))
            out[chunk] = block[rows[chunk] - lo]
        return out

    def _field(self, name: str) -> np.dtype:
        optional = self.optional.get(name)
        return self.dtype[name] if optional is None else optional

    def step_rows(self, first: int, last: int) -> slice:
        """The rows of steps ``first`` to ``last`` (inclusive): binary search on disk."""
        if first > last:
            return slice(0, 0)
        self.check()
        if "step" in self._cache:
            steps = self._cache["step"]
            lo, hi = np.searchsorted(steps, [first, last + 1])
            return slice(int(lo), int(hi))
        return slice(self._bisect(first), self._bisect(last + 1))

    def _bisect(self, step: int) -> int:
        """First row whose step is >= ``step``: in the columns, else in the tail."""
        tail = self._tail
        if tail is not None and (self._main == 0 or self._last_step() < step):
            return self._main + int(np.searchsorted(tail["step"], step))
        col = self._columns["step"]
        lo, hi = 0, self._main
        while lo < hi:
            mid = (lo + hi) // 2
            if self._h5("step", partial(col.__getitem__, mid)) < step:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _last_step(self) -> int:
        col = self._columns["step"]
        return int(self._h5("step", partial(col.__getitem__, self._main - 1)))


def _length(column: h5py.Dataset) -> int:
    return int(column.shape[0])
