"""Optimizers that step others inside their own step (torchtitan's OptimizersContainer,
a wrapper around AdamW): one optimizer step, counted once."""

import numpy as np
import pytest
import torch
from torch import nn

import hookdbg
from hookdbg.store.schema import Phase, Slot, StepKind
from tests.helpers import module_names, tables


class OptimizersContainer(torch.optim.Optimizer):
    """torchtitan's: an Optimizer over every part's parameters whose step() steps one
    AdamW per model part."""

    def __init__(self, parts: list[nn.Module]) -> None:
        self.optimizers = [torch.optim.AdamW(p.parameters(), lr=1e-2) for p in parts]
        super().__init__([p for part in parts for p in part.parameters()], {"lr": 1e-2})

    def step(self, closure=None):  # type: ignore[override]
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none)


class Wrapped(torch.optim.Optimizer):
    """A plain wrapper around one optimizer (its own step hooked, as torch hooks any
    Optimizer subclass that calls Optimizer.__init__)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        super().__init__([p for g in optimizer.param_groups for p in g["params"]], {})

    def step(self, closure=None):  # type: ignore[override]
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)


def train(opt_of, steps: int = 3) -> tuple[nn.Module, torch.optim.Optimizer, list[float]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = opt_of(model)
    losses = []
    for _ in range(steps):
        loss = model(torch.randn(6, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return model, opt, losses


CONTAINERS = {
    "container": lambda m: OptimizersContainer([m[0], m[2]]),
    "wrapped": lambda m: Wrapped(torch.optim.AdamW(m.parameters(), lr=1e-2)),
}


@pytest.mark.parametrize("kind", sorted(CONTAINERS))
def test_an_optimizer_stepping_others_is_one_step_counted_once(tmp_path, kind):
    _, _, plain = train(CONTAINERS[kind])
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        _, _, recorded = train(CONTAINERS[kind])
    assert recorded == plain
    t = tables(tmp_path / "run.h5")
    names = module_names(t)
    assert np.count_nonzero(t["steps"]["kind"] == StepKind.TRAIN) == 3
    assert t["steps"]["optimizer_steps"].tolist() == [1, 1, 1]
    opt_calls = t["calls"][t["calls"]["phase"] == Phase.OPT]
    # one optimizer row a step: the outer one, whose time holds the inner steps'
    assert opt_calls["step"].tolist() == [0, 1, 2]
    assert [names[int(m)] for m in opt_calls["module"]] == ["opt"] * 3  # the script's name
    rows = t["tensors"][(t["tensors"]["phase"] == Phase.OPT) & (t["tensors"]["slot"] == Slot.PARAM)]
    per_step = {}
    for row in rows:
        key = (int(row["step"]), int(row["module"]), bytes(row["path"]))
        per_step[key] = per_step.get(key, 0) + 1
    assert len(per_step) == 3 * 4 and set(per_step.values()) == {1}  # 4 parameters, once
