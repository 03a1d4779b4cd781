"""The background writer: the only code that touches the HDF5 file while recording.

The training thread hands over batches of rows with ``submit`` (a deque append, never
a wait); a daemon thread turns them into numpy rows, appends them and flushes, at
least every ``flush_interval`` seconds. The file is in SWMR mode from the start, so it
can be read while it grows and survives ``kill -9`` of the writer process, losing
only what was not yet flushed.

Full-queue policy: when the rows handed over but not yet written exceed
``max_backlog_rows`` (the disk cannot keep up), new batches are dropped whole and
counted; the count is printed once when dropping starts, kept in every progress row
and in the end row. Nothing is dropped silently. If writing fails (disk full, file
removed), recording stops with one warning, training goes on, and every later batch
counts as dropped.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np

from hookdbg.store import schema


class WriterError(Exception):
    """The recording file cannot be created."""


Convert = Callable[[list], np.ndarray]


class Writer:
    """Owns one recording file; see the module docstring for the policies."""

    def __init__(
        self,
        path: str | Path,
        meta: dict[str, str | int],
        *,
        converters: dict[str, Convert] | None = None,
        flush_interval: float = 1.0,
        max_backlog_rows: int = 2_000_000,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.flush_interval = flush_interval
        self.max_backlog_rows = max_backlog_rows
        self._converters = converters or {}
        self._warn = warn or (lambda msg: print(f"hookdbg: {msg}", file=sys.stderr))
        self._inbox: collections.deque[dict[str, list]] = collections.deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._submitted_rows = 0  # written only by the training thread
        self._written_rows = 0  # written only by the writer thread
        self.dropped_rows = 0
        self.failed: str | None = None
        self.steps_written = 0
        self._end: dict[str, object] | None = None
        self._file = self._create(meta)
        self._thread = threading.Thread(target=self._run, name="hookdbg-writer", daemon=True)
        self._thread.start()

    # -- training thread -------------------------------------------------------------

    def submit(self, batch: dict[str, list]) -> None:
        """Hand rows over to the writer; drops (and counts) them if it is too far behind."""
        n = sum(len(rows) for rows in batch.values())
        if self.failed is not None or self.backlog_rows > self.max_backlog_rows:
            if self.dropped_rows == 0 and self.failed is None:
                self._warn(
                    f"the writer is {self.max_backlog_rows:,} rows behind; dropping rows "
                    "(counted in the recording) until it catches up"
                )
            self.dropped_rows += n
            return
        self._submitted_rows += n
        self._inbox.append(batch)
        if n > 50_000:
            self._wake.set()

    def close(self, end: dict[str, object] | None = None) -> None:
        """Write what is queued, then the end row (marks the recording complete), close.

        ``end`` holds the END fields but "dropped", which the writer knows best.
        """
        self._end = end
        self._stop.set()
        self._wake.set()
        self._thread.join()

    @property
    def backlog_rows(self) -> int:
        """Rows handed over and not yet written (each side counts its own)."""
        return self._submitted_rows - self._written_rows

    # -- writer thread ---------------------------------------------------------------

    def _create(self, meta: dict[str, str | int]) -> h5py.File:
        try:
            f = h5py.File(self.path, "w", libver=("v110", "v110"))
        except OSError as exc:
            raise WriterError(f"cannot create {self.path}: {_reason(exc)}") from None
        try:
            for key, value in meta.items():
                f.attrs[key] = value
            for name, (dtype, chunk) in schema.TABLES.items():
                group = f.create_group(name)
                for field in dtype.names:
                    group.create_dataset(
                        field,
                        shape=(0,),
                        maxshape=(None,),
                        dtype=dtype[field],
                        chunks=(chunk,),
                        compression="gzip",
                        compression_opts=1,
                        shuffle=True,
                    )
            f.create_dataset(
                schema.CAPTURE_DATA,
                shape=(0,),
                maxshape=(None,),
                dtype="u1",
                chunks=(schema.CAPTURE_CHUNK,),
                compression="gzip",
                compression_opts=1,
            )
            # a first heartbeat before SWMR starts: a reader that opens the file before
            # the first flush still sees a live writer
            f["progress"]["time"].resize((1,))
            f["progress"]["time"][0] = time.time()
            for column in ("steps", "rows", "dropped"):
                f["progress"][column].resize((1,))
            f.swmr_mode = True
        except Exception as exc:
            f.close()
            raise WriterError(f"cannot create {self.path}: {_reason(exc)}") from None
        # one handle per dataset for the file's lifetime: cheaper than a lookup per
        # append, and no handle is freed while HDF5 is in an error state
        self._columns = {
            name: [(field, f[name][field]) for field in dtype.names]
            for name, (dtype, _) in schema.TABLES.items()
        }
        self._capture_data = f[schema.CAPTURE_DATA]
        return f

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            stopping = self._stop.is_set()  # nothing is submitted after close() sets it
            self._drain()
            if stopping:
                break
        self._finish()

    def _drain(self) -> None:
        batches = []
        while self._inbox:
            batches.append(self._inbox.popleft())
        if self.failed is not None:
            self.dropped_rows += sum(len(r) for b in batches for r in b.values())
            self._written_rows += sum(len(r) for b in batches for r in b.values())
            return
        try:
            merged: dict[str, list] = {}
            for batch in batches:
                for table, rows in batch.items():
                    merged.setdefault(table, []).extend(rows)
            for table, rows in merged.items():
                if rows:
                    self._append(table, rows)
            self._append_raw("progress", [self._progress_row()])
            self._file.flush()
        except Exception as exc:
            self._fail(exc)
        finally:
            self._written_rows += sum(len(r) for b in batches for r in b.values())

    def _append(self, table: str, rows: list) -> None:
        if table == "captures":
            rows = self._store_capture_bytes(rows)
        convert = self._converters.get(table)
        data = convert(rows) if convert else np.array(rows, dtype=schema.TABLES[table][0])
        self._append_array(table, data)
        if table == "steps":
            self.steps_written += len(data)

    def _append_raw(self, table: str, rows: list) -> None:
        self._append_array(table, np.array(rows, dtype=schema.TABLES[table][0]))

    def _append_array(self, table: str, data: np.ndarray) -> None:
        for field, ds in self._columns[table]:
            n = ds.shape[0]
            ds.resize((n + len(data),))
            ds[n:] = data[field]

    def _store_capture_bytes(self, rows: list) -> list:
        """Capture rows arrive as (fields..., payload bytes); append payloads, set offsets."""
        ds = self._capture_data
        offset = ds.shape[0]
        payload = b"".join(row[-1] for row in rows)
        ds.resize((offset + len(payload),))
        ds[offset:] = np.frombuffer(payload, dtype="u1")
        out = []
        for row in rows:
            *fields, data = row
            out.append((*fields[:-1], offset, len(data), fields[-1]))
            offset += len(data)
        return out

    def _progress_row(self) -> tuple:
        return (time.time(), self.steps_written, self._written_rows, self.dropped_rows)

    def _finish(self) -> None:
        try:
            if self.failed is None and self._end is not None:
                end = {**self._end, "dropped": self.dropped_rows}
                self._append_raw("end", [tuple(end[name] for name in schema.END.names)])
                self._file.flush()
        except Exception as exc:
            self._fail(exc)
        if self.failed is not None:
            self._abandon()
        with contextlib.suppress(Exception):
            self._file.close()

    def _abandon(self) -> None:
        """After a write error, point the file's descriptor at /dev/null before closing.

        HDF5 retries its metadata flush on close and at exit; on a full disk that
        fails again, and HDF5 2.0 then crashes the process (measured: SIGSEGV at
        exit), which would change the script's exit status. Writes to /dev/null
        succeed, so nothing more reaches the file, which keeps what was flushed.
        """
        with contextlib.suppress(Exception):
            fd = self._file.id.get_vfd_handle()
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)

    def _fail(self, exc: BaseException) -> None:
        self.failed = _reason(exc)
        self._warn(
            f"writing {self.path} failed ({self.failed}); recording stopped, training goes "
            "on, and what was written so far stays readable"
        )


def _reason(exc: BaseException) -> str:
    """The OS's words for an I/O error ("No space left on device") where HDF5 buries them."""
    errno = getattr(exc, "errno", None)
    if not errno:
        found = re.search(r"errno = (\d+)", str(exc))
        errno = int(found.group(1)) if found else None
    if errno:
        return os.strerror(errno)
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]
