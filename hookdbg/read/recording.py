"""``open_recording``: the one way everything in hookdbg reads a recording.

It validates before it trusts (hookdbg/read/checks.py, runinfo.py): is the file there,
is it whole HDF5, is it a hookdbg recording, is its schema one this version
understands, is every attribute of the right type; is every column of a table of the
right type and shape, inside this file and no longer than its bytes can hold (checked
as the table is first read: a closed file does not change); and was it closed
(complete), is it still being written (live), or was it cut short by a crash. Every
failure, at open or in a later read, is a ``RecordingError`` with one line that says
what is wrong. Files are opened read-only with SWMR, so reading never writes, works
while the recorder is running, and works after a ``kill -9``.

It stays one module of about 700 lines on purpose: ``Recording`` is the reader's one
class, and its views share the open file's checked tables; splitting it would spread
one class over several files.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Callable, Iterable
from enum import Enum
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, cast

import h5py
import numpy as np

from hookdbg.read.captures import Capture, captures_from, to_array
from hookdbg.read.checks import (
    RecordingError,
    check_module_rows,
    checked_capture_data,
    checked_columns,
    checked_committed,
    checked_groups,
    close_file,
    open_file,
    read_or_fail,
)
from hookdbg.read.histograms import checked_histograms, histogram_dtype
from hookdbg.read.modules import ModuleTable
from hookdbg.read.resolve import read_rows, resolve
from hookdbg.read.runinfo import RunInfo, run_info
from hookdbg.read.shards import Place, Shard, shard_places
from hookdbg.read.small import read_small
from hookdbg.read.table import Table
from hookdbg.read.tails import TableState, Tails
from hookdbg.store import schema, summary
from hookdbg.store.retention import KEPT
from hookdbg.text import utf8

if TYPE_CHECKING:  # pandas is optional: to_pandas imports it
    import pandas as pd  # type: ignore[import-untyped, unused-ignore]

__all__ = ["Recording", "RecordingError", "RunInfo", "Status", "open_recording"]

# A live recorder appends a progress row every flush interval; this much silence
# (or a dead pid on this host) means the recording was cut short.
_SILENCE = 10.0
_MAX_FACTS = 4096  # info rows read from the start, and again from the end


Derived = dict[str, dict[str, str | float | bytes]]

# Columns older schema versions did not have, by the version that added them, and what
# they were then: in version 1 each segment was a step of its own and the end row was
# appended (no write errors recorded); before version 3 no GradScaler was noticed;
# before version 7 no module's source was recorded.
_ADDED: dict[int, Derived] = {
    2: {
        "calls": {"segment": "step"},
        "tensors": {"segment": "step"},
        "alerts": {"segment": "step"},
        "captures": {"segment": "step"},
        "steps": {"segment": "step", "kind": int(schema.StepKind.TRAIN)},
        schema.END_TABLE: {"write_failed": math.nan, "write_error": b""},
    },
    3: {"steps": {"scale": math.nan, "skipped": 0}},
    4: {"steps": {"overhead": math.nan}},
    7: {"modules": {"file": b"", "line": 0}},
}
SOURCES = 7  # the version from which modules hold their source (file and line)
# Tables older schema versions did not have, by the version that added them: read as empty.
_ADDED_TABLES: dict[int, tuple[str, ...]] = {4: ("losses", "shards"), 6: ("device_times",)}
# the tables a closed file's copy of its small tables holds whole (hookdbg/read/small.py)
_COPIED = frozenset({*schema.SMALL_TABLES, schema.END_TABLE})
_TAILS = 5  # the version from which a table's last rows may be kept apart (its tail)


def _tables_of(version: int) -> list[str]:
    """The tables a recording of this schema version has (the end row's included)."""
    missing = {t for added, tables in _ADDED_TABLES.items() if version < added for t in tables}
    return [name for name in [*schema.TABLES, schema.END_TABLE] if name not in missing]


def _derived(version: int) -> Derived:
    """The columns a recording of this schema version lacks, with their values: those
    of ``_ADDED``, and the summary fields added since (hookdbg/store/summary.py), which
    read as not measured."""
    out: Derived = {}
    for added, tables in _ADDED.items():
        if version < added:
            for table, columns in tables.items():
                out.setdefault(table, {}).update(columns)
    fields = summary.missing_since(version)
    if fields:
        out.setdefault("tensors", {}).update(fields)
    return out


def _row_dtypes(
    dtypes: dict[str, np.dtype],
    derived: Derived,
    optional: dict[str, dict[str, tuple[h5py.Dataset, np.dtype]]],
) -> dict[str, np.dtype]:
    """Each table's rows as the file's writer kept them together (a tail's, the copy of
    the small tables): the columns the file's version has, and the optional ones (a
    histogram)."""
    rows = {}
    for table, dtype in dtypes.items():
        lacks = derived.get(table) or {}
        extra = optional.get(table) or {}
        rows[table] = np.dtype(
            [
                *((n, dtype[n]) for n in dtype.names or () if n not in lacks),
                *((n, (d.base, d.shape)) for n, (_, d) in extra.items()),
            ]
        )
    return rows


def _one_row_per_step(rows: np.ndarray) -> np.ndarray:
    """Training segments as steps: a step interrupted before its optimizer step (by
    validation during gradient accumulation) is two segments with one number; they
    become one row whose ``start``..``end`` spans the time spent training, not the
    eval batches between (``end`` is ``start`` plus the segments' durations)."""
    steps = rows["step"]
    if len(steps) < 2 or np.all(steps[1:] != steps[:-1]):
        return rows
    first = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])
    out = rows[first].copy()
    for name, reduce in (
        ("calls", np.add),
        ("optimizer_steps", np.add),
        ("skipped", np.add),
        ("backward", np.maximum),
        ("recorded", np.maximum),
        ("overhead", np.add),
    ):
        out[name] = reduce.reduceat(rows[name], first)
    out["end"] = out["start"] + np.add.reduceat(rows["end"] - rows["start"], first)
    return out


