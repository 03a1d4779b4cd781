"""The names the C path (hookdbg/recorder/_hot.c) uses on Python objects are the names
cboundary.py declares, the Python methods among them are marked where they are
defined, and a recording whose names are not all there records with the Python path,
saying why, instead of breaking at the first call that needs one."""

import re
import types
from pathlib import Path

import pytest
import torch
from torch import nn

import hookdbg
from hookdbg.read import open_recording
from hookdbg.recorder import accelerated
from hookdbg.recorder.calls import calls, cboundary, envelope
from hookdbg.recorder.hooks.modulehooks import ModuleHooks

HOT_C = Path(accelerated.__file__).with_name("_hot.c")


def names_in_hot_c(source: str) -> set[str]:
    """Every name _hot.c interns or looks up on an object by a string literal."""
    macro = re.search(r"#define NAMES\(X\)(.*?)\n\s*#define", source, re.S)
    assert macro is not None, "_hot.c's NAMES macro not found"
    names = set(re.findall(r"X\((\w+)\)", macro.group(1)))
    names |= set(re.findall(r"\bs_\w+ = PyUnicode_InternFromString\(\"(\w+)\"\)", source))
    names |= set(re.findall(r"PyObject_\w*AttrString\(\s*\w+,\s*\"(\w+)\"", source))
    names |= set(re.findall(r"PyObject_CallMethod\w*\(\s*\w+,\s*\"(\w+)\"", source))
    return names


def test_hot_c_uses_exactly_the_declared_names():
    """A name used in C but not declared fails, and so does one declared but unused."""
    source = HOT_C.read_text()
    used = names_in_hot_c(source)
    declared = {entry.name for entry in cboundary.BOUNDARY}
    assert used - declared == set(), "used in _hot.c, not declared in cboundary.py"
    assert declared - used == set(), "declared in cboundary.py, not used in _hot.c"
    macro, body = source.split("#define DECLARE", 1)
    interned = set(re.findall(r"X\((\w+)\)", macro.split("#define NAMES", 1)[1]))
    assert {n for n in interned if not re.search(rf"\bs_{n}\b", body)} == set()


def test_the_parser_sees_what_c_looks_up():
    """The test above reads each way _hot.c names an attribute."""
    source = """
    #define NAMES(X) X(alpha) X(_beta)
    #define DECLARE(n) static PyObject *s_##n;
    s_gamma = PyUnicode_InternFromString("gamma");
    G.cpu = PyUnicode_InternFromString("cpu");
    v = PyObject_GetAttrString(mod, "delta");
    PyObject_SetAttrString(obj, "epsilon", v);
    r = PyObject_CallMethod(
        err, "write", "s", "text");
    """
    assert names_in_hot_c(source) == {"alpha", "_beta", "gamma", "delta", "epsilon", "write"}


def test_every_python_method_c_calls_is_marked_where_it_is_defined():
    marked = set(cboundary.MARKED)
    reached = set()
    for entry in cboundary.BOUNDARY:
        if not entry.owner.startswith("hookdbg."):
            continue
        found = getattr(cboundary.resolve(entry.owner), entry.name, None)
        if isinstance(found, types.FunctionType):
            where = f"{found.__module__}:{found.__qualname__}"
            assert where in marked, f"{where} is called from _hot.c: mark it @called_from_c"
            reached.add(where)
    assert marked - reached == set(), "marked @called_from_c, not declared in cboundary.py"


@pytest.mark.skipif(accelerated._hot is None, reason="hookdbg.recorder._hot is not built")
def test_every_declared_name_is_there():
    assert cboundary.missing() == []


def test_no_class_is_swapped_at_import():
    """calls.py and envelope.py define the classes that run on the Python path; the C
    path's twins come with the path, from accelerated.chosen()."""
    assert calls.Call.__module__ == "hookdbg.recorder.calls.calls"
    assert calls.SeenTensor.__module__ == "hookdbg.recorder.calls.calls"
    assert envelope.Guard.__module__ == "hookdbg.recorder.calls.envelope"


def _train(steps: int = 3) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        loss = model(torch.randn(5, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.skipif(accelerated._hot is None, reason="hookdbg.recorder._hot is not built")
def test_each_path_records_with_its_own_records(tmp_path, monkeypatch):
    monkeypatch.setenv(accelerated.PURE_PYTHON, "")
    with hookdbg.record(tmp_path / "c.h5", quiet=True) as rec:
        _train(1)
        made = rec._calls.state.calls
        assert type(rec.guard) is accelerated._hot.Guard
        assert made and all(type(c) is accelerated._hot.Call for c in made)
    monkeypatch.setenv(accelerated.PURE_PYTHON, "1")
    with hookdbg.record(tmp_path / "py.h5", quiet=True) as rec:
        _train(1)
        made = rec._calls.state.calls
        assert type(rec.guard) is envelope.Guard
        assert made and all(type(c) is calls.Call for c in made)


@pytest.mark.skipif(accelerated._hot is None, reason="hookdbg.recorder._hot is not built")
def test_a_missing_name_records_with_the_python_path_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(accelerated.PURE_PYTHON, "")
    renamed = cboundary.Name("_root_renamed", "hookdbg.recorder.hooks.modulehooks:ModuleHooks", "t")
    monkeypatch.setattr(cboundary, "BOUNDARY", (*cboundary.BOUNDARY, renamed))
    accelerated._boundary_gaps.cache_clear()
    try:
        with hookdbg.record(tmp_path / "run.h5") as rec:
            _train()
            assert type(rec._calls) is ModuleHooks
    finally:
        accelerated._boundary_gaps.cache_clear()
    said = capsys.readouterr().err
    assert "hookdbg.recorder.hooks.modulehooks:ModuleHooks._root_renamed" in said
    assert "recording with the Python path" in said
    with open_recording(tmp_path / "run.h5") as r:
        assert r.info.per_call_path == "Python"
        assert len(r.steps) == 3
