"""One writer per recording: a file a live recorder writes is not truncated by another
(`record -f`, `hookdbg.record(force=True)`); once its writer is gone, it may be."""

from __future__ import annotations

import h5py
import pytest

import hookdbg
from hookdbg.read import open_recording
from hookdbg.recorder import RecordError
from hookdbg.store import owner
from tests.helpers import SAMPLES, live_recording
from tests.helpers import hookdbg as run_hookdbg


def test_a_recording_being_written_is_not_overwritten(tmp_path):
    path = tmp_path / "live.h5"
    with live_recording(path):
        assert owner.written_by_another(path)
        again = run_hookdbg("record", "-f", "-o", path, SAMPLES / "nan_blowup.py")
        assert again.returncode == 2
        assert "is being written by another recording that is still running" in again.stderr
        with pytest.raises(RecordError, match="being written by another"):
            hookdbg.record(path, force=True)
        with open_recording(path) as rec:
            assert len(rec.steps) > 0  # the live run's file, untouched
    # its writer was killed (-9): the lock went with it
    assert not owner.written_by_another(path)
    done = run_hookdbg("record", "-f", "-q", "-o", path, SAMPLES / "nan_blowup.py")
    assert done.returncode == 0, done.stderr


def test_a_recording_a_reader_holds_open_is_refused_in_words(tmp_path):
    """HDF5 locks a file its readers have open; `record -f` says so, not 'Resource
    temporarily unavailable'."""
    path = tmp_path / "run.h5"
    run = ("record", "-f", "-q", "-o", path, SAMPLES / "nan_blowup.py", "--steps", "2")
    assert run_hookdbg(*run).returncode == 0
    with h5py.File(path, "r"):  # a notebook's h5py, say
        held = run_hookdbg(*run)
    assert held.returncode == 2 and "another process has it open" in held.stderr


def test_a_file_nobody_writes_is_not_busy(tmp_path):
    plain = tmp_path / "plain.h5"
    plain.write_bytes(b"not written by anyone")
    assert not owner.written_by_another(plain)
    assert not owner.written_by_another(tmp_path / "missing.h5")