def _optional_columns(
    f: h5py.File, path: Path
) -> dict[str, dict[str, tuple[h5py.Dataset, np.dtype]]]:
    """Columns some recordings have, by table: the histograms of ``--histograms``."""
    column = checked_histograms(f, path)
    if column is None:
        return {}
    return {"tensors": {schema.HISTOGRAM: (column, histogram_dtype(column))}}


class Status(Enum):
    COMPLETE = "complete"  # closed by the recorder: has its end row
    LIVE = "live"  # still being written
    CUT_SHORT = "cut short"  # the recording process died (crash, kill -9, power)
    # hookdbg stopped recording (an internal error, or writing failed: a full disk)
    # while the script went on: what ran after is not in the file (``failure`` says why)
    FAILED = "failed"


def _answer(value: str) -> tuple[int, float, str]:
    """``'3 1796157369.25: recording steps 10-14 at stats'`` -> (3, 1796157369.25,
    'recording steps 10-14 at stats'): the command's number and time (NaN where the
    answer does not give it); a value that is not one reads as number -1."""
    head, sep, text = value.partition(": ")
    number, _, sent = head.partition(" ")
    if not sep or not number.isdigit():
        return -1, math.nan, value
    try:
        return int(number), float(sent) if sent else math.nan, text
    except ValueError:
        return -1, math.nan, value


def open_recording(path: str | os.PathLike[str]) -> Recording:
    """Open and validate a recording; raises ``RecordingError`` with a one-line reason."""
    return Recording(Path(path))


