"""The per-call path in C (hookdbg/recorder/_hot.c) against the Python one it stands for.

Each workload below is recorded twice in this process, with HOOKDBG_PURE_PYTHON=1 and
without, and every table of the two recordings must be the same, row for row and
column for column, except the columns that hold times.
"""

import contextlib
import math
import time

import h5py
import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call, functionalize, grad, vmap
from torch.utils.checkpoint import checkpoint

import hookdbg
from hookdbg.options import RecordOptions
from hookdbg.recorder import Recorder, accelerated
from hookdbg.recorder.calls import calls, envelope

pytestmark = pytest.mark.skipif(
    accelerated._hot is None, reason="the C extension hookdbg.recorder._hot is not built"
)

# columns that hold times (they differ between any two runs)
TIMES = {
    "calls": {"start", "total", "self"},
    "device_times": {"total", "self"},
    "steps": {"start", "end", "overhead"},
    "alerts": {"time"},
}
SKIP = {"info", "end", "progress"}  # wall-clock times, the writer's pace


def _record(path, workload, pure: bool, **options) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(accelerated.PURE_PYTHON, "1" if pure else "")
        with hookdbg.record(path, quiet=True, **options) as rec:
            torch.manual_seed(0)
            with contextlib.suppress(hookdbg.NonFiniteError):
                workload()
            assert rec.guard.live, "the recording stopped on an internal error"
        expected = accelerated.FastModuleHooks if not pure else accelerated.ModuleHooks
        assert type(rec._calls) is expected


def _columns(path) -> dict[str, dict[str, np.ndarray]]:
    """Every column of every table, read with h5py alone (a histogram column is 2-D)."""
    with h5py.File(path, "r", swmr=True) as f:
        return {
            name: {column: group[column][()] for column in group}
            for name, group in f.items()
            if isinstance(group, h5py.Group)
        }


def assert_same_recordings(a, b) -> None:
    ta, tb = _columns(a), _columns(b)
    assert ta.keys() == tb.keys()
    for name in ta.keys() - SKIP:
        assert ta[name].keys() == tb[name].keys(), name
        for column in ta[name].keys() - TIMES.get(name, set()):
            u, v = ta[name][column], tb[name][column]
            assert u.shape == v.shape, f"{name}.{column}: {u.shape} against {v.shape}"
            same = u == v
            if u.dtype.kind == "f":
                same |= np.isnan(u) & np.isnan(v)
            if not np.all(same):
                row = int(np.argwhere(~same)[0][0])
                raise AssertionError(f"{name}.{column} differs at row {row}: {u[row]} != {v[row]}")


def mlp_with_eval():
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        opt.zero_grad()
        model(torch.randn(5, 6)).pow(2).mean().backward()
        opt.step()
        if step % 2:
            model.eval()
            with torch.no_grad():
                model(torch.randn(3, 6))
            with torch.inference_mode():
                model(torch.randn(3, 6))
            model.train()


class Scale(nn.Module):
    def forward(self, x):
        return x * 2.0


def inference_input():
    """Batches made under inference_mode (as a data pipeline may) and trained on: the
    first call's input is an inference tensor, which has no version counter, seen
    with gradients on."""
    model = nn.Sequential(Scale(), nn.Linear(4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        with torch.inference_mode():
            x = torch.randn(5, 4)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


class Passes(nn.Module):
    """Returns what it is given, as a module that only passes tensors along does."""

    def forward(self, *tensors):
        return tensors


# made once: its ragged size is named by a process-wide counter (2,j1,3), which a tensor
# made in each recording would advance
JAGGED = torch.nested.nested_tensor([torch.ones(1, 3), torch.ones(3, 3)], layout=torch.jagged)


def odd_tensors():
    """Tensors of every kind a summary treats apart: empty, half and bfloat16, integer,
    bool, complex, transposed (not contiguous), sparse, jagged nested and a 0-d scalar."""
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    passes = Passes()
    for _ in range(2):
        opt.zero_grad()
        out = model(torch.randn(4, 3))
        passes(
            torch.zeros(0, 3),
            out.detach().half(),
            out.detach().bfloat16(),
            torch.arange(6, dtype=torch.int8),
            out > 0,
            torch.randn(2, 2, dtype=torch.complex64),
            out.t(),
            torch.eye(3).to_sparse(),
            JAGGED,
            out.sum(),
        )
        out.pow(2).mean().backward()
        opt.step()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)) + x)


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.act = nn.ReLU(inplace=True)
        self.block = Block()  # called twice: a shared module
        self.head = nn.Linear(4 * 8 * 8, 3)

    def forward(self, x):
        x = self.block(self.block(self.act(self.stem(x))))
        return self.head(x.flatten(1))


