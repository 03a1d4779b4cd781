"""A failure inside hookdbg never breaks training and is never hidden: the recording
says it stopped, why, and what ran unrecorded after it; no report says complete."""

import pytest
import torch
from torch import nn

import hookdbg
from hookdbg.read import Status, open_recording
from hookdbg.recorder import accelerated
from hookdbg.recorder.alerts.nonfinite import OriginDetector
from tests.helpers import hookdbg as run_hookdbg


def train(steps: int = 6) -> list[float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        loss = model(torch.randn(5, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("pure", [False, True], ids=["c", "python"])
def test_an_internal_error_fails_the_recording_and_says_what_ran_after(
    tmp_path, monkeypatch, capsys, pure
):
    monkeypatch.setenv(accelerated.PURE_PYTHON, "1" if pure else "")
    plain = train()
    begun = OriginDetector.new_step

    def new_step(self: OriginDetector) -> None:  # the third segment's beginning breaks
        new_step.calls += 1
        if new_step.calls == 3:
            raise RuntimeError("injected for the test")
        begun(self)

    new_step.calls = 0
    monkeypatch.setattr(OriginDetector, "new_step", new_step)
    path = tmp_path / "run.h5"
    with hookdbg.record(path) as rec:
        recorded = train()
    assert recorded == plain  # training went on, untouched
    assert rec.failure is not None and "RuntimeError: injected for the test" in rec.failure
    stderr = capsys.readouterr().err
    assert "internal error at step 2: RuntimeError: injected for the test" in stderr
    assert "status failed" in stderr and "Traceback" in stderr
    with open_recording(path) as r:
        assert r.status is Status.FAILED
        assert r.end is not None and r.end["status"] == b"failed"
        assert "injected for the test (recorder/" in r.failure
        assert "4 backward passes ran after it" in r.failure  # steps 2-5, unrecorded
        assert len(r.steps) == 2  # what was recorded before it stays
    summary = run_hookdbg("summary", path, "--exit-code")
    assert summary.returncode == 1, summary.stderr
    assert "failed" in summary.stdout.splitlines()[0] and "complete" not in summary.stdout
    assert "injected for the test" in summary.stdout
    alerts = run_hookdbg("alerts", path, "--exit-code")
    assert alerts.returncode == 1 and "recording failed" in alerts.stdout
    clean = tmp_path / "clean.h5"
    monkeypatch.setattr(OriginDetector, "new_step", begun)
    with hookdbg.record(clean, quiet=True):
        train(2)
    assert run_hookdbg("summary", clean, "--exit-code").returncode == 0
