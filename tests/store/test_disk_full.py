"""A recording started on a disk that is nearly full: refused in one line before the
script runs, or recorded until the disk fills while training goes on; never a
traceback, a crash, or a half-made file left behind.

The disk is real: a 20 MB tmpfs filled (``posix_fallocate``) to leave a few kB free.
Mounting one needs root; elsewhere those tests are skipped, saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hookdbg.store import newfile, schema
from hookdbg.store.writer import Writer, WriterError
from tests.helpers import hookdbg

TRAIN = """
import pathlib, sys, torch
pathlib.Path(sys.argv[1]).write_text("ran")
model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(8)])
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for _ in range({steps}):
    opt.zero_grad()
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
print("trained")
"""

API = """
import sys, hookdbg
try:
    hookdbg.record(sys.argv[1]).start()
except hookdbg.RecordError as exc:
    print(f"refused: {exc}")
"""


class SmallDisk:
    """A 20 MB tmpfs at ``root``, filled to leave ``leave(kb)`` kB free (whole 4 kB
    pages)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def leave(self, kb: int) -> Path:
        for item in self.root.iterdir():
            item.unlink()
        fs = os.statvfs(self.root)
        fill = fs.f_bavail * fs.f_frsize - kb * 1024
        fd = os.open(self.root / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, fill)
        finally:
            os.close(fd)
        free = os.statvfs(self.root)
        assert free.f_bavail * free.f_frsize == kb * 1024
        return self.root

    def files(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.name != "filler")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    root = tmp_path / "disk"
    root.mkdir()
    mount = shutil.which("mount")
    if mount is None:
        pytest.skip("no mount command to make a small file system with")
    made = subprocess.run(
        [mount, "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(root)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.strip() or made.returncode}")
    try:
        yield SmallDisk(root)
    finally:
        subprocess.run(["umount", str(root)], capture_output=True)


@pytest.mark.parametrize("kb", [4, 44, 400])
def test_record_refuses_to_start_on_a_nearly_full_disk(small_disk, tmp_path, kb):
    disk, script, ran = small_disk.leave(kb), tmp_path / "train.py", tmp_path / "ran"
    script.write_text(TRAIN.format(steps=3))
    out = hookdbg("record", "-o", disk / "run.h5", script, ran)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"cannot create {disk / 'run.h5'}: the disk is full" in lines[0]
    assert f"({kb * 1.024:.1f} kB free; a recording needs 1.1 MB to start)" in lines[0]
    assert not ran.exists() and out.stdout == ""  # the script never ran
    assert small_disk.files() == []  # no half-made file


def test_the_api_raises_record_error_on_a_nearly_full_disk(small_disk):
    disk = small_disk.leave(8)
    out = subprocess.run(
        [sys.executable, "-c", API, str(disk / "run.h5")], capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout.startswith(f"refused: cannot create {disk / 'run.h5'}: the disk is full")
    assert "8.2 kB free; a recording needs 1.1 MB to start" in out.stdout
    assert small_disk.files() == []


def test_a_disk_that_fills_during_the_run_stops_the_recording_not_training(small_disk, tmp_path):
    disk, script, ran = small_disk.leave(1152), tmp_path / "train.py", tmp_path / "ran"
    script.write_text(TRAIN.format(steps=600))
    out = hookdbg("record", "--flush-interval", "0.1", "-o", disk / "run.h5", script, ran)
    assert out.returncode == 0 and out.stdout == "trained\n", out.stderr
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr
    assert "(No space left on device); recording stopped, training goes on" in out.stderr
    report = hookdbg("summary", disk / "run.h5")
    assert report.returncode == 0, report.stderr
    assert "writing stopped at" in report.stdout and "No space left on device" in report.stdout


def test_a_disk_that_fills_as_the_file_is_written_is_a_clean_refusal(small_disk, monkeypatch):
    """Another process takes the space between the check and the write (here: the
    check is skipped): the plain write fails, HDF5 never sees it, nothing is left."""
    disk = small_disk.leave(40)
    monkeypatch.setattr(newfile, "free_space", lambda path: None)
    with pytest.raises(WriterError, match=r"the disk is full \(0 B free; a recording needs"):
        Writer(disk / "run.h5", {"format": schema.FORMAT})
    assert small_disk.files() == []


RLIMITED = """
import resource, signal, sys, hookdbg
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000))
try:
    hookdbg.record(sys.argv[1]).start()
except hookdbg.RecordError as exc:
    print(f"refused: {exc}")
"""


def test_a_file_size_limit_below_a_new_file_is_a_clean_refusal(tmp_path):
    """A limit the free space does not show (``ulimit -f``), met by the plain write."""
    path = tmp_path / "run.h5"
    out = subprocess.run(
        [sys.executable, "-c", RLIMITED, str(path)], capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout.startswith(f"refused: cannot create {path}: File too large (a recording")
    assert not path.exists()


def test_replacing_a_recording_counts_the_space_it_frees(small_disk):
    """``record -f`` over the last run's file: its space is the new file's too."""
    disk = small_disk.leave(1300)
    old = disk / "run.h5"
    old.write_bytes(b"\0" * 400_000)  # leaves less free than a recording needs to start
    assert newfile.free_space(old) == 1300 * 1024  # what is free, and the file's
    writer = Writer(old, {"format": schema.FORMAT})
    writer.close({"status": "complete"})
    assert small_disk.files() == ["run.h5"]
