"""The loss per step, from the losses table: one series per loss site."""

import pytest
import torch
from torch import nn

import hookdbg
from hookdbg.analysis.losses import describe, loss_series
from hookdbg.read import open_recording


def test_a_step_of_several_passes_counts_their_mean_and_says_so(tmp_path):
    """LBFGS calls its closure several times a step: the step's loss is their mean, and
    the line says it is (the script prints one of them)."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=4)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    seen: list[list[float]] = []

    def closure():
        opt.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        seen[-1].append(loss.item())
        return loss

    with hookdbg.record(tmp_path / "lbfgs.h5", quiet=True):
        for _ in range(3):
            seen.append([])
            opt.step(closure)
    (series,) = loss_series(open_recording(tmp_path / "lbfgs.h5"))
    assert series.steps.tolist() == [0, 1, 2]
    assert series.values.tolist() == pytest.approx([sum(s) / len(s) for s in seen])
    passes = sum(map(len, seen))
    assert passes > 3 and series.passes == passes
    assert f"mean of its backward passes ({passes} in 3 steps)" in describe(series)


def test_one_pass_a_step_is_the_loss_itself(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    printed = []
    with hookdbg.record(tmp_path / "sgd.h5", quiet=True):
        for _ in range(4):
            loss = model(torch.randn(8, 3)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            printed.append(loss.item())
    (series,) = loss_series(open_recording(tmp_path / "sgd.h5"))
    assert series.values.tolist() == pytest.approx(printed)
    line = describe(series)
    assert line.startswith(f"{printed[0]:.4g} at step 0 -> {printed[-1]:.4g} at step 3")
    assert "mean of" not in line
