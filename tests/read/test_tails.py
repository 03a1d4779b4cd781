"""Tables' tails: the rows after the last whole chunk, kept apart while a recording is
written (hookdbg/store/schema.py). A live reader and a reader of a cut-short file see
them as the tables' last rows; a file grows with its rows, not with its flushes; and a
damaged tail is refused in one line like any other damage."""

from __future__ import annotations

import os
import time
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from hookdbg.cli import cli
from hookdbg.options import RecordOptions
from hookdbg.read import Status, open_recording
from hookdbg.recorder.steps.meta import run_metadata
from hookdbg.store import schema
from hookdbg.store.writer import Writer
from tests.helpers import live_recording, tables

CALLS = list(schema.TABLES).index("calls")
STEP = (0, 0, 0, 0.0, 1.0, 3, 1, 1, 1, float("nan"), 0, 0.0)  # a steps row
END = {"time": 0.0, "status": "complete", "exit_code": 0, "steps": 0, "calls": 0, "alerts": 0}


def committed(path: Path) -> np.ndarray:
    with h5py.File(path, "r", swmr=True) as f:
        return f[schema.COMMITTED][()]


@pytest.fixture(scope="module")
def cut_short(tmp_path_factory) -> Path:
    """A real recording killed with -9 while its calls table's rows were all in its
    tail (fewer than a chunk)."""
    path = tmp_path_factory.mktemp("tails") / "killed.h5"
    with live_recording(path, pause=0.005, calls=200):  # slow: far from a chunk of calls
        pass
    state = committed(path)
    assert state[schema.SEALED, CALLS] == 0 and state[schema.TAIL_BYTES, CALLS] > 0
    return path


