"""One writer per recording: a file a live recorder writes is not truncated by another
(`record -f`, `hookdbg.record(force=True)`); once its writer is gone, it may be."""

from __future__ import annotations

import subprocess
import sys

import h5py
import pytest

import hookdbg
from hookdbg.read import open_recording
from hookdbg.read.recording import Status
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


def test_a_recording_a_reader_holds_open_is_replaced_under_it(tmp_path):
    """`record -f` over a file a notebook's h5py has open: the new recording takes the
    name, the reader reads on in the old one, whole."""
    path = tmp_path / "run.h5"
    first = ("record", "-f", "-q", "-o", path, SAMPLES / "nan_blowup.py", "--steps", "2")
    assert run_hookdbg(*first).returncode == 0
    with h5py.File(path, "r"), path.open("rb") as old:
        before = old.read()
        again = run_hookdbg(*first[:-1], "3")
        assert again.returncode == 0, again.stderr
        old.seek(0)
        assert old.read() == before
    with open_recording(path) as rec:
        assert len(rec.steps) == 3


def test_a_symlinked_recording_replaces_its_target(tmp_path):
    target, link = tmp_path / "runs" / "a.h5", tmp_path / "latest.h5"
    target.parent.mkdir()
    target.write_bytes(b"an older file")
    link.symlink_to(target)
    run = ("record", "-f", "-q", "-o", link, SAMPLES / "nan_blowup.py", "--steps", "2")
    assert run_hookdbg(*run).returncode == 0
    assert link.is_symlink()
    with open_recording(target) as rec:
        assert len(rec.steps) == 2


# A reader opens the new file the moment it is on disk, before HDF5 opens it to write.
READER_IN_THE_GAP = """
import subprocess, sys, hookdbg
from hookdbg.store import newfile
put = newfile.put
def put_then_read(path, data):
    put(path, data)
    code = f"import h5py, time; f = h5py.File({str(path)!r}, 'r'); print('open', flush=True)"
    code += "; time.sleep(60)"
    reader = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert reader.stdout.readline().strip() == "open"
    readers.append(reader)
readers = []
newfile.put = put_then_read
import torch
model = torch.nn.Linear(4, 4)
with hookdbg.record(sys.argv[1], quiet=True):
    model(torch.randn(2, 4)).sum().backward()
readers[0].kill()
print("recorded")
"""


def test_a_reader_opening_the_new_file_before_its_recorder_does_keeps_nobody_out(tmp_path):
    path = tmp_path / "run.h5"
    out = subprocess.run(
        [sys.executable, "-c", READER_IN_THE_GAP, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.strip() == "recorded", out.stderr
    with open_recording(path) as rec:
        assert len(rec.calls_table) > 0 and rec.status is Status.COMPLETE


def test_a_file_nobody_writes_is_not_busy(tmp_path):
    plain = tmp_path / "plain.h5"
    plain.write_bytes(b"not written by anyone")
    assert not owner.written_by_another(plain)
    assert not owner.written_by_another(tmp_path / "missing.h5")
