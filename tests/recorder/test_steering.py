"""What a recording records, changed while it runs: --idle, windows of steps in a given
detail, levels, stop and dump, from the Python API and through the control file that
``hookdbg ctl`` writes (the real second process is tests/cli/test_ctl.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from torch import nn

import hookdbg
from hookdbg.control import Command, control_path, send
from hookdbg.options import Level
from hookdbg.read import open_recording
from hookdbg.recorder import Recorder, RecordOptions, accelerated
from hookdbg.recorder.steps.steering import Steering
from hookdbg.store.schema import CaptureReason, Phase, Slot

PATHS = [pytest.param(False, id="c"), pytest.param(True, id="python")]


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


class Trainer:
    """A small training loop whose losses are kept, to compare with an unrecorded run."""

    def __init__(self) -> None:
        self.net = model()
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)
        self.gen = torch.Generator().manual_seed(1)
        self.losses: list[float] = []

    def steps(self, n: int) -> None:
        for _ in range(n):
            self.opt.zero_grad()
            loss = self.net(torch.randn(2, 4, generator=self.gen)).pow(2).mean()
            loss.backward()
            self.opt.step()
            self.losses.append(loss.item())


def steered(tmp_path, **options):
    return Recorder(tmp_path / "run.h5", RecordOptions(**options), force=True)


def modules_of(rec, step: int, phases=(Phase.FWD, Phase.BWD)) -> set[str]:
    rows = rec.tensors(step, step)
    rows = rows[np.isin(rows["phase"], phases)]
    return {rec.modules.name(int(m)) for m in rows["module"]}


def test_idle_records_no_step_but_every_loss(tmp_path):
    plain, train = Trainer(), Trainer()
    plain.steps(6)
    with steered(tmp_path, idle=True):
        train.steps(6)
    assert train.losses == plain.losses  # training unchanged
    rec = open_recording(tmp_path / "run.h5")
    assert len(rec.steps) == 6 and len(rec.recorded_steps) == 0
    assert rec.losses["value"].tolist() == pytest.approx(train.losses)
    assert rec.info.options["idle"] is True


@pytest.mark.parametrize("pure", PATHS)
def test_windows_of_steps_in_their_own_detail(tmp_path, monkeypatch, pure):
    monkeypatch.setenv(accelerated.PURE_PYTHON, "1" if pure else "")
    plain, train = Trainer(), Trainer()
    plain.steps(12)
    with steered(tmp_path, idle=True) as rec:
        train.steps(2)
        rec.record_next(2, level="shapes")
        train.steps(3)
        rec.record_next(1, level="timing")
        train.steps(2)
        rec.set_level("stats")
        train.steps(2)
        rec.set_level("idle")
        train.steps(3)
    assert train.losses == plain.losses
    rec = open_recording(tmp_path / "run.h5")
    assert rec.recorded_steps.tolist() == [2, 3, 5, 7, 8]
    tensors = rec.tensors()
    shapes = tensors[np.isin(tensors["step"], [2, 3])]
    assert len(shapes) and np.isnan(shapes["std"]).all()  # shapes: no statistics
    assert not (tensors["step"] == 5).any()  # timing: calls, no tensor rows
    assert (rec.calls_table.column("step") == 5).any()
    stats = tensors[np.isin(tensors["step"], [7, 8])]
    assert len(stats) and np.isfinite(stats["std"][stats["phase"] == Phase.FWD]).all()
    answers = [text for _, _, text in rec.answers]
    assert answers == [
        "recording steps 2-3 at shapes",
        "recording step 5 at timing",
        "recording every step at stats from step 7",
        "idle from step 9: no step recorded, the loss watched",
    ]


@pytest.mark.parametrize("pure", PATHS)
def test_a_window_of_chosen_modules_captures_theirs(tmp_path, monkeypatch, pure):
    monkeypatch.setenv(accelerated.PURE_PYTHON, "1" if pure else "")
    train = Trainer()
    with steered(tmp_path, idle=True) as rec:
        train.steps(1)
        rec.record_next(1, modules="net.0", capture="net.0")
        train.steps(1)
        rec.record_next(1)
        train.steps(1)
    rec = open_recording(tmp_path / "run.h5")
    assert rec.recorded_steps.tolist() == [1, 2]
    assert modules_of(rec, 1) == {"net.0"}
    assert modules_of(rec, 2) == {"net", "net.0", "net.1", "net.2"}  # all again
    captured = rec.captured()
    assert captured and {(c.step, c.module.name) for c in captured} == {(1, "net.0")}
    assert all(c.reason == CaptureReason.EXPLICIT for c in captured)


def test_a_non_finite_loss_in_an_idle_step_is_an_alert_naming_the_weights(tmp_path):
    train = Trainer()
    with steered(tmp_path, idle=True):
        train.steps(3)
        with torch.no_grad():
            train.net[2].weight[0, 0] = float("nan")
        train.steps(3)
    rec = open_recording(tmp_path / "run.h5")
    (alert,) = rec.alerts  # the model's output, first: the loss and gradients spread from it
    message = alert["message"].decode()
    assert alert["step"] == 3 and int(alert["slot"]) == int(Slot.OUTPUT)
    assert "module calls were not checked" in message
    assert "these weights already held NaN/inf: net.2.weight" in message


def test_commands_through_the_control_file_are_answered_in_the_recording(tmp_path):
    path = tmp_path / "run.h5"
    train = Trainer()
    with hookdbg.record(path, idle=True, quiet=True) as rec:  # the API's keywords too
        train.steps(2)
        sent = send(control_path(path), op="record", steps=2)
        time.sleep(0.15)  # the recorder looks at most every 0.1 s
        train.steps(4)
        send(control_path(path), op="record", steps=1, first=1)  # already past step 1
        time.sleep(0.15)
        train.steps(1)
    rec = open_recording(path)
    assert rec.recorded_steps.tolist() == [2, 3, 6]
    assert [(seq, text) for _, seq, text in rec.answers] == [
        (sent.seq, "recording steps 2-3 at stats"),
        (2, "recording step 6 at stats (asked from step 1: this process was past it)"),
    ]


def test_stop_closes_the_recording_and_training_goes_on(tmp_path):
    path = tmp_path / "run.h5"
    plain, train = Trainer(), Trainer()
    plain.steps(6)
    with hookdbg.record(path, quiet=True) as rec:
        train.steps(2)
        send(control_path(path), op="stop")
        time.sleep(0.15)
        train.steps(4)
        assert rec.steps_recorded == 2
    assert train.losses == plain.losses
    rec = open_recording(path)
    assert rec.recorded_steps.tolist() == [0, 1]
    end = rec.end
    assert end["status"] == b"detached" and b"stopped by hookdbg ctl" in end["message"]
    assert [text for _, _, text in rec.answers] == [
        "stopped at step 2: training goes on unrecorded"
    ]


def test_dump_writes_what_the_flight_recorder_holds(tmp_path):
    path = tmp_path / "run.h5"
    train = Trainer()
    with hookdbg.record(path, quiet=True):
        train.steps(3)
        send(control_path(path), op="dump")
        time.sleep(0.15)
        train.steps(1)
    rec = open_recording(path)
    captured = rec.captured()
    assert captured and {c.reason for c in captured} == {CaptureReason.FLIGHT}
    assert {c.step for c in captured} == {1, 2}  # the last two steps before the dump
    (answer,) = [text for _, _, text in rec.answers]
    assert answer.startswith(f"wrote the flight recorder's {len(captured)} tensors (steps 1-2)")


def test_a_command_after_a_stop_that_closes_now_is_left_unread(tmp_path):
    path = tmp_path / "run.h5"
    train = Trainer()
    with hookdbg.record(path, quiet=True):
        train.steps(2)
        stop = send(control_path(path), op="stop")
        send(control_path(path), op="record", steps=5)  # in the same look as the stop
        time.sleep(0.15)
        train.steps(3)
    rec = open_recording(path)
    assert [(seq, text) for _, seq, text in rec.answers] == [
        (stop.seq, "stopped at step 2: training goes on unrecorded")
    ]
    assert rec.recorded_steps.tolist() == [0, 1]


def test_a_window_after_the_step_a_stop_is_set_for_is_refused(tmp_path):
    path = tmp_path / "run.h5"
    train = Trainer()
    with hookdbg.record(path, quiet=True):
        train.steps(1)
        stop = send(control_path(path), op="stop", first=4)
        send(control_path(path), op="record", steps=1, first=5)
        time.sleep(0.15)
        train.steps(5)
    rec = open_recording(path)
    assert [text for _, _, text in rec.answers] == [
        f"refused: the recording stops at step 4 (command {stop.seq}), before step 5",
        "stopped at step 4: training goes on unrecorded",
    ]


def test_a_second_dump_writes_only_what_is_new(tmp_path):
    path = tmp_path / "run.h5"
    train = Trainer()
    with hookdbg.record(path, quiet=True) as rec:
        train.steps(2)
        rec.set_level("idle")  # no new tensors from step 2 on
        for _ in range(2):
            send(control_path(path), op="dump")
            time.sleep(0.15)
            train.steps(1)
    rec = open_recording(path)
    first, second = (text for _, _, text in rec.answers[1:])
    assert first.startswith("wrote the flight recorder's ")
    assert second == "the flight recorder holds nothing new since the dump before (written then)"
    assert len(rec.captured()) == int(first.split()[4])  # each tensor once


def test_a_recording_whose_control_file_name_is_too_long_says_it_cannot_be_steered(tmp_path):
    path = tmp_path / ("a" * 249 + ".h5")  # a name of 252 bytes: with .ctl, 256
    with hookdbg.record(path, quiet=True):
        Trainer().steps(2)
    (note,) = [text for _, text in open_recording(path).channel_notes]
    assert note == (
        f"{path.name}.ctl is a longer name than this file system allows (255 bytes): "
        "`hookdbg ctl` cannot steer this recording; name it shorter to"
    )


def test_a_bad_api_call_says_which_keyword(tmp_path):
    with steered(tmp_path) as rec:
        with pytest.raises(hookdbg.recorder.OptionError, match="steps"):
            rec.record_next(0)
        with pytest.raises(hookdbg.recorder.OptionError, match="unknown level"):
            rec.set_level("loud")


def _command(op: str, first: int | None = None, **fields):
    return Command(seq=1, op=op, first=first, **fields)


def test_a_level_from_a_later_step_keeps_the_one_before_until_then():
    """Under torchrun a level starts at a step ahead; the steps before it are recorded
    as the level before said, not as the launch rule."""
    steering = Steering(RecordOptions(idle=True), None)
    steering.apply(_command("level", 10, level="timing"), step=5)
    steering.apply(_command("level", 24, level="shapes"), step=12)
    plans = {step: steering.plan(step) for step in range(5, 30)}
    assert [s for s, p in plans.items() if not p.recording] == [5, 6, 7, 8, 9]
    assert {plans[s].level for s in range(10, 24)} == {Level.TIMING}
    assert {plans[s].level for s in range(24, 30)} == {Level.SHAPES}


def test_a_window_asked_during_another_starts_after_it():
    steering = Steering(RecordOptions(idle=True), None)
    first = steering.apply(_command("record", steps=3, level="stats"), step=5)
    second = steering.apply(_command("record", steps=4, level="timing"), step=5)
    assert first == "recording steps 5-7 at stats"
    assert second == "recording steps 8-11 at timing (after the window asked before it)"
    levels = [steering.plan(s).level for s in range(5, 12)]
    assert levels == [Level.STATS] * 3 + [Level.TIMING] * 4
    assert not steering.plan(12).recording


def test_stop_from_a_later_step_waits_for_it():
    steering = Steering(RecordOptions(), None)
    assert steering.apply(_command("stop", 20), step=12) == ""
    assert steering.apply(_command("stop", 25), step=13) == ""  # the earlier one holds
    assert steering.stop is not None and steering.stop[0] == 20 and len(steering.stop[1]) == 2


def test_a_recording_that_ended_cannot_be_steered(tmp_path):
    with steered(tmp_path) as rec:
        Trainer().steps(1)
    with pytest.raises(hookdbg.recorder.RecordError, match="has ended"):
        rec.record_next(2)
