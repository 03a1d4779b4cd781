"""``open_recording``: the one way everything in hookdbg reads a recording.

It validates before it trusts: is the file there, is it HDF5, is it a hookdbg
recording, is its schema one this version understands, are its tables whole, and was
it closed (complete), is it still being written (live), or was it cut short by a
crash. Every failure is a ``RecordingError`` with one line that says what is wrong and
what to do. Files are opened read-only with SWMR, so reading never writes, works while
the recorder is running, and works after a ``kill -9``.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import h5py
import numpy as np

from hookdbg.read.captures import Capture, captures_from, to_array
from hookdbg.read.modules import ModuleTable
from hookdbg.read.table import Table
from hookdbg.store import schema
from hookdbg.text import utf8

# A live recorder appends a progress row every flush interval; this much silence
# (or a dead pid on this host) means the recording was cut short.
_SILENCE = 10.0


class RecordingError(Exception):
    """A file that cannot be read as a recording; the message is one line for the user."""


class Status(Enum):
    COMPLETE = "complete"  # closed by the recorder: has its end row
    LIVE = "live"  # still being written
    CUT_SHORT = "cut short"  # the recording process died (crash, kill -9, power)


@dataclass(frozen=True)
class RunInfo:
    """What ran, where, with which software and options (the file's attributes)."""

    argv: list[str]
    created: str
    host: str
    pid: int
    cwd: str
    hookdbg_version: str
    torch_version: str
    python_version: str
    options: dict[str, object]
    rank: int
    world_size: int
    backend: str
    schema_version: int

    @property
    def command(self) -> str:
        return " ".join(self.argv)


def open_recording(path: str | os.PathLike[str]) -> Recording:
    """Open and validate a recording; raises ``RecordingError`` with a one-line reason."""
    return Recording(Path(path))


class Recording:
    """A validated, read-only view of one recording. Small tables (modules, steps,
    alerts) are read at open; ``calls`` and ``tensors`` are read lazily, by column."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = _open(path)
        try:
            self.info = _run_info(self._file, path)
            for name, (dtype, _) in schema.TABLES.items():
                _check_table(self._file, name, dtype, path)
            self._tables = {
                name: Table(self._file[name], dtype) for name, (dtype, _) in schema.TABLES.items()
            }
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
        t = self._tables
        self.modules = ModuleTable(t["modules"].read())
        self.steps = t["steps"].read()
        self.alerts = t["alerts"].read()
        self.captures = t["captures"].read()
        ends = t["end"].read()
        self.end = ends[0] if len(ends) else None
        progress = t["progress"].read()
        self.last_progress = progress[-1] if len(progress) else None
        self.facts = {utf8(r["key"]): utf8(r["value"]) for r in t["info"].read()}

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
        rows = self.captures
        if module is not None:
            rows = rows[rows["module"] == module]
        if step is not None:
            rows = rows[rows["step"] == step]
        return captures_from(rows, self.modules)

    def tensor(self, capture: Capture) -> np.ndarray:
        """The values of a stored tensor."""
        ds = self._file[schema.CAPTURE_DATA]
        if self._file.swmr_mode:
            ds.refresh()
        return to_array(capture, ds[capture.offset : capture.offset + capture.nbytes].tobytes())


# -- validation ---------------------------------------------------------------------


def _open(path: Path) -> h5py.File:
    """Open read-only: plainly if the file was closed cleanly, else (still being written,
    or its writer died) with SWMR. Truncation is caught first, from the superblock:
    HDF5's SWMR reader retries failed metadata reads for minutes instead of failing."""
    if not path.exists():
        raise RecordingError(f"{path}: no such file")
    if path.is_dir():
        raise RecordingError(f"{path} is a directory, not a recording")
    try:
        is_hdf5 = h5py.is_hdf5(path)
    except OSError as exc:
        raise RecordingError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if not is_hdf5:
        raise RecordingError(f"{path} is not a hookdbg recording (not an HDF5 file)")
    _check_length(path)
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        if "already open for write" not in str(exc):
            raise _damaged(path, exc) from None
    try:  # the writer set the "open for write" flag: live, or it died (kill -9, crash)
        return h5py.File(path, "r", swmr=True)
    except OSError as exc:
        raise _damaged(path, exc) from None


def _damaged(path: Path, exc: Exception) -> RecordingError:
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return RecordingError(
        f"{path} is damaged and cannot be opened (truncated or corrupt: {reason})"
    )


_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _check_length(path: Path) -> None:
    """Compare the end-of-file address in a version 2/3 superblock (what hookdbg writes)
    with the file's size; other superblocks are left to HDF5 to judge."""
    with open(path, "rb") as f:
        head = f.read(48)
    if not head.startswith(_SIGNATURE) or len(head) < 12 or head[8] not in (2, 3):
        return
    width = head[9]  # size of offsets
    if width not in (4, 8) or len(head) < 12 + 4 * width:
        return
    end = int.from_bytes(head[12 + 2 * width : 12 + 3 * width], "little")
    size = path.stat().st_size
    if size < end:
        raise RecordingError(
            f"{path} is damaged: it is truncated ({size:,} of {end:,} bytes); was it copied "
            "while being written, or did a transfer stop early?"
        )


def _run_info(f: h5py.File, path: Path) -> RunInfo:
    attrs = f.attrs
    if attrs.get("format") != schema.FORMAT:
        raise RecordingError(f"{path} is an HDF5 file but not a hookdbg recording")
    version = int(attrs.get("schema_version", 0))
    if version > schema.SCHEMA_VERSION:
        raise RecordingError(
            f"{path} was written by a newer hookdbg (schema version {version}; this one reads "
            f"up to {schema.SCHEMA_VERSION}): upgrade with `pip install -U hookdbg`"
        )
    if version < 1:
        raise RecordingError(f"{path} has an invalid schema version ({version})")
    try:
        return RunInfo(
            argv=json.loads(attrs["argv"]),
            created=str(attrs["created"]),
            host=str(attrs["host"]),
            pid=int(attrs["pid"]),
            cwd=str(attrs["cwd"]),
            hookdbg_version=str(attrs["hookdbg_version"]),
            torch_version=str(attrs["torch_version"]),
            python_version=str(attrs["python_version"]),
            options=json.loads(attrs["options"]),
            rank=int(attrs["rank"]),
            world_size=int(attrs["world_size"]),
            backend=str(attrs["backend"]),
            schema_version=version,
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise RecordingError(f"{path} is damaged: bad run metadata ({exc})") from None


def _check_table(f: h5py.File, name: str, dtype: np.dtype, path: Path) -> None:
    group = f.get(name)
    if not isinstance(group, h5py.Group):
        raise RecordingError(f"{path} is damaged: table {name!r} is missing")
    for column in dtype.names:
        ds = group.get(column)
        if not isinstance(ds, h5py.Dataset) or ds.ndim != 1:
            raise RecordingError(f"{path} is damaged: table {name!r} has no column {column!r}")
        if ds.dtype.kind != dtype[column].kind:
            raise RecordingError(
                f"{path} is damaged: column {name}/{column} has type {ds.dtype}, "
                f"expected {dtype[column]}"
            )