def test_a_live_reader_sees_the_rows_in_the_tails(tmp_path):
    path = tmp_path / "live.h5"
    with live_recording(path, pause=0.02, calls=20):  # slow: fewer rows than a chunk
        rec = open_recording(path)
        assert rec.status is Status.LIVE
        seen = len(rec.calls_table.read(["call"]))
        time.sleep(0.5)
        assert rec.refresh() and len(rec.calls_table) > seen >= 20
        steps = rec.calls_table.read(["step"])["step"]
        middle = int(steps[len(steps) // 2])
        tensors = rec.tensors(middle, middle)  # a step found by bisecting the tail
        assert len(tensors) > 0 and set(tensors["step"].tolist()) == {middle}
        rec.close()  # (HDF5 reads wrong chunks if a file open twice in a process refreshes)
        # the writer had sealed none of the rows read: they came from the tail
        assert committed(path)[schema.SEALED, CALLS] < seen


def test_a_cut_short_recording_reads_its_tails(cut_short):
    rec = open_recording(cut_short)
    assert rec.status is Status.CUT_SHORT
    calls = rec.calls_table.read(["call"])["call"]
    assert len(calls) >= 200 and len(calls) == len(tables(cut_short)["calls"])
    result = CliRunner().invoke(cli, ["summary", str(cut_short)])
    assert result.exit_code == 0, result.output
    assert "cut short" in result.stderr


def test_the_file_grows_with_its_rows_not_with_its_flushes(tmp_path):
    """The same 4,000 rows written in one flush and in 400: under SWMR a chunk
    rewritten at each flush would leave a copy behind each time."""
    rows = [(i, i, 0, float(i), i + 0.5, 3, 1, 1, 1, float("nan"), 0, 0.0) for i in range(4000)]
    sizes = {}
    for flushes in (1, 400):
        path = tmp_path / f"{flushes}.h5"
        writer = Writer(path, {"format": schema.FORMAT}, flush_interval=3600)
        for batch in np.array_split(np.arange(len(rows)), flushes):
            writer.submit({"steps": [rows[i] for i in batch]})
            assert writer.flush(timeout=30)
        sizes[flushes] = os.path.getsize(path)  # while live: the slots hold the tail
        writer.close({**END, "steps": len(rows)})
        assert len(tables(path)["steps"]) == len(rows)
    assert sizes[400] < 2 * sizes[1], sizes  # (a copy per flush: hundreds of times)


def test_a_closed_recording_holds_every_row_in_its_columns(tmp_path):
    path = tmp_path / "closed.h5"
    writer = Writer(path, {"format": schema.FORMAT}, flush_interval=3600)
    writer.submit({"steps": [STEP] * 10})
    assert writer.flush(timeout=30)
    writer.close({**END, "steps": 10})
    assert not committed(path)[schema.TAIL_BYTES].any()
    with h5py.File(path, "r") as f:
        assert f["steps/step"].shape == (10,)
        assert all(f["steps"][slot].shape == (0,) for slot in schema.TAIL_SLOTS)  # compacted


# -- damage: written into the file's bytes (a cut-short file cannot be opened r+) -----


def _write_at(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as raw:
        raw.seek(offset)
        raw.write(data)


def _set_committed(row: int, value: int):
    def mutate(path: Path) -> None:
        with h5py.File(path, "r", swmr=True) as f:
            ds = f[schema.COMMITTED]
            at = ds.id.get_offset() + 8 * (row * ds.shape[1] + CALLS)
        _write_at(path, at, np.int64(value).tobytes())

    return mutate


def _slot_bytes(data: bytes, nbytes: int | None = None):
    """The calls tail's slot starting with ``data``, and ``committed`` claiming
    ``nbytes`` of it (default: len(data))."""

    def mutate(path: Path) -> None:
        state = committed(path)
        with h5py.File(path, "r", swmr=True) as f:
            slot = f["calls"][schema.TAIL_SLOTS[state[schema.GENERATION, CALLS] % 3]]
            assert len(data) <= slot.chunks[0], "inside the slot's first chunk"
            at = slot.id.get_chunk_info(0).byte_offset
        _write_at(path, at, data)
        _set_committed(schema.TAIL_BYTES, len(data) if nbytes is None else nbytes)(path)

    return mutate


def _tail_rows(**values: object):
    """The calls tail rewritten as whole rows holding ``values``."""

    def mutate(path: Path) -> None:
        rows = np.zeros(3, dtype=schema.CALLS)
        for name, value in values.items():
            rows[name] = value
        _slot_bytes(zlib.compress(rows.tobytes()))(path)

    return mutate


DAMAGE = {
    "a negative generation": (_set_committed(schema.GENERATION, -7), "has generation -7"),
    "the tail claiming 10^12 bytes": (
        _set_committed(schema.TAIL_BYTES, 10**12),
        "claims 1,000,000,000,000 bytes",
    ),
    "a negative tail": (_set_committed(schema.TAIL_BYTES, -5), "-5 bytes"),
    "sealed rows beyond the columns": (
        _set_committed(schema.SEALED, 10**9),
        "its committed state 1,000,000,000",
    ),
    "garbage in the slot": (_slot_bytes(b"\xa5" * 4000), "does not inflate"),
    "a truncated stream": (_slot_bytes(zlib.compress(os.urandom(9000)), 4000), "whole rows"),
    "bytes after the stream": (_slot_bytes(zlib.compress(b"\0" * 96) + b"junk"), "whole rows"),
    "not whole rows": (_slot_bytes(zlib.compress(b"abc")), "whole rows"),
    "a zlib bomb": (_slot_bytes(zlib.compress(b"\0" * (12 << 20), 9)), "at most a chunk"),
    "an unknown phase": (_tail_rows(phase=99), "phase"),
}


@pytest.mark.parametrize("name", list(DAMAGE))
def test_a_damaged_tail_is_refused_in_one_line(cut_short, tmp_path, name):
    mutate, message = DAMAGE[name]
    path = tmp_path / "damaged.h5"
    path.write_bytes(cut_short.read_bytes())
    mutate(path)
    start = time.perf_counter()
    p = str(path)
    calls = ["export", p, "--format", "json", "--table", "calls", "-f", "-o", str(tmp_path / "c")]
    for args in (["summary", p], ["profile", p], calls):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        *notes, error = result.stderr.strip().splitlines()
        assert all("was cut short" in n for n in notes), notes  # refused when read
        assert error.startswith("Error: ") and message in error, (name, error)
    assert time.perf_counter() - start < 10  # the bomb is not inflated


# -- several readers, one snapshot, the end -------------------------------------------


def test_two_readers_of_one_live_file_read_the_same_rows(tmp_path):
    """A notebook cell opening a live recording again: HDF5 reads wrong chunks from a
    dataset opened twice once one handle is refreshed, so the readers share them."""
    path = tmp_path / "live.h5"
    chunk = schema.TABLES["tensors"][1]
    with live_recording(path, calls=1000):
        a = open_recording(path)
        time.sleep(2)  # rows come that ``a`` has not looked for
        b = open_recording(path)  # sees them, though it shares ``a``'s handles
        assert len(b.tensors_table) > len(a.tensors_table)
        seen, deadline = len(a.tensors_table), time.time() + 90
        while len(b.tensors_table) < seen + 2 * chunk:  # a chunk sealed after a opened
            assert time.time() < deadline, "the writer wrote no chunk of rows"
            time.sleep(0.2)
            b.refresh()
        assert a.refresh()
        a.close()  # one reader closed: the other reads on
        b.refresh()
        steps = b.tensors_table.read(["step"])["step"]
        assert len(steps) > chunk and (np.diff(steps) >= 0).all(), "rows out of order"
        for step in (int(steps[chunk // 2]), int(steps[-chunk // 2])):
            assert set(b.tensors(step, step)["step"].tolist()) == {step}
        b.close()


def test_a_reader_sees_every_table_as_of_one_moment(tmp_path):
    """Each refresh of a live file shows whole steps: every finished step has all its
    calls (3 modules forward and backward, the loss site, the optimizer), whichever
    flush it was read in."""
    path = tmp_path / "live.h5"
    with live_recording(path, pause=0.002, calls=20):
        rec = open_recording(path)
        for _ in range(40):
            time.sleep(0.03)
            rec.refresh()
            finished = rec.segments["segment"] != rec.unfinished
            steps = rec.segments["step"][finished]
            calls = rec.calls_table.read(["step"])["step"]
            counts = np.bincount(calls, minlength=int(steps.max()) + 1)[steps]
            assert (counts == 8).all(), f"a finished step without all its calls: {counts}"
        rec.close()


def test_a_follower_sees_the_end_when_closing_adds_no_rows(tmp_path):
    """A writer that closes with every row already committed adds no row: the end row,
    written in place, is what says the recording ended."""
    path = tmp_path / "closed.h5"
    writer = Writer(path, run_metadata(["train.py"], RecordOptions()), flush_interval=3600)
    writer.submit({"steps": [STEP]})
    assert writer.flush(timeout=30)
    rec = open_recording(path)
    assert rec.status is Status.LIVE and len(rec.steps) == 1
    writer.close({**END, "steps": 1})
    assert rec.refresh(), "the end is news"
    assert rec.status is Status.COMPLETE and len(rec.steps) == 1
    rec.close()


def test_readers_opened_one_after_another_on_a_live_file_never_call_it_damaged(tmp_path):
    """Readers of one live file in one process share its column handles; a reader
    opened later reads a newer committed state than the lengths those handles last
    saw, and must look again rather than call the file damaged."""
    path = tmp_path / "live.h5"
    opened: list = []
    with live_recording(path):
        deadline = time.time() + 12
        while time.time() < deadline:
            rec = open_recording(path)  # raises RecordingError if it calls it damaged
            assert len(rec.tensors_table) >= 0
            opened.append(rec)
            if len(opened) > 3:  # earlier readers stay open: their handles are shared
                opened.pop(0).close()
    for rec in opened:
        rec.close()
    assert len(opened) == 3
