"""A real recorder training in the background, for tests that steer or attack it from
this process: samples/long_run.py under ``hookdbg record --idle``, its stderr read as it
comes (a full pipe would block the recorder), its recording read back."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hookdbg.control import control_path
from hookdbg.read import RecordingError, Status, open_recording
from tests.helpers import SAMPLES


def append(path: Path, data: bytes) -> None:
    """What another process writes into the control file, whatever its mode."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


class LiveRun:
    """``hookdbg record --idle -o DIR/run.h5 samples/long_run.py`` until ``finish``."""

    def __init__(self, workdir: Path, *extra: str, steps: int | None = None) -> None:
        self.out = workdir / "run.h5"
        self.until = workdir / "enough"
        self.ctl = control_path(self.out)
        script = [str(SAMPLES / "long_run.py"), "--pause", "0.02"]
        script += ["--steps", str(steps)] if steps else ["--until", str(self.until)]
        record = ["-m", "hookdbg", "record", "--idle", "--flush-interval", "0.2", *extra]
        self.proc = subprocess.Popen(
            [sys.executable, *record, "-o", str(self.out), *script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr: list[str] = []
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()
        self.wait_for(lambda: self._steps() > 3, "the recording never became live")

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def _steps(self) -> int:
        try:
            rec = open_recording(self.out)
        except (RecordingError, OSError):
            return 0
        return len(rec.steps) if rec.status is Status.LIVE else 0

    def answers(self) -> list[tuple[float, int, str]]:
        """Every answer in the recording so far (all its info rows)."""
        return open_recording(self.out).answers_from(0)[0]

    def notes(self) -> list[str]:
        """What the recorder said of the control file itself, in the recording."""
        return [text for _, text in open_recording(self.out).channel_notes]

    def step(self) -> int:
        return len(open_recording(self.out).steps)

    def wait_for(self, ready: Callable[[], object], why: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            assert self.proc.poll() is None, "".join(self.stderr)
            assert time.monotonic() < deadline, why
            time.sleep(0.1)

    def finish(self, timeout: float = 120) -> tuple[str, str]:
        """Let the script end (its own --until file); its stdout and stderr."""
        self.until.touch()
        out, _ = self.proc.communicate(timeout=timeout)
        self._drain.join(timeout)
        assert self.proc.returncode == 0, "".join(self.stderr)
        return out, "".join(self.stderr)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