def convnet():
    model = ConvNet()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(3):
        opt.zero_grad()
        loss_fn(model(torch.randn(2, 3, 8, 8)), torch.tensor([0, 2])).backward()
        opt.step()


class LanguageModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.lstm = nn.LSTM(8, 8, batch_first=True)
        self.out = nn.Linear(8, 20)

    def forward(self, tokens, hidden):
        y, hidden = self.lstm(self.embed(tokens), hidden)
        return self.out(y), hidden


def lstm_by_hand():
    model = LanguageModel()
    hidden = (torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))
    for _ in range(3):
        tokens = torch.randint(0, 20, (2, 5))
        logits, hidden = model(tokens, hidden)
        hidden = tuple(h.detach() for h in hidden)
        loss = nn.functional.cross_entropy(logits.reshape(-1, 20), tokens.reshape(-1))
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-0.1)


def transformer_with_masks():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    for _ in range(2):
        opt.zero_grad()
        out = model(torch.randn(2, 5, 8), mask=causal, src_key_padding_mask=padding)
        out.pow(2).mean().backward()
        opt.step()


def checkpointed():
    inner = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6))
    outer = nn.Linear(6, 1)
    opt = torch.optim.SGD([*inner.parameters(), *outer.parameters()], lr=0.1)
    for reentrant in (True, False, True):
        opt.zero_grad()
        x = torch.randn(4, 6, requires_grad=True)
        outer(checkpoint(inner, x, use_reentrant=reentrant)).sum().backward()
        opt.step()


def torch_func():
    """torch.func's transforms: modules see wrappers with no storage of their own."""
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.randn(5, 6), torch.randn(5, 1)

    def loss(p, xb, yb):
        return (functional_call(model, p, (xb,)) - yb).pow(2).mean()

    for _ in range(2):
        g = grad(loss)(params, x, y)
        params = {k: v - 0.1 * g[k] for k, v in params.items()}
    vmap(grad(loss), in_dims=(None, 0, 0))(params, x[:, None], y[:, None])
    vmap(nn.Sequential(nn.Flatten(0), model), in_dims=1)(x.view(2, 5, 3))  # views, batch on 1
    with torch.no_grad():
        functionalize(model)(x)  # wrappers whose data_ptr is 0
    grad(lambda p: functional_call(model, p, (x,)).log().sum())(params)  # NaN, outside it


class Explode(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * math.inf


class Blows(nn.Module):
    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 1)

    def forward(self, x, step: int):
        h = self.a(x)
        if step == 2 and self.where == "forward":
            h = torch.log(h - 100)
        if step == 2 and self.where == "backward":
            h = Explode.apply(h)
        return self.b(h)


def nan_in(where: str):
    def workload():
        model = Blows(where)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            opt.zero_grad()
            model(torch.randn(3, 4), step).sum().backward()
            opt.step()

    return workload


