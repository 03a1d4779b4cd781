"""The background writer: the only code that touches the HDF5 file while recording.

Rows reach it with ``submit`` (a deque append; the training thread never waits): the
recorder hands its rows over at the end of each step, and the writer thread asks it to
(``pull``) every ``flush_interval`` seconds, so rows never wait for the training thread
to come back (a long data-loading pause, a hang). It turns them into numpy rows,
appends, records how many rows of each table are whole (``committed``), flushes. The
file is in SWMR mode from the start, so it can be read while it grows and survives
``kill -9`` of the writer process, losing at most what was gathered since the last
flush. Under SWMR HDF5 never reuses file space, so each table's columns only ever get
whole chunks, compressed and written once; the rows after them, the table's tail, go
compressed into one of three fixed byte slots rewritten in place (schema.TAIL_SLOTS), and
one in-place write of ``committed`` names what is whole: the file grows with what it
holds, not with wall time.

Captured tensors can outweigh everything else by far, and take the writer seconds to
compress: they go in behind the rows, half a flush interval of writing between two
commits (store/captured.py), so that no step's rows wait for them.

Full-queue policy: rows and captured tensors handed over and not yet written are
bounded in bytes (``max_backlog_bytes``, estimated from row counts plus the exact size
of captured tensors). While the writer is that far behind (the disk cannot keep up),
captured tensors go first and the statistics last: a captured tensor is dropped where
its bytes do not fit beside everything else waiting (one larger than the bound goes
when no other waits), and those waiting are dropped, the latest first, where the rows
need their room; a batch of rows is dropped only while the rows waiting alone fill the
bound. The count is printed once when dropping starts, kept in every progress row and
in the end row. Nothing is dropped silently.

Write errors (disk full, file removed): recording stops with one warning naming the
cause, training goes on, and every later batch counts as dropped. The ``end`` row and
the ``committed`` lengths live in datasets whose space was allocated when the file was
created, so the writer can still say in the file when writing stopped, why, and how
much was lost, and the reader ignores half-written rows past the committed lengths.

The module runs a little over 400 lines on purpose: ``Writer`` is the file's one owner
on both threads, and its policies (the backlog bound, write errors, the end row) read
together.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import re
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np

from hookdbg.store import newfile, owner, retention, schema
from hookdbg.store.captured import CapturedQueue
from hookdbg.store.rows import Columns, Packed, Taken, joined, rows_in


class WriterError(Exception):
    """The recording file cannot be created."""


Convert = Callable[[list], np.ndarray]
Batch = dict[str, Taken]  # per table: row tuples, or packed already (store/rows.py)

# What a row tuple costs in memory while it waits (measured with sys.getsizeof over a
# resnet18 recording, rounded up); packed rows cost their bytes.
ROW_BYTES = {"tensors": 700, "calls": 400, "captures": 400}
OTHER_ROW_BYTES = 300
_END_FIELDS: tuple[str, ...] = schema.END.names or ()


def batch_bytes(batch: Batch, row_bytes: dict[str, int] = ROW_BYTES) -> int:
    """What a batch of rows holds in memory, about: rows plus captured tensors' bytes."""
    total = 0
    for table, rows in batch.items():
        if isinstance(rows, Packed):
            total += rows.nbytes
            continue
        total += len(rows) * row_bytes.get(table, OTHER_ROW_BYTES)
        if table == "captures":
            total += sum(len(row[-1]) for row in rows)
    return total


