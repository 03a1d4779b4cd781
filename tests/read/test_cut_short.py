"""A recording process killed while it creates the file: the reader says so, instead of
calling the file truncated by a copy."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hookdbg.read import RecordingError, open_recording
from tests.helpers import hookdbg, live_recording

# The real recorder, killed (SIGKILL, by itself) at a chosen step of creating its file.
KILLED_WHILE_CREATING = """
import os, signal, sys, h5py, hookdbg
where = sys.argv[2]
if where == "tables":  # half of the tables created (in memory)
    create_group = h5py.Group.create_group
    def dying(self, name, *args, **kwargs):
        if name == "tensors":
            os.kill(os.getpid(), signal.SIGKILL)
        return create_group(self, name, *args, **kwargs)
    h5py.Group.create_group = dying
elif where == "writing":  # half of the file's bytes on disk
    write = os.write
    def dying(fd, data):
        if len(data) > 10_000:
            write(fd, bytes(data[: len(data) // 2]))
            os.kill(os.getpid(), signal.SIGKILL)
        return write(fd, data)
    os.write = dying
else:  # every table created, about to switch to SWMR
    swmr = h5py.File.swmr_mode
    h5py.File.swmr_mode = property(swmr.fget, lambda self, on: os.kill(os.getpid(), signal.SIGKILL))
hookdbg.record(sys.argv[1], quiet=True).start()
"""

RECORDING_FOREVER = """
import sys, time, torch, hookdbg
model = torch.nn.Linear(4, 4)
with hookdbg.record(sys.argv[1], quiet=True), torch.no_grad():
    while True:
        model(torch.randn(2, 4))
        time.sleep(0.001)
"""


def test_killed_while_laying_out_the_file_leaves_nothing(tmp_path):
    """The file is laid out in memory and put on disk whole (store/newfile.py)."""
    path = tmp_path / "run.h5"
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_WHILE_CREATING, str(path), "tables"], timeout=120
    )
    assert proc.returncode == -signal.SIGKILL and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["writing", "swmr"])
def test_killed_while_creating_the_file(tmp_path, where):
    path = tmp_path / "run.h5"
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_WHILE_CREATING, str(path), where], timeout=120
    )
    assert proc.returncode == -signal.SIGKILL and path.exists()
    out = hookdbg("summary", path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "is still being created, or its recording process died as it started" in out.stderr
    minute_ago = time.time() - 60
    os.utime(path, (minute_ago, minute_ago))  # looked at later
    out = hookdbg("summary", path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert f"{path} was cut short while it was being created" in out.stderr
    assert "nothing was recorded in it" in out.stderr and "copied" not in out.stderr
    with pytest.raises(RecordingError, match="cut short while it was being created"):
        open_recording(path)


def test_killed_as_soon_as_the_file_appears(tmp_path):
    """As a user would meet it: a recorder SIGKILLed the moment its file exists. The
    reader reports a file the process died creating (or an empty one), never a copy."""
    for attempt in range(3):
        path = tmp_path / f"run{attempt}.h5"
        proc = subprocess.Popen([sys.executable, "-c", RECORDING_FOREVER, str(path)])
        try:
            deadline = time.time() + 120
            while not path.exists() and time.time() < deadline:
                time.sleep(0.0002)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        out = hookdbg("summary", path)
        assert "Traceback" not in out.stderr and "copied" not in out.stderr, out.stderr
        if out.returncode == 2:  # killed before the file was set up
            assert len(out.stderr.strip().splitlines()) == 1
            assert "being created" in out.stderr or "is empty (0 bytes)" in out.stderr
        else:  # the machine was fast enough for the recorder to finish creating it
            assert out.returncode == 0 and "was cut short" in out.stderr


def test_a_damaged_cut_short_recording_fails_fast(tmp_path):
    """A file its recorder never closed opens in SWMR mode, where HDF5 retries a metadata
    read that fails its checksum with doubling sleeps (its default never ends on a
    corrupt file). Damaged metadata there is one line within a second."""
    path = tmp_path / "live.h5"
    with live_recording(path):
        pass  # killed with -9 on leaving the block
    data = path.read_bytes()
    errors = []
    for at in range(6144, min(len(data), 16384), 1024):
        damaged = tmp_path / f"damaged{at}.h5"
        damaged.write_bytes(data[:at] + b"\xa5" * 8 + data[at + 8 :])
        start = time.perf_counter()
        try:
            with open_recording(damaged) as rec:
                rec.tensors(), rec.calls()
        except RecordingError as exc:
            errors.append(str(exc))
        assert time.perf_counter() - start < 5, (
            f"{damaged} took {time.perf_counter() - start:.1f} s"
        )
    assert any("checksum" in e for e in errors), errors
    out = hookdbg("summary", tmp_path / "damaged8192.h5", timeout=60)
    assert out.returncode in (0, 2) and "Traceback" not in out.stderr, out.stderr
