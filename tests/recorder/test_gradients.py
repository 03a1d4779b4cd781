"""Gradient hooks on the tensors module calls make (hookdbg/recorder/hooks/gradients.py), on
both per-call paths: where they sit among the script's own hooks, and what they leave
on the tensors."""

import io
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import hookdbg
from hookdbg.recorder import accelerated
from hookdbg.store.schema import ModuleKind, Phase, Slot
from tests.helpers import module_id, module_names, tables

PATHS = [
    pytest.param(True, id="python"),
    pytest.param(
        False,
        id="c",
        marks=pytest.mark.skipif(
            accelerated._hot is None, reason="hookdbg.recorder._hot not built"
        ),
    ),
]


class TriplesItsGradient(nn.Module):
    """Adds a hook to its own output inside forward: before hookdbg sees the tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(x)
        y.register_hook(lambda g: g * 3)
        return y


def _triple_its_gradient(module: nn.Module, args: tuple, y: torch.Tensor) -> None:
    """A forward hook: runs after hookdbg's global one."""
    y.register_hook(lambda g: g * 3)


def _grad_output_norm(path, name: str) -> float:
    t = tables(path)
    rows = t["tensors"]
    mine = rows[
        (rows["module"] == module_id(t, name))
        & (rows["phase"] == Phase.BWD)
        & (rows["slot"] == Slot.GRAD_OUTPUT)
    ]
    assert len(mine) == 1
    return float(mine[0]["norm"])


def _node_sees(out: torch.Tensor) -> list[torch.Tensor]:
    """What the node that made ``out`` is given: a node pre-hook runs after all of the
    tensor's hooks."""
    got: list[torch.Tensor] = []
    out.grad_fn.register_prehook(lambda grads: got.append(grads[out.output_nr].clone()))
    return got


@pytest.mark.parametrize("pure", PATHS)
@pytest.mark.parametrize("when", ["after", "before"])
def test_the_gradient_is_recorded_as_the_scripts_hooks_leave_it(tmp_path, monkeypatch, pure, when):
    """A hook the script puts on a module's output (in a forward hook, after hookdbg's;
    or in forward itself, before) changes the gradient the node gets: hookdbg records
    that one, and the script's hook runs once."""
    monkeypatch.setenv(accelerated.PURE_PYTHON, "1" if pure else "")
    torch.manual_seed(0)
    if when == "after":
        model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
        model[1].register_forward_hook(_triple_its_gradient)
    else:
        model = nn.Sequential(nn.Linear(4, 4), TriplesItsGradient(), nn.Linear(4, 2))
    hidden: list[torch.Tensor] = []
    model[1].register_forward_hook(lambda m, a, y: hidden.append(y))
    x = torch.randn(5, 4)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        out = model(x)
        seen = _node_sees(hidden[0])
        out.pow(2).sum().backward()
    assert len(seen) == 1  # the script's hook ran once, hookdbg's with it
    assert _grad_output_norm(tmp_path / "run.h5", "model.1") == pytest.approx(
        seen[0].norm().item(), rel=1e-6
    )


@pytest.mark.parametrize("pure", PATHS)
def test_the_scripts_hooks_on_a_recorded_tensor_all_run_in_order(tmp_path, monkeypatch, pure):
    monkeypatch.setenv(accelerated.PURE_PYTHON, "1" if pure else "")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    order: list[str] = []
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        out = model(torch.randn(2, 3))
        first = out.register_hook(lambda g: order.append("first"))
        out.register_hook(lambda g: order.append("second"))
        first.remove()
        out.register_hook(lambda g: order.append("third"))
        out.sum().backward()
    assert order == ["second", "third"]
    assert _grad_output_norm(tmp_path / "run.h5", "model") == pytest.approx(6**0.5)


@pytest.mark.parametrize("pure", PATHS)
def test_saving_a_recorded_output_warns_of_no_hook(tmp_path, monkeypatch, pure):
    """torch.save warns of hooks it cannot save with a tensor; hookdbg's need not be."""
    monkeypatch.setenv(accelerated.PURE_PYTHON, "1" if pure else "")
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        out = model(torch.randn(2, 3))
        assert out._backward_hooks  # hookdbg's hook is there
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.save(out, io.BytesIO())
        out.sum().backward()


