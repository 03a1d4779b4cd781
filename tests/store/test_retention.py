"""--keep-last N: a long run's file keeps the detail of its last N recorded steps, and
every step row, loss, alert and flight-recorder dump of the whole run."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import hookdbg
from hookdbg.read import RecordingError, Status, open_recording
from hookdbg.store import retention
from hookdbg.store.schema import CaptureReason
from hookdbg.store.writer import Writer
from tests.helpers import ROOT, SAMPLES, tables
from tests.helpers import hookdbg as run_hookdbg

NAN_RUN = [SAMPLES / "nan_blowup.py", "--nan-step", "3", "--steps", "30"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The NaN sample for 30 steps, capturing one module's tensors every step: whole,
    and keeping the last 4 steps' detail."""
    tmp = tmp_path_factory.mktemp("keep")
    out = {}
    for name, extra in (("whole", []), ("kept", ["--keep-last", "4"])):
        path = tmp / f"{name}.h5"
        args = ["record", "-q", "-o", path, "--capture", "proj", *extra, *NAN_RUN]
        result = run_hookdbg(*args)
        assert result.returncode == 0, result.stderr
        out[name] = path
    return out


def test_the_detail_of_the_last_steps_is_kept(runs):
    whole, kept = tables(runs["whole"]), tables(runs["kept"])
    segments = np.unique(kept["calls"]["segment"]).tolist()
    assert segments[-4:] == [26, 27, 28, 29] and len(segments) <= 8  # at most 2N
    for table in ("steps", "losses", "alerts", "modules"):  # the whole run's
        assert len(kept[table]) == len(whole[table]), table
    explicit = kept["captures"][kept["captures"]["reason"] == CaptureReason.EXPLICIT]
    assert set(explicit["segment"].tolist()) <= set(segments)
    with open_recording(runs["kept"]) as rec:
        assert rec.recorded_steps.tolist() == segments and rec.dropped == 30 - len(segments)
        assert len(rec.losses) == 30 and rec.alerts["step"].min() == 3


def test_flight_recorder_dumps_are_kept_with_their_values(runs):
    with open_recording(runs["whole"]) as a, open_recording(runs["kept"]) as b:
        flights = [
            [c for c in rec.captured(rec.modules.resolve("standardize").id)] for rec in (a, b)
        ]
        assert [(c.step, c.label) for c in flights[0]] == [(c.step, c.label) for c in flights[1]]
        assert {c.step for c in flights[1]} == {2, 3}
        for c, d in zip(*flights, strict=True):
            np.testing.assert_array_equal(a.tensor(c), b.tensor(d))  # NaNs alike


def test_summary_says_what_was_dropped(runs):
    out = run_hookdbg("summary", runs["kept"])
    assert out.returncode == 0, out.stderr
    assert "the detail of the last 4 recorded steps (--keep-last)" in out.stdout
    data = json.loads(run_hookdbg("summary", "--json", runs["kept"]).stdout)
    assert data["steps"] == 30 and data["detail_dropped_steps"] == 30 - data["recorded_steps"]
    shown = run_hookdbg("show", runs["kept"], "proj", "--step", "10")
    assert shown.returncode == 2 and "--keep-last kept the detail" in shown.stderr


def test_a_follower_reads_on_across_the_rewrites(tmp_path):
    """The file is written anew every N recorded steps and renamed over the old one:
    a reader that holds the old one moves to the new one when it refreshes."""
    path = tmp_path / "long.h5"
    command = [sys.executable, "-m", "hookdbg", "record", "-q", "--keep-last", "3"]
    script = [str(ROOT / "samples" / "long_run.py"), "--steps", "150", "--pause", "0.02"]
    proc = subprocess.Popen([*command, "--flush-interval", "0.1", "-o", str(path), *script])
    try:
        deadline = time.time() + 90
        while True:
            with contextlib.suppress(RecordingError):  # not there, or being created
                rec = open_recording(path)
                if rec.status is Status.LIVE:
                    break
                rec.close()
            assert time.time() < deadline, "the recording never became live"
            time.sleep(0.2)
        seen = set()
        while proc.poll() is None:
            rec.refresh()
            recorded = rec.recorded_steps.tolist()
            assert len(recorded) <= 6, recorded  # 2N, the step being written included
            seen.add(rec.kept_from)
            time.sleep(0.1)
        assert proc.returncode == 0
        rec.refresh()
        assert rec.status is Status.COMPLETE and len(rec.steps) == 150
        assert len(seen) > 3  # it saw several rewrites
        rec.close()
    finally:
        proc.kill()
        proc.wait()


def test_a_rewrite_that_fails_keeps_the_file_whole_and_says_so(tmp_path, monkeypatch, capsys):
    def full_disk(self, old, first):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Writer, "_copy_kept", full_disk)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hookdbg.record(tmp_path / "run.h5", keep_last=2, flush_interval=0.05):
        for _ in range(12):
            opt.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            opt.step()
            time.sleep(0.03)
    err = capsys.readouterr().err
    assert "keeping the last steps stopped" in err and "No space left on device" in err
    with open_recording(tmp_path / "run.h5") as rec:
        assert len(rec.recorded_steps) == 12 and rec.dropped == 0
        assert "keeping the last steps stopped" in rec.facts["keep_last"]
    assert not (tmp_path / "run.h5.keeping").exists()


def test_rows_are_read_in_blocks_and_only_the_kept_ones_stay():
    dtype = np.dtype([("segment", "<i4"), ("reason", "u1")])
    tail = np.array([(5, 0), (6, 1)], dtype)
    assert [len(b) for b in retention.rows([], 0, tail, 8)] == [2]
    block = np.array([(1, CaptureReason.FLIGHT), (2, 0), (4, 0)], dtype)
    assert retention.kept("captures", block, 3)["segment"].tolist() == [1, 4]
    assert retention.kept("calls", block, 3)["segment"].tolist() == [4]
    assert retention.first_kept([1, 2, 3], 2) is None
    assert retention.first_kept([1, 2, 3, 4], 2) == 3


def test_keep_last_must_be_a_whole_number():
    out = run_hookdbg("record", "--keep-last", "-2", "x.py")
    assert out.returncode == 2 and "--keep-last must be a whole number" in out.stderr
