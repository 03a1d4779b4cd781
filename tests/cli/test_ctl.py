"""`hookdbg ctl` steering a real run from a real second process: one process, and two
ranks under torchrun (gloo, CPU), started idle and recorded for a window of steps."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hookdbg.read import RecordingError, Status, open_recording
from tests.helpers import SAMPLES, free_port, hookdbg

LONG_RUN = SAMPLES / "long_run.py"


def start(out: Path, until: Path, ranks: int = 1) -> subprocess.Popen[str]:
    """`hookdbg record --idle` of samples/long_run.py, running until ``until`` exists."""
    record = ["-m", "hookdbg", "record", "--idle", "--flush-interval", "0.2", "-o", str(out)]
    script = [str(LONG_RUN), "--until", str(until), "--pause", "0.02"]
    if ranks == 1:
        command = [sys.executable, *record, *script]
    else:
        port = free_port()
        launcher = ["-m", "torch.distributed.run", f"--nproc-per-node={ranks}"]
        command = [sys.executable, *launcher, f"--master-port={port}", *record, *script]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_live(files: list[Path], proc: subprocess.Popen[str]) -> None:
    """Until every file is a live recording past its first steps."""
    deadline = time.time() + 120
    while True:
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "the recording never became live"
        try:
            recs = [open_recording(f) for f in files]
            if all(r.status is Status.LIVE and len(r.steps) > 3 for r in recs):
                return
        except (RecordingError, OSError):
            pass
        time.sleep(0.2)


def wait_recorded(files: list[Path], steps: list[int], proc: subprocess.Popen[str]) -> None:
    """Until every file holds ``steps``' rows (the window starts ahead of every rank)."""
    deadline = time.time() + 120
    while not all(int(open_recording(f).recorded_steps[-1:].sum()) == steps[-1] for f in files):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "the window was never recorded"
        time.sleep(0.2)


def finish(proc: subprocess.Popen[str], until: Path) -> tuple[str, str]:
    until.touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return out, err


def window(answer: str) -> list[int]:
    """'recording steps 40-42 at shapes' -> [40, 41, 42]."""
    m = re.search(r"recording steps? (\d+)(?:-(\d+))?", answer)
    assert m, answer
    first = int(m.group(1))
    return list(range(first, int(m.group(2) or first) + 1))


def test_an_idle_run_is_recorded_when_asked_and_stopped_while_it_trains(tmp_path):
    out, until = tmp_path / "long.h5", tmp_path / "enough"
    proc = start(out, until)
    try:
        wait_live([out], proc)
        status = hookdbg("ctl", out, "status")
        assert status.returncode == 0, status.stderr
        assert "live" in status.stdout
        assert "launched idle, not recording now; 0 steps recorded" in status.stdout
        asked = hookdbg("ctl", out, "record", "--steps", "3", "--level", "shapes")
        assert asked.returncode == 0, asked.stderr
        sent, answer = asked.stdout.strip().splitlines()
        assert sent == "sent command 1: record 3 steps at shapes"
        steps = window(answer)
        assert len(steps) == 3 and answer.endswith("at shapes")
        bad = hookdbg("ctl", out, "record", "--steps", "0")
        assert bad.returncode == 2 and bad.stderr.startswith("Error: --steps must be")
        assert len(bad.stderr.strip().splitlines()) == 1
        stopped = hookdbg("ctl", out, "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert "stopped at step" in stopped.stdout
    finally:
        printed, _ = finish(proc, until)
    assert printed.startswith("trained ")  # the script ran on to its own end
    rec = open_recording(out)
    assert rec.recorded_steps.tolist() == steps
    assert rec.end is not None and rec.end["status"] == b"detached"
    assert len(rec.steps) > steps[-1]  # steps went on being counted until the stop
    late = hookdbg("ctl", out, "record", "--steps", "1")
    assert late.returncode == 2
    assert (
        late.stderr.strip()
        == f"Error: {out} is not being recorded (complete): there is nothing to steer"
    )
    summary = hookdbg("summary", out)
    assert "stopped by hookdbg ctl" in summary.stdout and "steered    2 commands" in summary.stdout


def test_one_command_steers_every_rank_from_the_same_step(tmp_path):
    out, until = tmp_path / "ddp.h5", tmp_path / "enough"
    files = [tmp_path / "ddp.rank0.h5", tmp_path / "ddp.rank1.h5"]
    proc = start(out, until, ranks=2)
    try:
        wait_live(files, proc)
        asked = hookdbg("ctl", out, "record", "--steps", "2")
        assert asked.returncode == 0, asked.stdout + asked.stderr
        lines = asked.stdout.strip().splitlines()
        assert lines[0].startswith("sent command 1 to 2 ranks: record 2 steps from step ")
        answers = dict(line.split(": ", 1) for line in lines[1:])
        assert set(answers) == {"rank 0", "rank 1"}
        steps = window(answers["rank 0"])
        assert window(answers["rank 1"]) == steps and len(steps) == 2
        wait_recorded(files, steps, proc)
        one = hookdbg("ctl", files[1], "level", "idle")  # one rank's file: every rank
        assert one.returncode == 0, one.stdout + one.stderr
        assert f"{files[1]} is one rank's file of {out}: the command goes to every rank" in (
            one.stderr
        )
        answers = dict(line.split(": ", 1) for line in one.stdout.strip().splitlines()[1:])
        assert answers["rank 0"] == answers["rank 1"], answers
        stopped = hookdbg("ctl", out, "stop")  # every rank at one step too
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        answers = dict(line.split(": ", 1) for line in stopped.stdout.strip().splitlines()[1:])
        assert answers["rank 0"] == answers["rank 1"], answers
    finally:
        finish(proc, until)
    for file in files:
        rec = open_recording(file)
        assert rec.recorded_steps.tolist() == steps and rec.end is not None
        assert rec.end["status"] == b"detached"
    summary = hookdbg("summary", out)  # every rank's
    assert summary.returncode == 0, summary.stderr
    assert "stopped by hookdbg ctl before step" in summary.stdout
    assert "(every rank)" in summary.stdout and "steered" in summary.stdout


def test_a_bad_recording_gets_one_line(tmp_path):
    missing = hookdbg("ctl", tmp_path / "nothing.h5", "status")
    assert missing.returncode == 2
    assert missing.stderr.strip().startswith(f"Error: {tmp_path / 'nothing.h5'}: no such recording")
    unknown = hookdbg("ctl", tmp_path / "nothing.h5", "level", "loud")
    assert unknown.returncode == 2 and "'loud' is not one of" in unknown.stderr


@pytest.mark.parametrize("command", ["status", "record", "level", "dump", "stop"])
def test_every_subcommand_explains_itself(command):
    shown = hookdbg("ctl", "x.h5", command, "--help")
    assert shown.returncode == 0 and "Usage: " in shown.stdout
