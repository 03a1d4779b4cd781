"""AMP's GradScaler (recorder/hooks/gradscaler.py): overflowing scaled gradients are the scaler
at work, not alerts; a gradient non-finite even unscaled is one. On CPU, with the
scaler's real code: ``GradScaler("cpu")`` with a loss scale too large to fit."""

import runpy
import sys

import numpy as np
import pytest
import torch
from torch import nn

from hookdbg.options import RecordOptions
from hookdbg.recorder import NonFiniteError, Recorder
from tests.helpers import SAMPLES, module_names, tables


def train(steps: int, init_scale: float, fused: bool = False, nan_grad: bool = False):
    """A small bf16-autocast run; returns the scales it used and its final weights."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, fused=fused)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    used = []
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x).float()
        loss = nn.functional.mse_loss(out, y) * 100
        if nan_grad:
            loss = loss + torch.sqrt((out * 0).pow(2).sum())  # d sqrt(0): NaN, every step
        scaler.scale(loss).backward()
        used.append(scaler.get_scale())
        scaler.step(opt)
        scaler.update()
    return used, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("defer", [False, True], ids=["now", "deferred"])
@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_overflow_steps_are_skipped_steps_not_alerts(tmp_path, defer, fused):
    scales, plain = train(10, 2.0**127, fused)
    path = tmp_path / "run.h5"
    with Recorder(path, RecordOptions.build(quiet=True), defer_cpu=defer):
        recorded_scales, weights = train(10, 2.0**127, fused)
    assert recorded_scales == scales  # the scaler decided exactly as without hookdbg
    assert all(torch.equal(a, b) for a, b in zip(plain, weights, strict=True))
    skipped = [a > b for a, b in zip(scales, [*scales[1:], scales[-1]], strict=True)]
    assert 1 < sum(skipped) < 10  # some overflowed, then training went on
    t = tables(path)
    assert len(t.get("alerts", ())) == 0
    steps = t["steps"]
    assert list(steps["step"]) == list(range(10))  # a skipped step is still a step
    # the last step's skip is not known from the next scale; the scaler's own record is
    assert list(steps["skipped"][:-1]) == [int(s) for s in skipped[:-1]]
    np.testing.assert_array_equal(steps["scale"], scales)


@pytest.mark.parametrize("defer", [False, True], ids=["now", "deferred"])
def test_a_gradient_non_finite_at_scale_one_is_an_alert(tmp_path, defer):
    path = tmp_path / "run.h5"
    with Recorder(path, RecordOptions.build(quiet=True), defer_cpu=defer):
        scales, _ = train(6, 4.0, nan_grad=True)
    assert scales == [4.0, 2.0, 1.0, 0.5, 0.25, 0.125]  # skipped every time
    t = tables(path)
    alerts = t["alerts"]
    first = alerts[alerts["first"] == 1]
    assert len(first) == 1 and first["step"][0] == 2  # at scale 1 the scaling did not overflow it
    message = first["message"][0].decode()
    assert "backward" in message and "non-finite even unscaled" in message
    assert list(t["steps"]["skipped"]) == [1] * 6


def test_a_forward_nan_is_not_held(tmp_path):
    """The scaler does not touch the forward pass: a NaN there stops the script inside
    the forward hook, not at scaler.step."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    scaler = torch.amp.GradScaler("cpu")
    x = torch.ones(2, 4)
    recorder = Recorder(tmp_path / "run.h5", RecordOptions.build(on_nan="raise", quiet=True))
    reached_backward = False
    with pytest.raises(NonFiniteError, match="forward"), recorder:
        for step in range(3):
            out = model(x if step < 1 else x * float("nan"))
            reached_backward = step >= 1
            scaler.scale(out.sum()).backward()
            scaler.step(torch.optim.SGD(model.parameters(), lr=0.1))
            scaler.update()
    assert not reached_backward


def test_the_scaler_is_restored_after_recording(tmp_path):
    scale, step = torch.amp.GradScaler.scale, torch.amp.GradScaler.step
    with Recorder(tmp_path / "run.h5", RecordOptions.build(quiet=True)):
        assert torch.amp.GradScaler.step is not step
    assert (torch.amp.GradScaler.scale, torch.amp.GradScaler.step) == (scale, step)


def test_sample_names_the_birth_once_the_scale_is_down_to_one(tmp_path, monkeypatch, capsys):
    path = tmp_path / "nan.h5"
    monkeypatch.setattr(sys, "argv", ["amp_scaler.py", "--nan-grad", "--init-scale", "8"])
    with Recorder(path, RecordOptions.build(quiet=True)):
        runpy.run_path(str(SAMPLES / "amp_scaler.py"), run_name="__main__")
    t = tables(path)
    first = t["alerts"][t["alerts"]["first"] == 1][0]
    assert module_names(t)[int(first["module"])] == "model.length"
    assert first["step"] == 3  # scales 8, 4, 2 were skipped steps; at 1 it is an alert
