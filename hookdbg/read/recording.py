"""``open_recording``: the one way everything in hookdbg reads a recording.

It validates before it trusts (hookdbg/read/checks.py, runinfo.py): is the file there,
is it whole HDF5, is it a hookdbg recording, is its schema one this version
understands, is every attribute and column of the right type and shape, inside this
file and no longer than its bytes can hold; and was it closed (complete), is it still
being written (live), or was it cut short by a crash. Every failure, at open or in a
later read, is a ``RecordingError`` with one line that says what is wrong. Files are
opened read-only with SWMR, so reading never writes, works while the recorder is
running, and works after a ``kill -9``.
"""

from __future__ import annotations

import os
import socket
import time
from enum import Enum
from pathlib import Path

import numpy as np

from hookdbg.read.captures import Capture, captures_from, to_array
from hookdbg.read.checks import (
    RecordingError,
    check_module_rows,
    checked_capture_data,
    checked_tables,
    open_file,
    read_or_fail,
)
from hookdbg.read.modules import ModuleTable
from hookdbg.read.runinfo import RunInfo, run_info
from hookdbg.read.table import Table
from hookdbg.store import schema
from hookdbg.text import utf8

__all__ = ["Recording", "RecordingError", "RunInfo", "Status", "open_recording"]

# A live recorder appends a progress row every flush interval; this much silence
# (or a dead pid on this host) means the recording was cut short.
_SILENCE = 10.0
_MAX_FACTS = 4096  # info rows read: a run learns a handful of facts


class Status(Enum):
    COMPLETE = "complete"  # closed by the recorder: has its end row
    LIVE = "live"  # still being written
    CUT_SHORT = "cut short"  # the recording process died (crash, kill -9, power)


def open_recording(path: str | os.PathLike[str]) -> Recording:
    """Open and validate a recording; raises ``RecordingError`` with a one-line reason."""
    return Recording(Path(path))


class Recording:
    """A validated, read-only view of one recording. Small tables (modules, steps,
    alerts) are read at open; ``calls`` and ``tensors`` are read lazily, by column."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file, _ = open_file(path)
        try:
            self.info = run_info(self._file, path)
            dtypes = {name: dtype for name, (dtype, _) in schema.TABLES.items()}
            columns = checked_tables(self._file, path, dtypes)
            self._tables = {n: Table(n, columns[n], dtypes[n], path) for n in dtypes}
            self._capture_data = checked_capture_data(self._file, path)
            self._load_small()
        except BaseException:
            self._file.close()
            raise

    # -- lifecycle ------------------------------------------------------------------

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def refresh(self) -> bool:
        """Pick up what a live recorder wrote since; True if anything is new."""
        new = False
        for table in self._tables.values():
            new = table.refresh() or new
        if new:
            self._load_small()
        return new

    def _load_small(self) -> None:
        """The small tables, read whole: all but progress (only its last row matters,
        and a damaged file may claim 10^8 of them), end (one row) and info (bounded)."""
        t = self._tables
        modules = t["modules"].read()
        check_module_rows(modules, self.path)
        self.modules = ModuleTable(modules)
        self.steps = t["steps"].read()
        self.alerts = t["alerts"].read()
        self.captures = t["captures"].read()
        self._stored = captures_from(self.captures, self.modules, self.path)
        ends = t["end"].read(rows=slice(0, 1))
        self.end = ends[0] if len(ends) else None
        n = len(t["progress"])
        progress = t["progress"].read(rows=slice(max(n - 1, 0), n))
        self.last_progress = progress[-1] if len(progress) else None
        facts = t["info"].read(rows=slice(0, _MAX_FACTS))
        self.facts = {utf8(r["key"]): utf8(r["value"]) for r in facts}

    # -- what is in it --------------------------------------------------------------

    @property
    def calls_table(self) -> Table:
        return self._tables["calls"]

    @property
    def tensors_table(self) -> Table:
        return self._tables["tensors"]

    @property
    def status(self) -> Status:
        if self.end is not None:
            return Status.COMPLETE
        last = self.last_progress["time"] if self.last_progress is not None else None
        if last is None or time.time() - float(last) > _SILENCE or not self._writer_alive():
            return Status.CUT_SHORT
        return Status.LIVE

    def _writer_alive(self) -> bool:
        if self.info.host != socket.gethostname():
            return True  # cannot tell from here; trust the heartbeat
        try:
            os.kill(self.info.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    @property
    def backend(self) -> str:
        """The torch.distributed backend, once the script had set one up ('' if never)."""
        return self.facts.get("backend", self.info.backend)

    @property
    def dropped_rows(self) -> int:
        if self.end is not None:
            return int(self.end["dropped"])
        return int(self.last_progress["dropped"]) if self.last_progress is not None else 0

    @property
    def recorded_steps(self) -> np.ndarray:
        return self.steps["step"][self.steps["recorded"] == 1]

    @property
    def size(self) -> int:
        return self.path.stat().st_size

    def step_range(self, first: int | None = None, last: int | None = None) -> tuple[int, int]:
        """Clamp a requested range of steps to those recorded (inclusive bounds)."""
        recorded = self.recorded_steps
        if len(recorded) == 0:
            return (0, -1)
        lo = int(recorded[0]) if first is None else max(first, int(recorded[0]))
        hi = int(recorded[-1]) if last is None else min(last, int(recorded[-1]))
        return lo, hi

    def calls(
        self, first: int | None = None, last: int | None = None, columns: list[str] | None = None
    ) -> np.ndarray:
        """Call rows of steps ``first``..``last`` (default: all)."""
        return self._rows("calls", first, last, columns)

    def tensors(
        self, first: int | None = None, last: int | None = None, columns: list[str] | None = None
    ) -> np.ndarray:
        """Tensor summary rows of steps ``first``..``last`` (default: all)."""
        return self._rows("tensors", first, last, columns)

    def _rows(
        self, table: str, first: int | None, last: int | None, columns: list[str] | None
    ) -> np.ndarray:
        t = self._tables[table]
        if first is None and last is None:
            return t.read(columns)
        lo = -(2**31) if first is None else first
        hi = 2**31 - 1 if last is None else last
        return t.read(columns, t.step_rows(lo, hi))

    def captured(self, module: int | None = None, step: int | None = None) -> list[Capture]:
        """Stored full tensors, optionally of one module (id) and/or one step."""
        return [
            c
            for c in self._stored
            if (module is None or c.module.id == module) and (step is None or c.step == step)
        ]

    def tensor(self, capture: Capture) -> np.ndarray:
        """The values of a stored tensor."""
        ds = self._capture_data
        if self._file.swmr_mode:
            read_or_fail(self.path, schema.CAPTURE_DATA, ds.refresh)
        end = capture.offset + capture.nbytes
        if end > ds.shape[0]:
            raise RecordingError(
                f"{self.path} is damaged: the bytes of {capture.module.name} {capture.label} "
                f"(step {capture.step}) lie beyond the end of its stored tensors"
            )
        data = read_or_fail(
            self.path, schema.CAPTURE_DATA, lambda: ds[capture.offset : end].tobytes()
        )
        return to_array(capture, data)
