"""Module names: what users call their modules, stable across runs and ranks."""

import functools
import inspect
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import torch
from torch import nn

import hookdbg
from hookdbg.store.schema import ModuleKind
from tests.helpers import hookdbg as run_hookdbg
from tests.helpers import module_names, tables


class Trainer:
    def __init__(self) -> None:
        self.net = nn.Sequential(nn.Linear(2, 2))

    def step(self) -> None:
        self.net(torch.randn(1, 2))


def names(path) -> set[str]:
    return set(module_names(tables(path)).values())


def test_roots_take_the_variable_or_attribute_name(tmp_path):
    classifier = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    trainer = Trainer()
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        classifier(torch.randn(1, 2))
        trainer.step()
        nn.Tanh()(torch.randn(1))  # no variable holds it: its class name
    assert {"classifier", "classifier.0", "classifier.1", "net", "net.0", "Tanh"} <= names(
        tmp_path / "run.h5"
    )


def test_wrappers_are_transparent_so_names_match_unwrapped_runs(tmp_path):
    model = nn.DataParallel(nn.Sequential(nn.Linear(2, 2)))  # no GPU: calls the module
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        model(torch.randn(1, 2))
    t = tables(tmp_path / "run.h5")
    recorded = {module_names(t)[int(m)] for m in t["calls"]["module"]}
    assert recorded == {"model", "model.0"}


def test_a_wrapper_the_user_never_named_takes_its_models_name(tmp_path):
    """A trainer holds the wrapper (Hugging Face's ``trainer.model_wrapped``), the user
    the model: the user's name wins."""
    model = nn.Sequential(nn.Linear(2, 2))
    trainer = types.SimpleNamespace(model_wrapped=nn.DataParallel(model))
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        trainer.model_wrapped(torch.randn(1, 2))
    assert {"model", "model.0"} <= names(tmp_path / "run.h5")
    assert not any(n.startswith("model_wrapped") for n in names(tmp_path / "run.h5"))


def test_modules_outside_named_modules_get_a_clear_name(tmp_path):
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = [nn.Linear(2, 2), nn.Linear(2, 2)]  # a plain list: not registered

        def forward(self, x):
            return self.hidden[1](self.hidden[0](x))

    odd = Odd()
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        odd(torch.randn(1, 2))
    assert {"odd", "odd.<Linear>", "odd.<Linear#2>"} <= names(tmp_path / "run.h5")


def test_submodules_added_after_the_first_call_are_named(tmp_path):
    model = nn.Sequential(nn.Linear(2, 2))
    with hookdbg.record(tmp_path / "run.h5", quiet=True), torch.no_grad():
        model(torch.randn(1, 2))
        model.append(nn.ReLU())
        model(torch.randn(1, 2))
    assert "model.1" in names(tmp_path / "run.h5")


def test_a_submodule_called_directly_is_named_from_its_model(tmp_path):
    model = nn.Module()
    model.head = nn.Sequential(nn.Linear(2, 2), nn.Tanh(), nn.Linear(2, 1))
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        model.head(torch.randn(3, 2)).sum().backward()
    t = tables(tmp_path / "run.h5")
    recorded = {module_names(t)[int(m)] for m in t["calls"]["module"]} - {"loss"}
    assert recorded == {"model.head", "model.head.0", "model.head.1", "model.head.2"}
    out = run_hookdbg("show", tmp_path / "run.h5", "model.head.2")
    assert out.returncode == 0, out.stderr
    assert "model.head.2" in out.stdout


def test_tied_weights_are_counted_once(tmp_path):
    class TinyGPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(100, 16)
            self.block = nn.Linear(16, 16)
            self.lm_head = nn.Linear(16, 100, bias=False)
            self.lm_head.weight = self.wte.weight  # weight tying, as GPT-2 and nanoGPT do

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            return self.lm_head(self.block(self.wte(idx)))

    model = TinyGPT()
    true_count = sum(p.numel() for p in model.parameters())  # parameters() dedups: 1872
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        model(torch.randint(0, 100, (2, 5))).sum().backward()
    assert int(tables(tmp_path / "run.h5")["modules"]["params"].sum()) == true_count
    out = run_hookdbg("summary", "--json", tmp_path / "run.h5")
    assert json.loads(out.stdout)["parameters"] == true_count == 1872


