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
from hookdbg.store import retention, schema
from hookdbg.store.schema import CaptureReason, StepKind
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
        seen, most = set(), 0
        while proc.poll() is None:
            rec.refresh()
            most = max(most, len(rec.recorded_steps))
            assert rec.recorded_steps.tolist()[-3:] == list(range(len(rec.steps)))[-3:]
            seen.add(rec.kept_from)
            time.sleep(0.1)
        assert proc.returncode == 0
        rec.refresh()
        assert rec.status is Status.COMPLETE and len(rec.steps) == 150
        assert len(seen) > 3 and most < 50  # it saw several rewrites, never all steps
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


def _steps_rows(*segments: tuple[int, int, int]) -> np.ndarray:
    """steps rows: (segment, step, kind), all recorded."""
    rows = np.zeros(len(segments), schema.STEPS)
    for i, (segment, step, kind) in enumerate(segments):
        rows[i]["segment"], rows[i]["step"], rows[i]["kind"] = segment, step, kind
    rows["recorded"] = 1
    return rows


def _calls(segment: int, n: int) -> np.ndarray:
    rows = np.zeros(n, schema.CALLS)
    rows["segment"] = segment
    return rows


def test_a_rewrite_is_due_when_what_it_drops_outweighs_what_it_copies():
    ledger = retention.Ledger(keep_last=2)
    for segment in range(3):
        ledger.add("steps", _steps_rows((segment, segment, StepKind.TRAIN)))
        ledger.add("calls", _calls(segment, 100))
    assert ledger.first_kept() is None  # one step's detail to drop, two to copy
    for segment in (3, 4):
        ledger.add("steps", _steps_rows((segment, segment, StepKind.TRAIN)))
        ledger.add("calls", _calls(segment, 100))
        due = ledger.first_kept()
    # with step 4: three steps' detail to drop, two to copy with the five step rows
    assert due == 3
    ledger.kept_from(3)
    assert ledger.first_kept() is None and sorted(ledger.detail) == [3, 4]


def test_eval_batches_are_kept_with_the_steps_they_follow_not_counted_as_steps():
    ledger = retention.Ledger(keep_last=1)
    segments = [(0, 0, StepKind.TRAIN), (1, 1, StepKind.TRAIN), (2, 1, StepKind.EVAL)]
    segments += [(3, 1, StepKind.TRAIN), (4, 2, StepKind.EVAL), (5, 2, StepKind.EVAL)]
    for segment, step, kind in segments:
        ledger.add("steps", _steps_rows((segment, step, kind)))
        ledger.add("calls", _calls(segment, 1000 if segment == 0 else 100))
    # the last training step is step 1: its segments (1, 3) and the eval between them
    # and after it are kept, however many eval batches there were
    assert ledger.first_kept() == 1


def test_keep_last_must_be_a_whole_number():
    out = run_hookdbg("record", "--keep-last", "-2", "x.py")
    assert out.returncode == 2 and "--keep-last must be a whole number" in out.stderr


def test_a_capture_read_before_a_rewrite_is_found_again_or_said_gone(tmp_path):
    """A rewrite moves the captured bytes it keeps: a capture listed before it reads
    the same values after it, and one whose step was dropped says so."""
    path = tmp_path / "long.h5"
    command = [sys.executable, "-m", "hookdbg", "record", "-q", "--keep-last", "2"]
    command += ["--capture", "*", "--flush-interval", "0.1", "-o", str(path)]
    script = [str(ROOT / "samples" / "long_run.py"), "--steps", "120", "--pause", "0.03"]
    proc = subprocess.Popen([*command, *script])
    try:
        deadline = time.time() + 90
        rec = None
        while rec is None or not rec.captures.size:
            assert time.time() < deadline and proc.poll() is None, "nothing captured"
            time.sleep(0.2)
            with contextlib.suppress(RecordingError):
                rec = rec or open_recording(path)
                rec.refresh()
        first = rec.captured(rec.modules.resolve("0").id)[-1]
        values = rec.tensor(first)
        moved = gone = False
        while proc.poll() is None and not gone:
            time.sleep(0.1)
            if not rec.refresh() or rec.kept_from == 0:
                continue
            if rec.kept_from <= first.segment:
                np.testing.assert_array_equal(rec.tensor(first), values)
                moved = True
            else:
                with pytest.raises(RecordingError, match="--keep-last kept the detail"):
                    rec.tensor(first)
                gone = True
        assert moved or gone, "no rewrite was seen"
        rec.close()
    finally:
        proc.kill()
        proc.wait()
