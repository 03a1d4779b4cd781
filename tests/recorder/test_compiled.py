"""torch.compile: the compiled code is untouched and the compiled model is one call."""

import warnings

import pytest
import torch
from torch import nn

import hookdbg
from hookdbg.store.schema import Phase
from tests.helpers import module_names, tables


def train(mode: str, path=None) -> tuple[list[str], dict]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 1))
    if mode == "wrapper":
        net = torch.compile(model)
    else:
        model.compile()
        net = model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch._dynamo.reset()  # compile afresh: same graphs and counts expected either way
    torch._dynamo.utils.counters.clear()
    recorder = hookdbg.record(path, quiet=True).start() if path else None
    losses = []
    try:
        for i in range(4):
            x = torch.randn(16, 8, generator=torch.Generator().manual_seed(i))
            opt.zero_grad()
            loss = net(x).pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item().hex())
    finally:
        if recorder:
            recorder.close()
    counters = torch._dynamo.utils.counters
    return losses, {k: dict(v) for k, v in counters.items() if k in ("stats", "recompiles")}


@pytest.mark.parametrize("mode", ["wrapper", "in place"])
def test_compiled_model_is_bit_identical_and_recorded_as_one_call(tmp_path, mode):
    plain, plain_counts = train(mode)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recorded, counts = train(mode, tmp_path / "run.h5")
    assert recorded == plain  # the same losses to the last bit
    assert counts == plain_counts and "recompiles" not in counts  # one graph, no recompiles
    assert not [w for w in caught if "hook" in str(w.message)]
    t = tables(tmp_path / "run.h5")
    names = module_names(t)
    name = "net" if mode == "wrapper" else "model"
    fwd = t["calls"][t["calls"]["phase"] == Phase.FWD]
    assert {names[int(m)] for m in fwd["module"]} == {name}  # one call, the user's name
    assert len(fwd) == 4 and len(t["calls"][t["calls"]["phase"] == Phase.BWD]) == 4
    assert f"{name}.0" in names.values() and "Sequential" in {
        r["type"].decode() for r in t["modules"] if r["name"].decode() == name
    }
    assert (b"compiled", name.encode()) in {(r["key"], r["value"]) for r in t["info"]}
    # hookdbg leaves nothing behind
    assert nn.Module.compile.__qualname__ == "Module.compile"
