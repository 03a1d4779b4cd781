"""Sharded training in one process (a world of one rank, gloo): FSDP2 and tensor
parallel put DTensors in parameters, gradients and activations, and subclasses whose
storage is not their values (a DTensor's data_ptr is its storage offset). Every step is
recorded, with each tensor's local shard summarised, on the C path and the Python one.
The real multi-rank runs are tests/cli/test_sharded_runs.py."""

import contextlib

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

import hookdbg
from hookdbg.read import open_recording
from hookdbg.recorder import accelerated
from hookdbg.store.schema import Phase, Slot

PATHS = [pytest.param(False, id="c"), pytest.param(True, id="python")]


@contextlib.contextmanager
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def train(model: nn.Module, steps: int = 3, rec=None) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for i in range(steps):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(i))
        loss = model(x).pow(2).mean()
        if rec is not None:
            rec.flush()  # rows handed over between a step's forward and its backward
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def fsdp_model() -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    fully_shard(model[0])
    fully_shard(model)
    return model


def tp_model() -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    mesh = init_device_mesh("cpu", (1,))
    return parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


@pytest.mark.parametrize("make", [fsdp_model, tp_model], ids=["fsdp2", "tp"])
@pytest.mark.parametrize("pure", PATHS)
def test_sharded_models_are_recorded_every_step_and_train_the_same(
    tmp_path, monkeypatch, make, pure
):
    monkeypatch.setenv(accelerated.PURE_PYTHON, "1" if pure else "")
    with world_of_one():
        plain = train(make())
        with hookdbg.record(tmp_path / "run.h5", quiet=True) as rec:
            recorded = train(make(), rec=rec)
            assert rec.guard.live, "the recording stopped on an internal error"
    assert recorded == plain  # bitwise: recording changes nothing
    with open_recording(tmp_path / "run.h5") as r:
        assert len(r.steps) == 3 and r.end is not None
        rows = r.tensors(columns=["module", "phase", "slot", "path", "shape", "norm"])
        grads = rows[(rows["slot"] == Slot.PARAM_GRAD) & (rows["path"] == b"weight")]
        weights = rows[(rows["slot"] == Slot.PARAM) & (rows["phase"] == Phase.OPT)]
        assert len(grads) == 6 and len(weights) == 12  # 2 weights x 3 steps; + biases
        assert np.isfinite(grads["norm"]).all() and (grads["norm"] > 0).all()
        assert len(r.losses) == 3 and r.losses["value"].tolist() == plain
        # where every sharded weight and gradient lies, also those seen after a hand-over
        sharded = {(r.modules.name(m), ph, slot, path) for m, ph, slot, path in r.shards}
        for module in ("model.0", "model.2"):
            for path in ("weight", "bias"):
                assert (module, Phase.OPT, Slot.PARAM, path) in sharded, (module, path)
                assert (module, Phase.BWD, Slot.PARAM_GRAD, path) in sharded, (module, path)


def test_a_group_made_without_a_backend_names_its_backends(tmp_path):
    """``init_process_group()`` with no backend (what ``init_device_mesh`` does) gives a
    group torch calls ``undefined``: the recording names the backends it holds."""
    dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert dist.get_backend() == "undefined"
        with hookdbg.record(tmp_path / "run.h5", quiet=True):
            nn.Linear(4, 1)(torch.randn(2, 4)).sum().backward()
    finally:
        dist.destroy_process_group()
    rec = open_recording(tmp_path / "run.h5")
    assert "gloo" in rec.info.backend.split(","), rec.info.backend