def test_a_loss_module_made_in_each_forward_is_one_module(tmp_path):
    """Hugging Face models build ``CrossEntropyLoss()`` inside ``forward``; scripts do
    ``nn.MSELoss()(out, y)``. Each is a new object every step, but one module to the
    user: one name, one row, not one per step."""

    class WithLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(4, 3)

        def forward(self, x, y):
            return nn.CrossEntropyLoss()(self.body(x), y)

    model = WithLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        for _ in range(6):
            opt.zero_grad()
            loss = model(x, y) + nn.MSELoss()(model.body(x), torch.zeros(8, 3))
            loss.backward()
            opt.step()
    t = tables(tmp_path / "run.h5")
    names = module_names(t)
    assert sorted(n for n in names.values() if "Loss" in n) == [
        "MSELoss",
        "model.<CrossEntropyLoss>",
    ]
    for name in ("MSELoss", "model.<CrossEntropyLoss>"):
        module = next(i for i, n in names.items() if n == name)
        calls = t["calls"][(t["calls"]["module"] == module) & (t["calls"]["phase"] == 0)]
        assert sorted(calls["step"].tolist()) == [0, 1, 2, 3, 4, 5]


def test_a_loss_site_in_code_without_a_file_is_one_module(tmp_path):
    """``python -c``, a notebook's exec'd cell: the line that calls backward has no file
    to name it by, but it is one place, not a new module every step."""
    code = (
        "import torch, hookdbg\n"
        "model = torch.nn.Linear(4, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        f"with hookdbg.record({str(tmp_path / 'run.h5')!r}, quiet=True):\n"
        "    for _ in range(5):\n"
        "        opt.zero_grad()\n"
        "        model(torch.randn(3, 4)).sum().backward()\n"
        "        opt.step()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    t = tables(tmp_path / "run.h5")
    sites = t["modules"][t["modules"]["kind"] == ModuleKind.LOSS]
    assert len(sites) == 1 and len(t["steps"]) == 5, module_names(t)


def logged(forward):
    @functools.wraps(forward)
    def wrapper(*args, **kwargs):
        return forward(*args, **kwargs)

    return wrapper


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(2, 2)])  # no forward of its own
        self.inline = EXECED()  # defined by exec'd code: no file

    @logged  # a decorated forward: the function under the decorator
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inline(self.blocks[0](x)) * 2


INLINE = "from torch import nn\nclass Inline(nn.Module):\n def forward(self, x): return x"
EXECED = types.SimpleNamespace()
exec(INLINE, vars(EXECED))
EXECED = EXECED.Inline


def test_modules_record_where_their_forward_is(tmp_path):
    """What a reader opens in an editor (the TUI's o): each module's file and the first
    line of its class's forward, the loss site's backward() call; ("", 0) where there
    is none: a container without a forward, code without a file, an optimizer."""
    model = Scaled()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        model(torch.randn(1, 2)).sum().backward()  # the loss site
        opt.step()
    rows = tables(tmp_path / "run.h5")["modules"]
    source = {n.decode(): (f.decode(), int(line)) for n, f, line in rows[["name", "file", "line"]]}
    here = os.path.abspath(__file__)
    forward = inspect.unwrap(Scaled.forward).__code__
    assert forward is not Scaled.forward.__code__
    linear = nn.Linear.forward.__code__
    lines = Path(here).read_text().splitlines()
    loss_line = next(i for i, x in enumerate(lines, 1) if ").sum().backward()  #" in x)
    # a decorated function's code starts at the decorator; the editor goes to the def
    assert lines[forward.co_firstlineno - 1].lstrip().startswith("@logged")
    assert lines[forward.co_firstlineno].lstrip().startswith("def forward")
    assert source == {
        "model": (here, forward.co_firstlineno + 1),
        "model.blocks": ("", 0),
        "model.blocks.0": (os.path.abspath(linear.co_filename), linear.co_firstlineno),
        "model.inline": ("", 0),
        "loss": (here, loss_line),
        "opt": ("", 0),
    }