def _backward_spans_and_param_calls(path, ask_first: bool) -> tuple[list[str], set[int]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), nn.Linear(4, 2))
    hidden: list[torch.Tensor] = []
    model[0].register_forward_hook(lambda m, a, y: hidden.append(y))
    with hookdbg.record(path, quiet=True):
        loss = model(torch.randn(5, 4)).pow(2).sum()
        if ask_first:
            torch.autograd.grad(loss, hidden[0], retain_graph=True)
        loss.backward()
    t = tables(path)
    names = module_names(t)
    calls = t["calls"]
    modules = t["modules"]["id"][t["modules"]["kind"] == ModuleKind.MODULE]
    backward = calls[(calls["phase"] == Phase.BWD) & np.isin(calls["module"], modules)]
    spans = sorted(names[int(m)] for m in backward["module"])
    rows = t["tensors"]
    first = module_id(t, "model.0.0")
    params = rows[(rows["module"] == first) & (rows["slot"] == Slot.PARAM_GRAD)]
    own = calls[(calls["module"] == first) & (calls["phase"] == Phase.FWD)]["call"]
    assert len(params) == 2 and len(own) == 1
    return spans, {int(c) - int(own[0]) for c in params["call"]}


@pytest.mark.parametrize("pure", PATHS)
def test_a_module_output_asked_for_its_gradient_first_keeps_its_backward(
    tmp_path, monkeypatch, pure
):
    """torch.autograd.grad with a module's output as an input runs that output's hooks
    but not the node that made it, nor any of the module's backward; the backward()
    after it does. The module's backward span and its parameters' gradients belong to
    that pass, as when nothing asked first."""
    monkeypatch.setenv(accelerated.PURE_PYTHON, "1" if pure else "")
    plain = _backward_spans_and_param_calls(tmp_path / "plain.h5", ask_first=False)
    asked = _backward_spans_and_param_calls(tmp_path / "asked.h5", ask_first=True)
    assert plain[0] == ["model", "model.0", "model.0.0", "model.0.1", "model.1"]
    assert asked == plain
    assert asked[1] == {0}  # the parameters' gradients are their own call's


@pytest.mark.parametrize("pure", PATHS)
def test_an_optimizers_own_parameters_are_recorded_under_it(tmp_path, monkeypatch, pure):
    """A temperature beside the models (SAC's ``log_alpha``) in an optimizer of its own:
    its gradient and its norm after each step are rows of that optimizer, named from the
    script's variable; the model's parameters stay the model's."""
    monkeypatch.setenv(accelerated.PURE_PYTHON, "1" if pure else "")
    torch.manual_seed(0)
    actor = nn.Linear(3, 2)
    log_alpha = nn.Parameter(torch.zeros(1))
    alpha_opt = torch.optim.Adam([log_alpha], lr=0.01)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=0.01)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        for _ in range(2):
            entropy = actor(torch.randn(4, 3)).softmax(-1).log().mean()
            actor_opt.zero_grad()
            (log_alpha.exp().detach() * entropy).backward()
            actor_opt.step()
            alpha_opt.zero_grad()
            (-log_alpha * entropy.detach()).sum().backward()
            alpha_opt.step()
    t = tables(tmp_path / "run.h5")
    owner = module_id(t, "alpha_opt")
    mine = t["tensors"][t["tensors"]["module"] == owner]
    slots = sorted({(int(r["phase"]), int(r["slot"]), r["path"].decode()) for r in mine})
    assert slots == [
        (Phase.BWD, Slot.PARAM_GRAD, "log_alpha"),
        (Phase.OPT, Slot.PARAM, "log_alpha"),
    ]
    assert sorted(mine["step"].tolist()) == [0, 0, 1, 1]
    kinds = dict(zip(t["modules"]["id"].tolist(), t["modules"]["kind"].tolist(), strict=True))
    assert kinds[owner] == ModuleKind.OPTIMIZER
    actor_rows = t["tensors"][t["tensors"]["module"] == module_id(t, "actor")]
    assert {r["path"].decode() for r in actor_rows if r["slot"] == Slot.PARAM} == {"weight", "bias"}
    own = t["modules"][t["modules"]["id"] == owner]
    assert own["params"].tolist() == [1]


@pytest.mark.parametrize("pure", PATHS)
def test_a_nan_loss_of_plain_tensors_is_one_origin(tmp_path, monkeypatch, pure):
    """The loss is where it was born; the gradient of the tensor it came from follows."""
    monkeypatch.setenv(accelerated.PURE_PYTHON, "1" if pure else "")
    torch.manual_seed(0)
    w = torch.randn(8, 4, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    x = torch.randn(16, 8)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        for step in range(3):
            opt.zero_grad()
            out = x @ w
            (out.log() if step == 1 else out).square().mean().backward()
            opt.step()
    t = tables(tmp_path / "run.h5")
    names = module_names(t)
    alerts = [(int(a["step"]), names[int(a["module"])]) for a in t["alerts"]]
    assert alerts[0] == (1, "loss") and {name for _, name in alerts} == {"loss"}
    assert t["alerts"]["message"][0].startswith(b"NaN first appeared at step 1 in loss")