def weight_norm_read_at_build():
    """A parametrized weight read with no module call around (at build time, as Hugging
    Face's initialisation does), then inside the forward of the module that holds it."""
    conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(2, 4, 3))
    with torch.no_grad():
        conv.weight.std()
    opt = torch.optim.SGD(conv.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        conv(torch.randn(2, 2, 6)).square().mean().backward()
        opt.step()


def plain_tensors():
    """No nn.Module: tensors, an optimizer, a loss; and a loss module beside them."""
    w = torch.randn(6, 3, requires_grad=True)
    scale = nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([w, scale], lr=0.1)
    mse = nn.MSELoss()
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    for step in range(3):
        opt.zero_grad()
        out = (x @ w) * scale
        (mse(out, y) if step == 2 else (out - y).square().mean()).backward()
        opt.step()


WORKLOADS = {
    "mlp_with_eval": mlp_with_eval,
    "inference_input": inference_input,
    "odd_tensors": odd_tensors,
    "convnet": convnet,
    "lstm_by_hand": lstm_by_hand,
    "transformer_with_masks": transformer_with_masks,
    "checkpointed": checkpointed,
    "torch_func": torch_func,
    "nan_in_forward": nan_in("forward"),
    "nan_in_backward": nan_in("backward"),
    "weight_norm_read_at_build": weight_norm_read_at_build,
    "plain_tensors": plain_tensors,
}

OPTIONS = {
    "stats": {},
    "timing": {"level": "timing"},
    "shapes": {"level": "shapes"},
    "histograms": {"histograms": 8},
    "every_2": {"every": 2},
    "no_flight_recorder": {"flight_recorder_mb": 0},
    "small_flight_recorder": {"flight_recorder_mb": 0.0003},  # 300 bytes: a few tensors
    "capture": {"capture": "*", "capture_steps": "1:2"},
    "some_modules": {"modules": ["*.a", "*.block*", "*.lstm", "*.layers.0*", "*.0"]},
    "device_path": {},  # statistics through the device batch (defer_cpu)
}


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("workload", WORKLOADS)
def test_the_c_path_records_what_the_python_path_records(tmp_path, workload, options):
    kwargs = dict(OPTIONS[options])
    if options == "device_path":
        kwargs["on_nan"] = "warn"
    pure, fast = tmp_path / "pure.h5", tmp_path / "fast.h5"
    for path, is_pure in ((pure, True), (fast, False)):
        if options == "device_path":
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv(accelerated.PURE_PYTHON, "1" if is_pure else "")
                with Recorder(
                    path, RecordOptions.build(quiet=True, **kwargs), defer_cpu=True
                ) as rec:
                    torch.manual_seed(0)
                    with contextlib.suppress(hookdbg.NonFiniteError):
                        WORKLOADS[workload]()
                    assert rec.guard.live, "the recording stopped on an internal error"
        else:
            _record(path, WORKLOADS[workload], is_pure, **kwargs)
    assert_same_recordings(pure, fast)


def _fields(obj) -> dict[str, object]:
    names = sorted(n for n in dir(obj) if not n.startswith("__") and not callable(getattr(obj, n)))
    return {n: getattr(obj, n) for n in names if n not in ("ref", "info", "grad_slots")}


def test_the_c_records_are_the_python_records():
    """Call, SeenTensor and Guard in C (the C path's, accelerated.chosen()) have the Python
    classes' attributes, methods and starting values (calls.py, envelope.py)."""
    hot = accelerated._hot
    info = object()
    t = torch.zeros(2)
    c_call = hot.Call(3, info, 1, None, 0.5)
    py_call = calls.Call(3, info, 1, None, 0.5)
    assert _fields(c_call) == _fields(py_call)
    child = hot.Call(4, info, 0, c_call, 1.0)
    assert child.depth == 1 and child.parent is c_call and child.bwd_self == 0.0
    child.note_inf_below("birth")
    child.mark_below_bad()
    assert c_call.inf_below == "birth" and c_call.below_bad

    c_seen = hot.SeenTensor(t, 7, None, True, 2)
    py_seen = calls.SeenTensor(t, 7, None, True, 2)
    assert _fields(c_seen) == _fields(py_seen) and c_seen.ref() is t
    c_seen.grad_slots.extend((child, 3, "0"))
    assert c_seen.slots() == [(child, 3, "0")]

    c_guard = hot.Guard()
    py_guard = envelope.Guard()
    assert {"live", "overhead", "alerts"} <= set(_fields(c_guard))
    assert (c_guard.live, c_guard.overhead, c_guard.alerts) == (
        py_guard.live,
        py_guard.overhead,
        [],
    )
    for guard in (c_guard, py_guard):  # act: the actions, their time counted as hookdbg's
        acted: list[object] = []
        guard.actions = lambda acted=acted: acted.append(time.sleep(0.002))
        with guard.lock:
            assert guard.act() is None
        assert acted == [None] and guard.overhead >= 0.002