class Writer:
    """Owns one recording file; see the module docstring for the policies."""

    def __init__(
        self,
        path: str | Path,
        meta: dict[str, str | int],
        *,
        converters: dict[str, Convert] | None = None,
        flush_interval: float = 1.0,
        max_backlog_bytes: int = 256 << 20,
        warn: Callable[[str], None] | None = None,
        pull: Callable[[], None] | None = None,
        tables: dict[str, tuple[np.dtype, int]] | None = None,
        keep_last: int | None = None,
    ) -> None:
        self.path = Path(path)
        self._meta = meta
        # --keep-last: what the file holds, to know when to write it anew (retention.py)
        self._ledger = retention.Ledger(keep_last) if keep_last else None
        self._rolling = False
        self._tables = tables or schema.TABLES  # schema.tables(): with histograms or not
        self._row_bytes = dict(ROW_BYTES)
        tensors = self._tables["tensors"][0]
        if schema.HISTOGRAM in (tensors.names or ()):  # each row also holds its counts
            self._row_bytes["tensors"] += tensors[schema.HISTOGRAM].itemsize + 40
        self.flush_interval = flush_interval
        self.max_backlog_bytes = max_backlog_bytes
        self._converters = converters or {}
        self._warn = warn or (lambda msg: print(f"hookdbg: {msg}", file=sys.stderr))
        self._pull = pull
        self._inbox: collections.deque[tuple[Batch, int]] = collections.deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._submitted_bytes = 0  # written only by the training thread
        self._written_bytes = 0  # written only by the writer thread
        self._submitted_captures = 0  # of those, captured tensors' (the training thread)
        self._captures_gone = 0  # and of these (the writer thread): written or dropped
        self._written_rows = 0
        self._uncommitted = 0  # rows appended since the last commit: lost if writing fails
        self.dropped_rows = 0
        self._said_dropping = 0  # 1: that captured tensors are dropped, 2: rows too
        self.failed: str | None = None
        self.failed_at = math.nan
        self._steps_appended = 0
        self.steps_written = 0  # step rows committed: what the file holds
        # captured tensors wait here, behind the rows, their bytes written a slice at a time
        self._captured = CapturedQueue(self._row_bytes["captures"])
        self.died: str | None = None  # the writer thread itself broke (a bug)
        self._end: dict[str, object] | None = None
        # drains started and finished, for flush(): it waits for one started after it asked
        self._drains = threading.Condition()
        self._drains_started = self._drains_done = 0
        self._running = True  # False once the thread writes no more
        self._tails: dict[str, tuple[h5py.Dataset, ...]] = {}
        self._sealed = {name: 0 for name in schema.TABLES}  # rows in the columns
        self._tail = {name: np.zeros(0, self._tables[name][0]) for name in schema.TABLES}
        self._generation = {name: 0 for name in schema.TABLES}  # tails written so far
        self._tail_bytes = {name: 0 for name in schema.TABLES}
        self._changed: set[str] = set()  # tables whose tail changed since it was written
        self._file = self._create(meta)
        self._thread = threading.Thread(target=self._run, name="hookdbg-writer", daemon=True)
        self._thread.start()

    # -- training thread -------------------------------------------------------------

    def submit(self, batch: Batch) -> None:
        """Hand rows over to the writer; drops (and counts) what the bound has no room
        for, captured tensors first (see the module docstring)."""
        if self.failed is not None or self.died is not None:
            self._drop(batch)
            return
        captures = batch.pop("captures", None)
        size = batch_bytes(batch, self._row_bytes)
        waiting = self.backlog_bytes - self.captures_waiting  # rows' bytes
        if waiting > 0 and waiting + size > self.max_backlog_bytes:
            self._drop({**batch, "captures": captures or []})
            return
        if captures:
            captured = batch_bytes({"captures": captures}, self._row_bytes)
            if self.has_room(size + captured):
                batch["captures"] = captures
                size += captured
                self._submitted_captures += captured
            else:
                self._drop({"captures": captures})
        if not batch:
            return
        self._submitted_bytes += size
        self._inbox.append((batch, size))
        if size > 32 << 20:
            self._wake.set()

    def has_room(self, size: int) -> bool:
        """Whether ``size`` more bytes of captured tensors fit the bound beside what
        waits (asked before a big copy); where no captured tensor waits they go whatever
        their size, or no tensor larger than the bound could ever be captured."""
        if self.failed is not None or self.died is not None:
            return False
        return self.captures_waiting == 0 or self.backlog_bytes + size <= self.max_backlog_bytes

    @property
    def captures_waiting(self) -> int:
        """Bytes of captured tensors handed over and not yet written."""
        return self._submitted_captures - self._captures_gone

    def count_dropped(self, rows: int) -> None:
        """Rows the recorder dropped itself, for want of room: counted with the rest."""
        self._drop({"captures": [None] * rows})

    def _drop(self, batch: Batch) -> None:
        """Count what is dropped; say it once for captured tensors, once for rows."""
        n = sum(len(rows) for rows in batch.values())
        captured = len(batch.get("captures", ()))
        if self.failed is None and self.died is None:
            what = None
            if n > captured and not self._said_dropping & 2:
                self._said_dropping |= 2
                what = "dropping rows"
            elif captured and not self._said_dropping:
                what = "dropping captured tensors (the statistics go on)"
            if what is not None:
                self._said_dropping |= 1
                self._warn(
                    f"the writer is {self.max_backlog_bytes / 2**20:,.4g} MB behind (the "
                    f"disk cannot keep up); {what}, counted in the recording, until it "
                    "catches up"
                )
        self.dropped_rows += n

    def flush(self, timeout: float | None) -> bool:
        """Write now what was handed over and what ``pull`` hands over, and wait until it
        is in the file. False if that took longer than ``timeout`` seconds, or if it did
        not get there: the writer is closed, or writing failed."""
        with self._drains:
            ticket = self._drains_started + 1  # the first drain to start from now on
            self._wake.set()
            self._drains.wait_for(lambda: self._drains_done >= ticket or not self._running, timeout)
            return self._drains_done >= ticket and self.failed is None

    def close(self, end: dict[str, object] | None = None) -> None:
        """Write what is queued, then the end row (marks the recording complete), close.

        ``end`` holds the END fields but "dropped" and the write error, which the writer
        knows best.
        """
        self._end = end
        self._stop.set()
        self._wake.set()
        self._thread.join()

    @property
    def backlog_bytes(self) -> int:
        """Bytes handed over and not yet written (each side counts its own)."""
        return self._submitted_bytes - self._written_bytes

    # -- writer thread ---------------------------------------------------------------

    def _create(
        self,
        meta: dict[str, str | int],
        path: Path | None = None,
        fill: Callable[[], None] | None = None,
    ) -> h5py.File:
        """The file at ``path`` (default: the recording's), its tables made, ``fill``
        run before SWMR starts, one progress row committed.

        The recording's own file is laid out in memory and put on disk whole
        (store/newfile.py): HDF5 must never meet a full disk while it makes a file,
        or it cannot close it again. A file that ``fill`` copies rows into (``_roll``)
        is made on disk, as it may be as large as the recording."""
        path = path or self.path
        if fill is None:
            try:
                newfile.put(path, self._image(meta))
            except newfile.DiskFull as exc:
                raise WriterError(f"cannot create {path}: {exc}") from None
            except Exception as exc:
                raise WriterError(f"cannot create {path}: {_reason(exc)}") from None
            try:
                # without HDF5's lock: a reader that opened the file since it came to
                # disk holds a shared one, and SWMR gives the lock up in a moment anyway
                # (store/owner.py keeps other recorders out)
                f = h5py.File(path, "r+", libver=newfile.LIBVER, locking=False)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    path.unlink()
                raise WriterError(f"cannot create {path}: {_reason(exc)}") from None
        else:
            try:
                f = h5py.File(path, "w", libver=newfile.LIBVER)
            except OSError as exc:
                raise WriterError(f"cannot create {path}: {_reason(exc)}") from None
        try:
            if fill is None:
                self._bind(f)
            else:
                self._lay_out(f, meta, fill)
            f.swmr_mode = True
        except Exception as exc:
            _discard(f, path)
            raise WriterError(f"cannot create {path}: {_reason(exc)}") from None
        owner.hold(f.id.get_vfd_handle())  # no other recorder truncates it meanwhile
        return f

    def _image(self, meta: dict[str, str | int]) -> bytes:
        """The new file's bytes, laid out in memory."""
        memory = newfile.in_memory()
        try:
            self._lay_out(memory, meta, None)
            return newfile.image(memory)
        finally:
            memory.close()

    def _lay_out(
        self, f: h5py.File, meta: dict[str, str | int], fill: Callable[[], None] | None
    ) -> None:
        """The tables and the end row's bytes made in ``f``, ``fill`` run, one progress
        row committed: a first heartbeat, so that a reader that opens the file before
        the first flush still sees a live writer."""
        for key, value in meta.items():
            f.attrs[key] = value
        self._file = f
        self._columns = {}
        for name, (dtype, chunk) in self._tables.items():
            group = f.create_group(name)
            group.attrs[schema.TAIL_COLUMNS] = list(dtype.names or ())  # a tail row
            self._tails[name] = tuple(
                group.create_dataset(
                    slot, shape=(0,), maxshape=(None,), dtype="u1", chunks=(schema.TAIL_CHUNK,)
                )
                for slot in schema.TAIL_SLOTS
            )
            self._columns[name] = [
                (
                    field,
                    group.create_dataset(
                        field,
                        # a field holding an array per row (a histogram): 2-D
                        shape=(0, *dtype[field].shape),
                        maxshape=(None, *dtype[field].shape),
                        dtype=dtype[field].base,
                        chunks=(_rows_per_chunk(chunk, dtype[field]), *dtype[field].shape),
                        **_filters(dtype[field]),
                        rdcc_nbytes=_cache_bytes(chunk, dtype[field]),
                        rdcc_nslots=11,
                    ),
                )
                for field in dtype.names or ()
            ]
        end = f.create_group(schema.END_TABLE)
        for field in _END_FIELDS:
            _allocated(end, field, schema.END[field], 1)
        end["write_failed"][0] = math.nan
        self._committed = _allocated(f, schema.COMMITTED, np.dtype("<i8"), (3, len(schema.TABLES)))
        self._small = f.create_dataset(
            schema.SMALL, shape=(0,), maxshape=(None,), dtype="u1", chunks=(schema.SMALL_CHUNK,)
        )
        self._small.attrs["parts"] = list(schema.SMALL_PARTS)
        self._capture_data = f.create_dataset(
            schema.CAPTURE_DATA,
            shape=(0,),
            maxshape=(None,),
            dtype="u1",
            chunks=(schema.CAPTURE_CHUNK,),
            compression="gzip",
            compression_opts=1,
            rdcc_nbytes=schema.CAPTURE_CHUNK + 1024,
            rdcc_nslots=11,
        )
        self._locate_end(f)
        if fill is not None:
            fill()
        self._append_raw("progress", [self._progress_row()])
        self._commit()

    def _bind(self, f: h5py.File) -> None:
        """The handles ``_lay_out`` holds, for the file it laid out, opened anew in ``f``
        (the same file, put on disk)."""
        self._file = f
        self._columns = {}
        for name, (dtype, chunk) in self._tables.items():
            group = f[name]
            self._tails[name] = tuple(group[slot] for slot in schema.TAIL_SLOTS)
            self._columns[name] = [
                (field, _opened(group, field, _cache_bytes(chunk, dtype[field])))
                for field in dtype.names or ()
            ]
        self._committed = f[schema.COMMITTED]
        self._small = f[schema.SMALL]
        self._capture_data = _opened(f, schema.CAPTURE_DATA, schema.CAPTURE_CHUNK + 1024)
        self._locate_end(f)

    def _locate_end(self, f: h5py.File) -> None:
        # one handle per dataset (self._columns) for the file's lifetime: cheaper than a
        # lookup per append, and no handle is freed while HDF5 is in an error state
        self._end_columns = {field: f[schema.END_TABLE][field] for field in _END_FIELDS}
        # where the in-place datasets are in the file: written there directly, bypassing
        # HDF5, once HDF5 itself can no longer write
        self._offsets = {field: ds.id.get_offset() for field, ds in self._end_columns.items()}

    def _run(self) -> None:
        try:
            while True:
                # twice per interval: gathering and writing take time too, and together
                # they must stay within it (the most a kill -9 loses); at once while
                # captured tensors wait (each drain commits every half interval)
                self._wake.wait(0 if self._captured else self.flush_interval / 2)
                self._wake.clear()
                stopping = self._stop.is_set()  # nothing is submitted after close() sets it
                with self._drains:
                    self._drains_started += 1
                self._drain()
                with self._drains:
                    self._drains_done += 1
                    self._drains.notify_all()
                if stopping and not self._captured:
                    break
        except BaseException as exc:  # a bug in the writer: say so, keep the file readable
            self.died = f"{type(exc).__name__}: {exc}"
            self._warn(
                f"the writer stopped ({self.died}): recording stopped, training goes on, "
                "and what was written so far stays readable"
            )
        try:
            self._finish()
        finally:
            with self._drains:  # flush() waits no more
                self._running = False
                self._drains.notify_all()

    def _drain(self) -> None:
        """What was handed over into the file: the rows at once, committed; then the
        captured tensors taken with them, half a flush interval of writing at a time,
        each slice committed with the rows handed over meanwhile. A step's rows never
        wait behind captured bytes, and nothing waits more than about half an interval
        for a commit (the most a kill -9 loses), however many bytes are captured."""
        target = None
        while True:
            if self._pull is not None:
                self._pull()  # the recorder hands over what it gathered: after the rest
            try:
                self._take_in()
                if target is None:  # what was handed over when the drain began
                    target = self._captured.taken
                if self.failed is not None:
                    return
                self._commit_taken()
                if self._captured.handled >= target:
                    return
                self._store_captured(time.monotonic() + self.flush_interval / 2)
            except Exception as exc:
                rows, size = self._captured.drop()
                self.dropped_rows += self._uncommitted + rows
                self._captured_left(size)
                self._uncommitted = 0
                self._fail(exc)
                return

    def _take_in(self) -> None:
        """The batches handed over: rows into the tables' tails, captured tensors into
        their queue. After a write error, counted as dropped."""
        merged: dict[str, list[Taken]] = {}
        size = 0  # what the rows taken held in memory (captured tensors: when written)
        over = self.backlog_bytes - self.max_backlog_bytes  # rows came past the bound
        try:
            while self._inbox:
                batch, batch_size = self._inbox.popleft()
                size += batch_size
                if self.failed is not None:
                    self.dropped_rows += sum(len(rows) for rows in batch.values())
                    captured = batch.get("captures", [])
                    assert isinstance(captured, list)  # captures are never packed
                    self._captures_gone += sum([self._captured.cost(row) for row in captured])
                    continue
                for table, table_rows in batch.items():
                    if table == "captures":
                        assert isinstance(table_rows, list)
                        self._captured.add(table_rows)
                        size -= sum(self._captured.cost(row) for row in table_rows)
                        continue
                    merged.setdefault(table, []).append(table_rows)
                    self._uncommitted += len(table_rows)
                    self._written_rows += len(table_rows)
            for table, parts in merged.items():
                self._append(table, parts)
        finally:
            self._written_bytes += size
        self._make_room(over)

    def _make_room(self, over: int) -> None:
        """``over`` bytes past the bound (rows came while captured tensors filled it):
        the captured tensors waiting go, the latest first, until what waited fits; the
        statistics keep their room."""
        if over > 0 and not self._stop.is_set():  # closing: all of it is written anyway
            rows, size = self._captured.shed(over)
            if rows:
                self._drop({"captures": [None] * rows})
                self._captured_left(size)

    def _captured_left(self, size: int) -> None:
        """``size`` bytes of captured tensors left the backlog (written, or dropped)."""
        self._written_bytes += size
        self._captures_gone += size

    def _store_captured(self, until: float) -> None:
        """Captured bytes into the file until ``until`` (time.monotonic), and the rows of
        the tensors whose bytes are all in."""
        rows, size = self._captured.store(self._capture_data, until)
        self._captured_left(size)
        if not rows:
            return
        self._uncommitted += len(rows)
        self._written_rows += len(rows)
        self._append_array("captures", self._convert("captures", rows))

    def _commit_taken(self) -> None:
        """Commit what was appended, with a progress row; write the file anew when
        --keep-last says so, but never with a tensor's bytes half in."""
        self._append_raw("progress", [self._progress_row()])
        self._commit()
        if self._ledger is not None and not self._captured.partial:
            first = self._ledger.first_kept()
            if first is not None:
                self._roll(first)

    def _append(self, table: str, parts: list[Taken]) -> None:
        """One table's rows from several batches, in order, in one append per column."""
        pieces: list[Columns] = []
        rows: list = []  # consecutive parts of row tuples convert together
        for part in [*joined(parts), None]:
            if isinstance(part, list):
                rows.extend(part)
                continue
            if rows:
                data = self._convert(table, rows)
                pieces.append({name: data[name] for name in data.dtype.names or ()})
                rows = []
            if part is not None and len(part):
                pieces.append(part.columns())
        if not pieces:
            return
        columns = pieces[0]
        if len(pieces) > 1:
            columns = {name: np.concatenate([p[name] for p in pieces]) for name in columns}
        self._append_columns(table, columns)
        if table == "steps":
            self._steps_appended += rows_in(columns)

    def _convert(self, table: str, rows: list) -> np.ndarray:
        convert = self._converters.get(table)
        return convert(rows) if convert else np.array(rows, dtype=self._tables[table][0])

    def _append_raw(self, table: str, rows: list) -> None:
        self._append_array(table, np.array(rows, dtype=schema.TABLES[table][0]))

    def _append_array(self, table: str, data: np.ndarray) -> None:
        self._append_columns(table, {name: data[name] for name in data.dtype.names or ()})

    def _append_columns(self, table: str, columns: Columns) -> None:
        """Rows to the table's tail: its columns get them a whole chunk at a time."""
        count = rows_in(columns)
        if not count:
            return
        rows = np.empty(count, dtype=self._tables[table][0])
        for name in rows.dtype.names or ():
            rows[name] = columns[name]
        if self._ledger is not None and not self._rolling:
            self._ledger.add(table, rows)
        tail = self._tail[table]
        self._tail[table] = np.concatenate([tail, rows]) if len(tail) else rows
        self._changed.add(table)

    def _commit(self, last: bool = False) -> None:
        """What was appended, on disk: whole chunks into the columns (``last``: the rest
        too, the recording ends), the tails into their free slots, then one in-place
        write of ``committed`` that names them."""
        for table in sorted(self._changed):
            self._seal(table, last)
            if not last:
                self._write_tail(table)
        self._file.flush()  # the rows first, then what vouches for them
        state = np.zeros((3, len(schema.TABLES)), dtype=np.int64)
        for i, name in enumerate(schema.TABLES):
            state[:, i] = (self._sealed[name], self._generation[name], self._tail_bytes[name])
        self._committed[:] = state
        self._file.flush()
        self._changed.clear()
        self._uncommitted = 0
        self.steps_written = self._steps_appended
        self._captured.committed()

    def _seal(self, table: str, last: bool) -> None:
        """The table's tail rows that fill whole chunks (``last``: all of them) into its
        columns, each chunk compressed and written once."""
        tail, chunk = self._tail[table], self._tables[table][1]
        whole = len(tail) if last else len(tail) - len(tail) % chunk
        if not whole:
            return
        n = self._sealed[table]
        for field, ds in self._columns[table]:
            _append_at(ds, n, tail[field][:whole])
        self._sealed[table] = n + whole
        self._tail[table] = tail[whole:]
        if last:
            self._tail_bytes[table] = 0

    def _write_tail(self, table: str) -> None:
        """The table's tail, compressed, into the next slot (``committed`` names it next)."""
        tail = self._tail[table]
        blob = np.frombuffer(zlib.compress(tail.tobytes(), 1), dtype="u1") if len(tail) else None
        generation = self._generation[table] + 1
        if blob is not None:
            ds = self._tails[table][generation % len(schema.TAIL_SLOTS)]
            if ds.shape[0] < len(blob):  # room for it, in whole chunks, kept from then on
                ds.resize((-(-len(blob) // schema.TAIL_CHUNK) * schema.TAIL_CHUNK,))
            ds[: len(blob)] = blob
        self._generation[table] = generation
        self._tail_bytes[table] = 0 if blob is None else len(blob)

    # -- --keep-last: the file written anew without the detail of older segments --------

    # what belongs to the file being written, set anew for the file that replaces it
    _PER_FILE = (
        "_file",
        "_columns",
        "_tails",
        "_committed",
        "_small",
        "_capture_data",
        "_end_columns",
        "_offsets",
        "_sealed",
        "_tail",
        "_generation",
        "_tail_bytes",
        "_changed",
    )

    def _roll(self, first: int) -> None:
        """Replace the file, just committed, by a copy that keeps the detail of segments
        ``first`` on and everything else (hookdbg/store/retention.py). The copy is
        written beside the file and renamed over it: a reader holding the old file
        reads on, and reopens the new one when it looks again; a kill meanwhile leaves
        the old file as committed. If the copy fails (a full disk), the file goes on
        whole, and says so."""
        old = {name: getattr(self, name) for name in self._PER_FILE}
        tables = self._tables
        self._tails = {}
        self._sealed = {name: 0 for name in tables}
        self._tail = {name: np.zeros(0, tables[name][0]) for name in tables}
        self._generation = {name: 0 for name in tables}
        self._tail_bytes = {name: 0 for name in tables}
        self._changed = set()
        real = Path(os.path.realpath(self.path))  # a symlink's target is replaced
        tmp = real.with_name(real.name + ".keeping")
        self._rolling = True  # the rows copied are in the ledger already
        try:
            meta = dict(old["_file"].attrs.items())
            self._file = self._create(meta, tmp, lambda: self._copy_kept(old, first))
            os.replace(tmp, real)
        except Exception as exc:
            if self._file is not old["_file"]:
                with contextlib.suppress(Exception):
                    self._file.close()
            with contextlib.suppress(OSError):
                tmp.unlink()
            for name, value in old.items():
                setattr(self, name, value)
            self._ledger = None
            text = f"keeping the last steps stopped ({_reason(exc)}): the file keeps them all"
            self._warn(f"{text}, {self.path}")
            self._append_raw("info", [(time.time(), "keep_last", text)])
            return
        finally:
            self._rolling = False
        with contextlib.suppress(Exception):
            old["_file"].close()
        if self._ledger is not None:
            self._ledger.kept_from(first)
        self._captured_left(self._captured.keep_from(first))

    def _copy_kept(self, old: dict[str, object], first: int) -> None:
        """Into the new file: what ``retention.kept`` keeps of each table, captured
        bytes with the captures that keep them, and where the detail now starts."""
        columns = old["_columns"]
        sealed = old["_sealed"]
        tails = old["_tail"]
        assert isinstance(columns, dict) and isinstance(sealed, dict) and isinstance(tails, dict)
        for table, (_, chunk) in self._tables.items():
            for block in retention.rows(columns[table], sealed[table], tails[table], chunk):
                block = retention.kept(table, block, first)
                if table == "captures" and len(block):
                    block = self._copy_capture_bytes(block, old["_capture_data"])
                if len(block):
                    self._append_array(table, block)
                    self._seal(table, last=False)
        self._append_raw("info", [(time.time(), retention.KEPT, str(first))])

    def _copy_capture_bytes(self, block: np.ndarray, source: object) -> np.ndarray:
        """``block``'s captured bytes from ``source`` into this file, offsets set anew."""
        assert isinstance(source, h5py.Dataset)
        ds, out = self._capture_data, block.copy()
        offset = -(-ds.shape[0] // schema.CAPTURE_CHUNK) * schema.CAPTURE_CHUNK
        ds.resize((offset + int(block["nbytes"].sum()),))
        for i, row in enumerate(block):
            start, size = int(row["offset"]), int(row["nbytes"])
            ds[offset : offset + size] = source[start : start + size]
            out["offset"][i] = offset
            offset += size
        return out

    def _progress_row(self) -> tuple:
        # committed with the steps appended so far
        return (time.time(), self._steps_appended, self._written_rows, self.dropped_rows)

    def _end_row(self, status: str) -> np.ndarray:
        end = {
            "time": time.time(),
            "status": "",
            "exit_code": 0,
            "steps": self.steps_written,
            "calls": 0,
            "alerts": 0,
            "message": "",
            **(self._end or {}),
        }
        end["status"] = status
        end["dropped"] = self.dropped_rows
        end["write_failed"] = self.failed_at
        end["write_error"] = self.failed or self.died or ""
        row = tuple(_fit(end[name], schema.END[name]) for name in _END_FIELDS)
        return np.array([row], dtype=schema.END)

    def _finish(self) -> None:
        rows, size = self._captured.drop()  # none, unless the writer thread broke
        self.dropped_rows += rows
        self._captured_left(size)
        status = str(self._end["status"]) if self._end is not None else ""
        if self.failed is None:
            try:
                self._changed.update(name for name in schema.TABLES if len(self._tail[name]))
                self._commit(last=True)  # every row into the columns: the tails are empty
                row = self._end_row(status)
                self._write_small(row)
                self._file.flush()  # on disk whole before the end row says the file closed
                for field, ds in self._end_columns.items():
                    ds[0] = row[field][0]
                self._file.flush()
            except Exception as exc:
                self._fail(exc)
        if self.failed is not None:
            self._write_end_directly(self._end_row(status))
            self._abandon()
        with contextlib.suppress(Exception):
            self._file.close()
        if self.failed is None:
            compact(self.path)

    def _write_small(self, end: np.ndarray) -> None:
        """Every row of the small tables, the last progress row and the end row, into
        ``schema.SMALL``: a reader of a run's many rank files then reads one object of
        each file, not a column of every table."""
        parts = [self._sealed_rows(table) for table in schema.SMALL_TABLES]
        parts += [self._sealed_rows("progress", last=1), end]
        streams = [zlib.compress(part.tobytes(), 1) for part in parts]
        head = np.array([[len(p) for p in parts], [len(s) for s in streams]], dtype="<i8")
        head[0, schema.SMALL_PARTS.index("progress")] = self._sealed["progress"]
        blob = b"".join([head.tobytes(), *streams])
        free = newfile.free_space(self.path, replacing=False)
        if free is not None and free < len(blob) + newfile.START_ROOM:
            return  # the copy is optional, an HDF5 write into a full disk is not undone
        self._small.resize((len(blob),))
        self._small[:] = np.frombuffer(blob, dtype="u1")

    def _sealed_rows(self, table: str, last: int | None = None) -> np.ndarray:
        """The table's rows as its columns hold them (``last``: only that many)."""
        n = self._sealed[table]
        start = 0 if last is None else max(n - last, 0)
        rows = np.empty(n - start, dtype=self._tables[table][0])
        for field, ds in self._columns[table]:
            rows[field] = ds[start:n]
        return rows

    def _write_end_directly(self, row: np.ndarray) -> None:
        """Write the end row into its preallocated bytes with plain OS writes: HDF5 has
        failed, but these bytes need no new space."""
        with contextlib.suppress(Exception):
            fd = self._file.id.get_vfd_handle()
            for field in _END_FIELDS:
                os.pwrite(fd, row[field].tobytes(), self._offsets[field])
            os.fsync(fd)

    def _abandon(self) -> None:
        """After a write error, point the file's descriptor at /dev/null before closing
        (``_silence``)."""
        _silence(self._file)

    def _fail(self, exc: BaseException) -> None:
        self.failed = _reason(exc)
        self.failed_at = time.time()
        self._warn(
            f"writing {self.path} failed ({self.failed}); recording stopped, training goes "
            "on, and what was written so far stays readable"
        )
        # say so in the file at once, in case the process does not get to close it
        self._write_end_directly(self._end_row(""))


# the tails' slots may take this share of a closed file before it is compacted
_SLOT_SHARE = 0.1


def compact(path: Path) -> bool:
    """A closed recording without the space its tails' slots took while it was written
    (each holds up to a compressed chunk of a table's rows: a few hundred kB, most of a
    short recording), when they take over a tenth of it: a copy of every object, the
    slots left empty, replaces the file. h5py copies chunks as they are stored, without
    decompressing them. Anything that fails leaves the file as it was. Through a
    symlink, its target is compacted."""
    path = Path(os.path.realpath(path))
    tmp = path.with_name(path.name + ".compacting")
    try:
        with h5py.File(path, "r") as f:
            slots = sum(
                f[table][slot].id.get_storage_size()
                for table in schema.TABLES
                if table in f
                for slot in schema.TAIL_SLOTS
                if slot in f[table]
            )
            if slots <= _SLOT_SHARE * os.path.getsize(path):
                return False
            with h5py.File(tmp, "w", libver=("v110", "v110")) as out:
                for key, value in f.attrs.items():
                    out.attrs[key] = value
                for name in f:
                    if name in schema.TABLES:
                        group = out.create_group(name)
                        group.attrs.update(f[name].attrs)
                        for column in f[name]:
                            if column in schema.TAIL_SLOTS:
                                group.create_dataset(
                                    column, shape=(0,), maxshape=(None,), dtype="u1", chunks=True
                                )
                            else:
                                f.copy(f[name][column], group, column)
                    else:
                        f.copy(f[name], out, name)
        os.replace(tmp, path)
        return True
    except Exception:  # the recording stays as the writer closed it: whole, only larger
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False


def _silence(f: h5py.File) -> None:
    """Point the descriptor of ``f``, which HDF5 failed to write, at /dev/null.

    HDF5 retries its metadata flush on close and at exit; on a full disk that fails
    again, and HDF5 2.0 then crashes the process (measured: SIGSEGV at exit), which
    would change the script's exit status. Writes to /dev/null succeed, so nothing more
    reaches the file, which keeps what was flushed.
    """
    with contextlib.suppress(Exception):
        fd = f.id.get_vfd_handle()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)


def _discard(f: h5py.File, path: Path) -> None:
    """A file that could not be set up: closed without a word from HDF5 (``_silence``),
    and removed."""
    _silence(f)
    with contextlib.suppress(Exception):
        f.close()
    with contextlib.suppress(OSError):
        path.unlink()


def _opened(group: h5py.Group, name: str, cache_bytes: int) -> h5py.Dataset:
    """``group[name]`` with a chunk cache of ``cache_bytes`` (``_cache_bytes``)."""
    dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    dapl.set_chunk_cache(11, cache_bytes, 0.75)
    return h5py.Dataset(h5py.h5d.open(group.id, name.encode(), dapl))


def _cache_bytes(chunk: int, dtype: np.dtype) -> int:
    """A column's chunk cache: appends touch the last chunk only, so cache that one, not
    the default 1 MB of old chunks per column (~80 MB in all)."""
    return _rows_per_chunk(chunk, dtype) * dtype.itemsize + 1024


def _append_at(ds: h5py.Dataset, n: int, values: np.ndarray) -> None:
    """``values`` written from row ``n`` of ``ds``, grown to fit, through h5py's low-level
    API: a high-level resize and slice assignment spend about 40 us per column in Python
    around the write, a drain appends to some 50 columns, and on a model with long steps
    that showed in the step time (docs/performance.md, "The writer")."""
    values = np.ascontiguousarray(values, dtype=ds.dtype)
    dsid = ds.id
    dsid.set_extent((n + len(values), *values.shape[1:]))
    space = dsid.get_space()
    space.select_hyperslab((n, *(0,) * (values.ndim - 1)), values.shape)
    dsid.write(h5py.h5s.create_simple(values.shape), space, values)


def _filters(dtype: np.dtype) -> dict[str, object]:
    """How a column is compressed: statistics and times (floats) with LZF after shuffle,
    which takes half gzip's time for them and reads faster, for 7-9% more bytes (they
    are mostly mantissa, which neither compresses much); the rest with gzip after
    shuffle (docs/performance.md, "The writer")."""
    if dtype.base.kind == "f":
        return {"compression": "lzf", "shuffle": True}
    return {"compression": "gzip", "compression_opts": 1, "shuffle": True}


def _rows_per_chunk(chunk: int, dtype: np.dtype) -> int:
    """``chunk``, but at most about 256 kB for a wide column (8,192 histograms of 1,024
    counts would be 64 MB a chunk): a power of two that divides ``chunk``, so that the
    table's whole chunks are whole chunks of it too."""
    if not dtype.shape:
        return chunk
    rows = max(16, min(chunk, (256 << 10) // dtype.itemsize))
    return 1 << (rows.bit_length() - 1)


def _allocated(
    group: h5py.Group, name: str, dtype: np.dtype, n: int | tuple[int, ...]
) -> h5py.Dataset:
    """A fixed-size contiguous dataset whose file space is allocated and filled now."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.CONTIGUOUS)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_ALLOC)
    space = h5py.h5s.create_simple(n if isinstance(n, tuple) else (n,))
    tid = h5py.h5t.py_create(dtype, logical=True)
    dsid = h5py.h5d.create(group.id, name.encode(), tid, space, dcpl=dcpl)
    return h5py.Dataset(dsid)


def _fit(value: object, dtype: np.dtype) -> object:
    """A value for a fixed-width field: text encoded and cut to the width."""
    if dtype.kind == "S":
        data = str(value).encode("utf-8")[: dtype.itemsize]
        return data.decode("utf-8", "ignore").encode("utf-8")
    return value


def _reason(exc: BaseException) -> str:
    """The OS's words for an I/O error ("No space left on device") where HDF5 buries them."""
    errno = getattr(exc, "errno", None)
    if not errno:
        found = re.search(r"errno = (\d+)", str(exc))
        errno = int(found.group(1)) if found else None
    if errno == 11 and "lock" in str(exc):  # HDF5's lock: a reader has the file open
        return (
            "another process has it open (a reader: `hookdbg tui`, a notebook); close it "
            "or record to another file"
        )
    if errno:
        return os.strerror(errno)
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]
