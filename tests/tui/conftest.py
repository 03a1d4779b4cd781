import importlib.util

import pytest

from tests.cli.test_distributed import torchrun
from tests.helpers import ROOT, SAMPLES
from tests.helpers import torchrun as launch


@pytest.fixture(scope="session")
def long_mlp_h5(tmp_path_factory):
    """samples/numnet_mlp.py, 60 steps: enough to hold a key down on."""
    from tests.conftest import _record

    return _record(tmp_path_factory, "mlp60", SAMPLES / "numnet_mlp.py", "--steps", "60")


# a model that returns a dict, as Hugging Face models do, around a MultiheadAttention,
# which returns a tuple
DICT_OUTPUT = """
import torch
from torch import nn


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.Tanh())
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x, labels):
        h = self.body(x)
        h, _ = self.attn(h, h, h)
        logits = self.head(h).mean(1)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


torch.manual_seed(0)
model = LM()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    opt.zero_grad()
    out = model(torch.randn(3, 5, 8), torch.randint(0, 4, (3,)))
    out["loss"].backward()
    opt.step()
"""


@pytest.fixture(scope="session")
def dict_output_h5(tmp_path_factory):
    """5 steps of a model returning {"loss", "logits"}, with a MultiheadAttention in it."""
    from tests.conftest import _record

    script = tmp_path_factory.mktemp("dict-output") / "dict_output.py"
    script.write_text(DICT_OUTPUT)
    return _record(tmp_path_factory, "dict_output", script)


@pytest.fixture(scope="session")
def rootless_h5(tmp_path_factory):
    """A recording whose modules have no root row, written as benchmarks/reader.py does."""
    spec = importlib.util.spec_from_file_location("bench_reader", ROOT / "benchmarks" / "reader.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = tmp_path_factory.mktemp("rootless") / "bench.h5"
    bench.build(path, 8 * bench.ROWS_PER_STEP)
    return path


@pytest.fixture(scope="session")
def mlp_lr_h5(tmp_path_factory):
    """samples/numnet_mlp.py as mlp_h5 records it with twice the learning rate: the runs
    part in the first optimizer step, model.body.1's weights first (by 2e-5 in the norm)."""
    from tests.conftest import _record

    return _record(
        tmp_path_factory, "mlp_lr", SAMPLES / "numnet_mlp.py", "--steps", "4", "--lr", "0.2"
    )


@pytest.fixture(scope="session")
def ddp_nan_h5(tmp_path_factory):
    """samples/ddp_train.py on 2 ranks, 5 steps; rank 1's batch holds a NaN at step 2:
    rank 1's alert says it came from the data, rank 0's that it came from another rank
    through the all-reduce."""
    out = tmp_path_factory.mktemp("ddp") / "nan.h5"
    done = torchrun(out, "--nan-rank", "1", "--nan-step", "2")
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="session")
def fsdp_h5(tmp_path_factory):
    """samples/fsdp2_train.py on 2 ranks, 3 steps: FSDP2's DTensor shards, merged into
    the global tensors' statistics with G."""
    out = tmp_path_factory.mktemp("fsdp") / "fsdp.h5"
    record = ("-m", "hookdbg", "record", "-q", "-o", out)
    done = launch(*record, SAMPLES / "fsdp2_train.py", "--steps", "3", timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


# a weight that moves in its fifth digit: its output's statistics over the steps differ
# where 4 digits read the same (1023 and 1023)
CREEPING = """
import torch
from torch import nn

model = nn.Linear(1, 1, bias=False)
with torch.no_grad():
    model.weight.fill_(1023.0)
opt = torch.optim.SGD(model.parameters(), lr=1.0)
for step in range(5):
    opt.zero_grad()
    (model(torch.ones(4, 1)).sum() * 2.5e-4).backward()
    opt.step()
"""


@pytest.fixture(scope="session")
def creeping_h5(tmp_path_factory):
    """5 steps of one Linear whose output goes from 1023 to 1022.996."""
    from tests.conftest import _record

    script = tmp_path_factory.mktemp("creeping") / "creeping.py"
    script.write_text(CREEPING)
    return _record(tmp_path_factory, "creeping", script)


# a model two layers deeper with --deeper: net.3 and net.4 exist only there
DEPTH = """
import sys, torch
from torch import nn
torch.manual_seed(0)
layers = [nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2)]
if "--deeper" in sys.argv:
    layers[2:] = [nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2)]
net = nn.Sequential(*layers)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    net(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
"""


@pytest.fixture(scope="session")
def two_models(tmp_path_factory):
    """The same small model, and one two layers deeper: net.3 and net.4 only in b."""
    from tests.helpers import hookdbg

    base = tmp_path_factory.mktemp("compare-models")
    (base / "depth.py").write_text(DEPTH)
    for name, args in (("shallow", []), ("deep", ["--deeper"])):
        out = hookdbg("record", "-q", "-o", base / f"{name}.h5", base / "depth.py", *args)
        assert out.returncode == 0, out.stderr
    return base / "shallow.h5", base / "deep.h5"
