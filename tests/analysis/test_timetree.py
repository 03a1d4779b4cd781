"""``time_tree``: a step's calls nested as they ran, with the times the recording holds,
on the host and (where the calls were timed there) on the device."""

import numpy as np
import pytest
import torch
from torch import nn

import hookdbg
from hookdbg.analysis.timetree import time_tree
from hookdbg.read import open_recording
from hookdbg.recorder.hooks import devicetime
from hookdbg.recorder.steps import segments
from hookdbg.store.schema import Phase
from tests.recorder.test_devicetime import HostEvent


def _module_nodes(tree):
    return [(n, d) for n, d in tree.nodes() if n.module is not None]


def test_every_call_of_the_step_once_with_its_recorded_times(mlp_h5):
    with open_recording(mlp_h5) as rec:
        tree = time_tree(rec, 2)
        calls = rec.calls(2, 2)
    assert tree.label == "step 2" and not tree.on_device
    got = sorted((n.module.id, n.phase, n.total, n.self_time) for n, _ in _module_nodes(tree))
    want = sorted(
        (int(r["module"]), int(r["phase"]), float(r["total"]), float(r["self"])) for r in calls
    )
    assert got == want
    assert [s.label for s in tree.root.children] == ["forward", "backward", "optimizer"]


def test_children_sit_under_their_caller_and_fit_in_its_time(mlp_h5):
    with open_recording(mlp_h5) as rec:
        tree = time_tree(rec, 1)
        modules = rec.modules
    for node, _ in tree.nodes():
        assert sum(c.total for c in node.children) <= node.total * (1 + 1e-9) + 1e-12
        for child in node.children:
            if node.module is not None and node.module.is_model_part:
                assert child.module is not None and child.module.parent == node.module.id
                assert child.phase == node.phase
    forward, backward, _ = tree.root.children
    assert [n.module.name for n in forward.children] == ["model", "criterion"]
    body = next(c for c in forward.children[0].children if c.module.name == "model.body")
    assert [c.module.name for c in body.children] == [f"model.body.{i}" for i in range(5)]
    # a backward pass holds the modules' backward rows: under its loss site, whose
    # total is the pass
    (loss,) = backward.children
    assert loss.module == modules.by_name("loss") and loss.module.is_loss
    assert {c.module.name for c in loss.children} == {"model", "criterion"}
    own = loss.total - sum(c.total for c in loss.children)
    assert loss.self_time == pytest.approx(own, abs=1e-9)
    # the root is the step: what the sections leave is time outside recorded modules
    step = rec.steps[rec.steps["step"] == 1][0]
    assert tree.root.total == pytest.approx(float(step["end"] - step["start"]))
    covered = sum(s.total for s in tree.root.children)
    assert tree.root.self_time == pytest.approx(tree.root.total - covered)


def test_two_loss_sites_are_two_passes(gan_h5):
    with open_recording(gan_h5) as rec:
        tree = time_tree(rec, 3)
    backward = next(s for s in tree.root.children if s.phase == Phase.BWD)
    assert [p.module.name for p in backward.children] == ["errD", "errG"]
    assert [sorted(c.module.name for c in p.children) for p in backward.children] == [
        ["disc", "disc"],
        ["disc", "gen"],
    ]


def test_eval_batches_have_their_own_tree(eval_h5):
    with open_recording(eval_h5) as rec:
        tree = time_tree(rec, 1, evals=True)
        batch = rec.evals[1]
        calls = rec.calls(kind=None)
    mine = calls[calls["segment"] == batch["segment"]]
    assert tree.label == "eval batch 1"
    assert sorted(n.total for n, _ in _module_nodes(tree)) == sorted(mine["total"].tolist())
    assert [s.label for s in tree.root.children] == ["forward"]  # no backward in eval


def _train(steps: int = 3) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Sequential(nn.Linear(8, 8), nn.ReLU()))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()


def record_on_device(path, monkeypatch):
    """A CPU model timed as on CUDA, with events on the host's clock
    (tests/recorder/test_devicetime.py): a recording with a device_times table."""
    monkeypatch.setattr(devicetime.torch.cuda, "Event", HostEvent)
    monkeypatch.setattr(segments, "_on_cuda", lambda module: True)
    with hookdbg.record(path, quiet=True):
        _train()
    return path


@pytest.fixture
def device_h5(tmp_path, monkeypatch):
    return record_on_device(tmp_path / "device.h5", monkeypatch)


def test_device_times_beside_the_hosts(device_h5):
    with open_recording(device_h5) as rec:
        tree = time_tree(rec, 1)
        timed = rec.device_times(1, 1)
        calls = rec.calls(1, 1)
    assert tree.on_device
    by_key = {(int(r["call"]), int(r["phase"])): r for r in timed}
    call_of = {
        (int(r["module"]), int(r["phase"]), float(r["total"])): int(r["call"]) for r in calls
    }
    nodes = _module_nodes(tree)
    for node, _ in nodes:
        row = by_key.get((call_of[node.module.id, node.phase, node.total], node.phase))
        if row is None:  # the optimizer step is not timed on the device
            assert node.phase == Phase.OPT and np.isnan(node.device_total)
        else:
            assert (node.device_total, node.device_self) == (row["total"], row["self"])
    forward = tree.root.children[0]
    assert forward.device_total == pytest.approx(sum(c.device_total for c in forward.children))
    assert tree.root.time(device=True) == pytest.approx(
        sum(s.time(device=True) for s in tree.root.children)
    )