class Recording:
    """A validated, read-only view of one recording. Small tables (steps, alerts, the
    end row) are read at open, modules and captures when first asked for; ``calls`` and
    ``tensors`` are read lazily, by column. A file its recorder closed normally gives
    its small tables from the one copy it keeps of them (hookdbg/read/small.py)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file, _ = open_file(path)
        self._closed = False
        self._retired: list[h5py.File] = []  # files the path named before (_replaced)
        opened = os.fstat(self._file.id.get_vfd_handle())
        self._identity = (opened.st_dev, opened.st_ino)
        try:
            self.info = run_info(self._file, path)
            version = self.info.schema_version
            derived = _derived(version)
            known = {name: dtype for name, (dtype, _) in schema.TABLES.items()}
            known[schema.END_TABLE] = schema.END
            dtypes = {name: known[name] for name in _tables_of(version)}
            groups = checked_groups(self._file, path, dtypes)
            tails = version >= _TAILS  # rows after the last whole chunk, kept apart
            self._committed = checked_committed(
                self._file, path, len([n for n in dtypes if n in schema.TABLES]), tails
            )
            optional = _optional_columns(self._file, path)
            rows = _row_dtypes(dtypes, derived, optional)
            self._tails = self._tail_reader(groups, rows) if tails else None
            states = self._snapshot()
            live = self._file.swmr_mode
            small = None
            if self._tails is not None and not live:
                small = read_small(self._file, path, groups[schema.END_TABLE], states, rows)
            # the last progress row, from the copy (its other rows are in no report)
            self._progress_copied = None if small is None else small.part("progress")
            self._tables = {
                n: Table(
                    n,
                    partial(checked_columns, groups[n], n, dtypes[n], path, derived.get(n, {})),
                    dtypes[n],
                    path,
                    derived.get(n),
                    None if tails else self._committed_length(n),
                    optional.get(n),
                    states.get(n),
                    swmr=live,
                    held=partial(small.part, n) if small is not None and n in _COPIED else None,
                )
                for n in dtypes
            }
            self._capture_data: h5py.Dataset | None = None
            if live:
                # a file being written (or cut short) changes under the reader: it is
                # checked whole at once; a closed one's tables when first used
                self.check()
            self._load_small(self._progress_copied)
        except BaseException:
            close_file(self._file)
            raise

    # -- lifecycle ------------------------------------------------------------------

    def check(self) -> None:
        """Check every table and the stored tensors' bytes now, rather than as each is
        first read: for a reader that will read them all (the TUI) and should refuse a
        damaged file before it starts. The columns of tables read from the copy of the
        small tables too, and that they hold what it holds."""
        for table in self._tables.values():
            table.check(stored=True)
        copied = self._progress_copied
        if copied is not None:
            progress = self._tables["progress"]
            n = len(progress)
            if progress.read(rows=slice(max(n - 1, 0), n)).tobytes() != copied.tobytes():
                raise RecordingError(
                    f"{self.path} is damaged: its last progress row is not the one its copy "
                    "among the small tables holds"
                )
            self._progress_copied = None  # compared
        self._captured_bytes()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            for f in [*self._retired, self._file]:
                close_file(f)
            self._retired = []

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _committed_length(self, table: str) -> Callable[[], int] | None:
        """How many rows of ``table`` the writer vouched for (None: no limit, as in
        schema-1 files and the end row): rows past it were half written when writing
        stopped."""
        committed = self._committed
        if committed is None or table not in schema.TABLES:
            return None
        index = list(schema.TABLES).index(table)
        return lambda: int(read_or_fail(self.path, schema.COMMITTED, lambda: committed[index]))

    def _tail_reader(
        self, groups: dict[str, h5py.Group], rows: dict[str, np.dtype]
    ) -> Tails | None:
        """What reads the tables' tails (the end row has none)."""
        if self._committed is None:
            return None
        appended = {table: dtype for table, dtype in rows.items() if table in schema.TABLES}
        return Tails(self._file, self.path, self._committed, appended, groups)

    def _snapshot(self) -> dict[str, TableState]:
        """Every table's rows in its columns and its tail, as of one commit ({} before
        version 5: the tables read their committed lengths themselves)."""
        if self._tails is None:
            return {}
        sealed, tails = self._tails.snapshot()
        return {table: (sealed[table], tails[table]) for table in sealed}

    def refresh(self) -> bool:
        """Pick up what a live recorder wrote since; True if anything is new."""
        if not self._file.swmr_mode:
            return False  # a file closed by its writer does not change
        if self._replaced():
            return True
        if self._committed is not None:
            read_or_fail(self.path, schema.COMMITTED, self._committed.refresh)
        states = self._snapshot()
        new = False
        for name, table in self._tables.items():
            new = table.refresh(states.get(name)) or new
        # closing adds no row where the last ones were already in the tails: the end
        # row, written in place, says the recording ended
        ended = self.end is None and self._ended()
        if new or ended:
            self._load_small()
        return new or ended

    def answers_from(self, row: int) -> tuple[list[tuple[float, int, float, str]], int]:
        """The answers to steering commands in the ``info`` rows from ``row`` on, as far
        as this reader has refreshed (``answers`` holds the first and last ones only:
        a flood of commands leaves more rows than a report reads), and the row to go
        on from: (time answered, command number, time the command was sent, answer)."""
        table = self._tables["info"]
        end = len(table)
        rows = table.read(rows=slice(min(row, end), end))
        found = [(float(r["time"]), *_answer(utf8(r["value"]))) for r in rows if r["key"] == b"ctl"]
        return found, max(row, end)

    def _replaced(self) -> bool:
        """The file at the path is another than the one open: the writer replaced it
        (``--keep-last`` wrote it anew without older detail; a closed file compacted).
        Then this recording reads the new one from now on."""
        try:
            now = os.stat(self.path)
        except OSError:
            return False  # removed: what is open stays readable
        if (now.st_dev, now.st_ino) == self._identity:
            return False
        try:
            fresh = Recording(self.path)
        except RecordingError:
            return False  # not readable yet: looked at again at the next refresh
        # the old file stays open until close(): other threads may be reading it now
        # (the TUI's workers); the one before it is done with by now
        retired = [*self._retired[-1:], self._file]
        for old in self._retired[:-1]:
            close_file(old)
        self.__dict__.update(fresh.__dict__)
        self._retired = retired
        return True

    def _ended(self) -> bool:
        end = self._tables[schema.END_TABLE].read(rows=slice(0, 1))
        return bool(len(end) and end["status"].any())

    def _load_small(self, last_progress: np.ndarray | None = None) -> None:
        """The small tables, read whole: all but progress (only its last row matters,
        and a damaged file may claim 10^8 of them; ``last_progress``: it, from the copy
        of the small tables), end (one row) and info (bounded)."""
        t = self._tables
        info = t["info"]
        # a run learns a handful of facts, but a flood of steering commands leaves a
        # row for each: the first rows and the last are read (a fact said late, as
        # why recording failed, is among the last)
        facts = info.read(rows=slice(0, _MAX_FACTS))
        self.info_rows = len(info)
        self.facts_cut = self.info_rows > 2 * _MAX_FACTS
        if self.info_rows > _MAX_FACTS:
            later = info.read(rows=slice(max(self.info_rows - _MAX_FACTS, _MAX_FACTS), None))
            facts = np.concatenate([facts, later])
        self.facts = {utf8(r["key"]): utf8(r["value"]) for r in facts}
        self.compiled = [utf8(r["value"]) for r in facts if r["key"] == b"compiled"]
        # the op and line each origin was made by, or that they were not found
        # (recorder/alerts/pinpoint.py), by the alert's place: step, module, phase,
        # slot, path
        self.op_origins = _op_origins(utf8(r["value"]) for r in facts if r["key"] == b"op_origin")
        # outputs that neared their dtype's largest finite value, in the order said
        # (recorder/alerts/headroom.py): each a JSON object whose ``text`` says it
        self.headroom = _objects(utf8(r["value"]) for r in facts if r["key"] == b"headroom")
        # steps recorded at stats because the sentinel saw a NaN/inf where nothing was
        # checked (recorder/alerts/sentinel.py, --on-nan record), in order
        self.zooms = _objects(utf8(r["value"]) for r in facts if r["key"] == b"zoom")
        # what steering commands did (hookdbg ctl): (time, command number, answer), of
        # the rows read (``facts_cut``: not all were)
        self.answers = [
            (float(r["time"]), seq, text)
            for r in facts
            if r["key"] == b"ctl"
            for seq, _, text in [_answer(utf8(r["value"]))]
        ]
        # what the recorder said of the control file itself (refused it, bad lines)
        self.channel_notes = [
            (float(r["time"]), utf8(r["value"])) for r in facts if r["key"] == b"ctl_channel"
        ]
        # read when first asked for: a distributed run's summary needs neither of most ranks
        self._modules: tuple[np.ndarray, ModuleTable] | None = None
        self._captures: tuple[np.ndarray, list[Capture]] | None = None
        ends = t[schema.END_TABLE].read(rows=slice(0, 1))
        # the end row: its status is empty until the recorder closed the file, but it
        # may say before that that writing stopped (disk full), and why
        self.end_record = ends[0] if len(ends) else None
        self.end = self.end_record if ends["status"].any() else None
        ended = t["steps"].read()
        # a recorder that closed the file normally ended every segment it began
        complete = self.end is not None and self.end["status"] == b"complete"
        unfinished = None if complete else self._unfinished_segment(ended)
        # training steps and eval batches, in order; the last one may still be running
        # (live) or have been cut short (a crash): then ``unfinished`` is its id
        self.unfinished = None if unfinished is None else int(unfinished["segment"])
        self.segments = ended if unfinished is None else np.concatenate([ended, [unfinished]])
        self.kept_from, self.dropped = self._kept(self.segments)
        training = self.segments["kind"] == schema.StepKind.TRAIN
        self.steps = _one_row_per_step(self.segments if training.all() else self.segments[training])
        self.evals = self.segments[~training]
        # segment ids in order, their rows, each row's eval batch number (segment_label)
        self._labels: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._losses: np.ndarray | None = None
        self._shards: dict[Place, Shard] | None = None
        self.alerts = t["alerts"].read()
        if last_progress is None:
            n = len(t["progress"])
            last_progress = t["progress"].read(rows=slice(max(n - 1, 0), n))
        self.last_progress = last_progress[-1] if len(last_progress) else None

    @property
    def modules(self) -> ModuleTable:
        return self._module_table()[1]

    @property
    def module_rows(self) -> np.ndarray:
        return self._module_table()[0]

    def _module_table(self) -> tuple[np.ndarray, ModuleTable]:
        if self._modules is None:
            rows = self._tables["modules"].read()
            check_module_rows(rows, self.path)
            self._modules = rows, ModuleTable(rows, sources=self.info.schema_version >= SOURCES)
        return self._modules

    @property
    def captures(self) -> np.ndarray:
        """The rows of the full tensors stored (``captured`` gives them as objects)."""
        return self._capture_rows()[0]

    @property
    def _stored(self) -> list[Capture]:
        return self._capture_rows()[1]

    def _capture_rows(self) -> tuple[np.ndarray, list[Capture]]:
        if self._captures is None:
            rows = self._tables["captures"].read()
            self._captures = rows, captures_from(rows, self.modules, self.path)
        return self._captures

    def _current(self, capture: Capture) -> Capture:
        def key(c: Capture) -> tuple:
            return (c.segment, c.call, c.module.id, c.phase, c.slot, c.path, c.reason)

        found = next((c for c in self._stored if key(c) == key(capture)), None)
        if found is None:
            raise RecordingError(
                f"{self.path} no longer holds {capture.module.name} {capture.label} of step "
                f"{capture.step}: --keep-last kept the detail of later steps only"
            )
        return found

    def _kept(self, segments: np.ndarray) -> tuple[int, int]:
        """Under ``--keep-last``, the segment the detail starts at, and how many recorded
        segments before it had theirs dropped: those read as not recorded ((0, 0): all
        kept)."""
        text = self.facts.get(KEPT)
        if text is None:
            return 0, 0
        if not text.isdigit():
            raise RecordingError(f"{self.path} is damaged: its info {KEPT!r} is {text[:40]!r}")
        first = int(text)
        before = (segments["segment"] < first) & (segments["recorded"] == 1)
        segments["recorded"][before] = 0
        return first, int(before.sum())

    def _unfinished_segment(self, ended: np.ndarray) -> np.void | None:
        """A steps row for the segment whose calls are in the file but whose own row is
        not (the recorder writes it when the segment ends): the step a live run is in,
        or the one a crash cut short. Training if an optimizer stepped in it, else like
        the segment before it."""
        calls = self._tables["calls"]
        n = len(calls)
        last = int(ended["segment"][-1]) if len(ended) else -1
        if not n or int(calls.column("segment", slice(n - 1, n))[0]) <= last:
            return None  # the last call's segment has its row
        since = int(ended["step"][-1]) if len(ended) else -(2**31)
        tail = calls.read(
            ["step", "segment", "phase", "start", "total"], calls.step_rows(since, 2**31 - 1)
        )
        tail = tail[tail["segment"] > last]
        if not len(tail):
            return None
        tail = tail[tail["segment"] == tail["segment"].min()]
        row = np.zeros((), dtype=schema.STEPS)
        row["step"], row["segment"] = tail["step"][0], tail["segment"][0]
        opt = int(np.count_nonzero(tail["phase"] == schema.Phase.OPT))
        before = ended["kind"][-1] if len(ended) else schema.StepKind.TRAIN
        row["kind"] = schema.StepKind.TRAIN if opt else before
        row["start"] = tail["start"].min()
        row["end"] = (tail["start"] + tail["total"]).max()
        row["calls"] = int(np.count_nonzero(tail["phase"] == schema.Phase.FWD))
        row["optimizer_steps"] = opt
        row["recorded"] = 1
        row["scale"] = math.nan  # known when the step ends
        row["overhead"] = math.nan
        return cast(np.void, row[()])  # a 0-d structured array indexed by () is its record

    # -- what is in it --------------------------------------------------------------

    @property
    def calls_table(self) -> Table:
        return self._tables["calls"]

    @property
    def tensors_table(self) -> Table:
        return self._tables["tensors"]

    @property
    def shards(self) -> dict[Place, Shard]:
        """Where the tensors that were DTensors lie: (module, phase, slot, path) -> their
        placement on the device mesh (hookdbg/read/shards.py); empty without any."""
        if self._shards is None:
            table = self._tables.get("shards")
            self._shards = {} if table is None else shard_places(table.read())
        return self._shards

    @property
    def losses(self) -> np.ndarray:
        """One row per backward pass: the loss it started from (schema.LOSSES), in the
        order they ran; empty in a recording made before losses were recorded."""
        if self._losses is None:
            table = self._tables.get("losses")
            self._losses = np.zeros(0, schema.LOSSES) if table is None else table.read()
        return self._losses

    @property
    def histogram_bins(self) -> int:
        """Bins of the value histogram kept per tensor row (0: recorded without
        ``--histograms``); read them as ``tensors(columns=[..., "histogram"])``."""
        optional = self._tables["tensors"].optional.get(schema.HISTOGRAM)
        return 0 if optional is None else int(optional.shape[0])

    @property
    def status(self) -> Status:
        if self.failure is not None:
            return Status.FAILED
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
    def failure(self) -> str | None:
        """Why recording stopped while the script went on, if it did: an internal error
        (said as soon as it happened, and at the end with what ran unrecorded after it),
        or writing that failed (a full disk)."""
        end = self.end
        if end is not None and end["status"] == b"failed":
            return utf8(end["message"])
        if "failed" in self.facts:
            return self.facts["failed"]
        if self.write_error is not None:
            return f"writing stopped: {self.write_error}"
        return None

    @property
    def backend(self) -> str:
        """The torch.distributed backend, once the script had set one up ('' if never)."""
        return self.facts.get("backend", self.info.backend)

    @property
    def dropped_rows(self) -> int:
        """Rows the recorder could not write (the disk fell behind, or failed)."""
        counts = [int(self.last_progress["dropped"])] if self.last_progress is not None else [0]
        if self.end_record is not None:
            counts.append(int(self.end_record["dropped"]))
        return max(counts)

    @property
    def write_error(self) -> str | None:
        """Why writing stopped before the recording ended (disk full...), if it did."""
        record = self.end_record
        if record is None or not record["write_error"]:
            return None
        return utf8(record["write_error"])

    @property
    def write_failed_at(self) -> float | None:
        """When writing stopped, in seconds since the epoch (None if it never did)."""
        record = self.end_record
        if record is None or not math.isfinite(float(record["write_failed"])):
            return None
        return float(record["write_failed"])

    @property
    def recorded_steps(self) -> np.ndarray:
        return self.steps["step"][self.steps["recorded"] == 1]

    def zoom_text(self, zoom: dict) -> str:
        """What a ``zoom`` row asked for, and how many of its steps were recorded."""
        first, last = zoom.get("first"), zoom.get("last")
        if not (isinstance(first, int) and isinstance(last, int) and "found" in zoom):
            return str(zoom["text"])
        done = int(((self.recorded_steps >= first) & (self.recorded_steps <= last)).sum())
        span = f"step {first}" if first == last else f"steps {first}-{last}"
        return f"{span} asked at stats after the {zoom['found']}: {done} recorded"

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

    def segment_label(self, segment: int) -> str:
        """'step 3' or 'eval batch 2': how reports name the segment a row belongs to
        (found by binary search: a long run has millions of segments, a report names a
        few of them)."""
        if self._labels is None:
            segments = self.segments
            order = np.argsort(segments["segment"], kind="stable")
            evals = np.cumsum(segments["kind"] == schema.StepKind.EVAL) - 1
            self._labels = (segments["segment"][order], order, evals)
        ids, order, evals = self._labels
        # a segment id written twice (a damaged file) names its last row
        i = int(np.searchsorted(ids, segment, side="right")) - 1
        if i < 0 or ids[i] != segment:
            return ""
        row = self.segments[order[i]]
        if row["kind"] == schema.StepKind.EVAL:
            return f"eval batch {int(evals[order[i]])}"
        return f"step {int(row['step'])}"

    def is_eval(self, segments: np.ndarray) -> np.ndarray:
        """Which of these segment ids are eval batches (a segment still being recorded
        counts as training until it ends)."""
        return np.isin(segments, self.evals["segment"])

    def segment_range(self, first: int | None = None, last: int | None = None) -> tuple[int, int]:
        """Like ``step_range``, over training steps and eval batches alike (an eval batch
        after the last training step has that step's number plus one)."""
        recorded = self.segments["step"][self.segments["recorded"] == 1]
        if len(recorded) == 0:
            return (0, -1)
        lo = int(recorded.min()) if first is None else max(first, int(recorded.min()))
        hi = int(recorded.max()) if last is None else min(last, int(recorded.max()))
        return lo, hi

    def calls(
        self,
        first: int | None = None,
        last: int | None = None,
        columns: list[str] | None = None,
        kind: schema.StepKind | None = schema.StepKind.TRAIN,
    ) -> np.ndarray:
        """Call rows of steps ``first``..``last`` (default: all) of training steps, or of
        eval batches (``kind=EVAL``, by the step they came after), or both (None)."""
        return self._rows("calls", first, last, columns, kind)

    def device_times(
        self,
        first: int | None = None,
        last: int | None = None,
        kind: schema.StepKind | None = schema.StepKind.TRAIN,
    ) -> np.ndarray:
        """Device times of the calls of steps ``first``..``last`` (schema.DEVICE_TIMES:
        one row per call and phase timed on a CUDA device, joined to ``calls`` by call
        and phase); empty where none was (a model on the CPU, an older recording)."""
        if "device_times" not in self._tables:
            return np.zeros(0, schema.DEVICE_TIMES)
        return self._rows("device_times", first, last, None, kind)

    def tensors(
        self,
        first: int | None = None,
        last: int | None = None,
        columns: list[str] | None = None,
        kind: schema.StepKind | None = schema.StepKind.TRAIN,
    ) -> np.ndarray:
        """Tensor summary rows of steps ``first``..``last``; ``kind`` as for ``calls``."""
        return self._rows("tensors", first, last, columns, kind)

    def _rows(
        self,
        table: str,
        first: int | None,
        last: int | None,
        columns: list[str] | None,
        kind: schema.StepKind | None,
    ) -> np.ndarray:
        t = self._tables[table]
        if first is None and last is None:
            span = slice(None)
        else:
            lo = -(2**31) if first is None else first
            hi = 2**31 - 1 if last is None else last
            span = t.step_rows(lo, hi)
        rows = t.read(columns, span)
        if kind is None or (kind == schema.StepKind.TRAIN and not len(self.evals)):
            return rows
        evals = self.is_eval(t.column("segment", span))
        return rows[evals if kind == schema.StepKind.EVAL else ~evals]

    def to_pandas(
        self,
        table: str,
        first: int | None = None,
        last: int | None = None,
        columns: list[str] | None = None,
    ) -> pd.DataFrame:
        """One table (tensors, calls, steps, alerts, modules or losses) as a pandas DataFrame,
        with names and labels in place of ids and codes: module name and type, phase,
        slot, what each row belongs to (``of``: 'step 3' or 'eval batch 0', and ``kind``
        train or eval). Steps ``first``..``last`` only, if given (eval batches by the
        step they came after); ``columns``: only these stored columns (a long run's
        tensors table is large). Needs pandas (``pip install 'hookdbg[pandas]'``)."""
        return resolve(self, table, read_rows(self, table, first, last, columns)).to_pandas()

    def captured(self, module: int | None = None, step: int | None = None) -> list[Capture]:
        """Stored full tensors, optionally of one module (id) and/or one step."""
        return [
            c
            for c in self._stored
            if (module is None or c.module.id == module) and (step is None or c.step == step)
        ]

    def tensor(self, capture: Capture) -> np.ndarray:
        """The values of a stored tensor (found again if the file was written anew since
        ``capture`` was read: ``--keep-last`` moves the bytes it keeps)."""
        capture = self._current(capture)
        ds = self._captured_bytes()
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

    def _captured_bytes(self) -> h5py.Dataset:
        """The flat bytes stored tensors are read from, checked when first needed."""
        if self._capture_data is None:
            self._capture_data = checked_capture_data(self._file, self.path)
        return self._capture_data


def _objects(values: Iterable[str]) -> list[dict]:
    """Info rows that are JSON objects saying something in ``text`` (a row that is not,
    from a damaged or foreign file, is left out)."""
    found = []
    for value in values:
        try:
            row = json.loads(value)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("text"), str):
            found.append(row)
    return found


def _op_origins(values: Iterable[str]) -> dict[tuple, dict]:
    """``op_origin`` info rows by their alert's place."""
    found: dict[tuple, dict] = {}
    for row in _objects(values):
        key = row.get("alert")
        if isinstance(key, list) and len(key) == 5:
            found.setdefault(tuple(key), row)
    return found
