"""Activation checkpointing: checkpointed blocks are recorded like any other block."""

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import hookdbg
from hookdbg.store.schema import Phase, Slot
from tests.helpers import module_names, tables


class Net(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.inp = nn.Linear(8, 16)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16))
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = checkpoint(self.block, self.inp(x), use_reentrant=self.reentrant)
        return self.head(h)


def train(reentrant: bool, path=None) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = Net(reentrant)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    recorder = hookdbg.record(path, quiet=True) if path else None
    if recorder:
        recorder.start()
    try:
        for _ in range(3):
            opt.zero_grad()
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
    finally:
        if recorder:
            recorder.close()
    return [*losses, *(p.detach() for p in model.parameters())]


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointed_blocks_have_backward_times_and_gradients(tmp_path, reentrant):
    plain = train(reentrant)
    recorded = train(reentrant, tmp_path / "run.h5")
    assert all(torch.equal(a, b) for a, b in zip(plain, recorded, strict=True))
    t = tables(tmp_path / "run.h5")
    names = module_names(t)
    calls = t["calls"][t["calls"]["step"] == 1]
    fwd = [names[int(m)] for m in calls["module"][calls["phase"] == Phase.FWD]]
    bwd = {names[int(m)] for m in calls["module"][calls["phase"] == Phase.BWD]}
    # the second run inside backward is no call of its own
    assert sorted(fwd) == sorted(
        ["model", "model.inp", "model.block", "model.head"] + [f"model.block.{i}" for i in range(3)]
    )
    assert {"model.block", "model.block.0", "model.block.1", "model.block.2"} <= bwd
    rows = t["tensors"][(t["tensors"]["step"] == 1) & (t["tensors"]["phase"] == Phase.BWD)]
    grads = [
        (names[int(r["module"])], int(r["slot"]), r["path"].decode())
        for r in rows
        if int(r["slot"]) in (Slot.GRAD_OUTPUT, Slot.GRAD_INPUT)
    ]
    for name in ("model.block", "model.block.0", "model.block.1", "model.block.2"):
        assert grads.count((name, Slot.GRAD_OUTPUT, "")) == 1, name
        assert grads.count((name, Slot.GRAD_INPUT, "0")) == 1, name
