"""torch.compile: the compiled code is untouched and the compiled model is one call."""

import os
import re
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

import hookdbg
from hookdbg.store.schema import Phase
from tests.helpers import hookdbg as run_hookdbg
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
    bwd = t["calls"][t["calls"]["phase"] == Phase.BWD]
    assert len(fwd) == 4 and len(bwd[bwd["module"] == fwd["module"][0]]) == 4
    assert f"{name}.0" in names.values() and "Sequential" in {
        r["type"].decode() for r in t["modules"] if r["name"].decode() == name
    }
    assert (b"compiled", name.encode()) in {(r["key"], r["value"]) for r in t["info"]}
    # hookdbg leaves nothing behind
    assert nn.Module.compile.__qualname__ == "Module.compile"


GRAPH_BREAKS = """
import warnings
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 1)

    def forward(self, x):
        h = self.a(x).relu()
        if h.sum() > 0:  # data-dependent: a graph break, and frames resumed after it
            h = h * 2
        warnings.warn("inside forward")  # its prefix names the frame compiled: [N/M]
        return self.b(h)

torch.manual_seed(0)
model = Net()
step = torch.compile(lambda x: model(x).pow(2).mean(), backend="eager")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(3):
    loss = step(torch.randn(4, 8))
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():  # another grad mode: what a traced hook would recompile on
        step(torch.randn(4, 8))
print(f"{loss.item():.10g}")
"""
# glog's prefix: level, date, time, thread id; and the seconds a compile took
_VOLATILE = re.compile(r"^[VIWE]\d{4} [\d:.]+ +\d+ |\b\d+\.\d{4}\b|id [0-9a-f-]{36}", re.M)


def test_compiling_traces_no_frame_of_hookdbg(tmp_path):
    """Under TORCH_LOGS=recompiles,dynamo the compiler says exactly what it says without
    hookdbg: no hookdbg frame compiled on its own, nothing recompiled because of it."""
    script = tmp_path / "train.py"
    script.write_text(GRAPH_BREAKS)
    env = {"TORCH_LOGS": "recompiles,dynamo"}
    plain = subprocess.run(
        [sys.executable, script], capture_output=True, text=True, env={**os.environ, **env}
    )
    recorded = run_hookdbg("record", "-q", "-o", tmp_path / "run.h5", script, env=env)
    assert plain.returncode == recorded.returncode == 0, recorded.stderr
    assert recorded.stdout == plain.stdout
    assert "hookdbg" not in recorded.stderr
    assert _VOLATILE.sub("", recorded.stderr) == _VOLATILE.sub("", plain.stderr)
