"""A recording holds nothing alive that the script let go: after ``del`` and
``gc.collect()``, a module's input and output, the module, its parameter and its
optimizer are gone while recording goes on, at every level, on the host's path and on
the device's (``defer_cpu``: statistics and checks wait for the step to be read back),
as without hookdbg. The flight recorder holds tensors within its budget, and only
those."""

import gc
import weakref

import pytest
import torch
from torch import nn

from hookdbg.options import RecordOptions
from hookdbg.recorder.core import Recorder

NAMES = ("input", "output", "model", "linear", "weight", "optimizer")


def phase() -> list[weakref.ref]:
    """A few training steps of a model of their own; weak references to what they used."""
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        x = torch.randn(5, 4)
        out = model(x)
        out.pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return [weakref.ref(o) for o in (x, out, model, model[0], model[0].weight, opt)]


def alive(refs: list[weakref.ref]) -> list[str]:
    gc.collect()
    return [name for name, ref in zip(NAMES, refs, strict=True) if ref() is not None]


@pytest.mark.parametrize("defer", [False, True], ids=["host", "deferred"])
@pytest.mark.parametrize(
    "options",
    [
        {"level": "timing"},
        {"level": "timing", "nan_check": True},
        {"level": "shapes", "nan_check": True},
        {"level": "stats"},
        {"level": "stats", "histograms": 8},
    ],
    ids=lambda o: "-".join(map(str, o.values())),
)
def test_what_the_script_lets_go_is_freed_while_recording(tmp_path, options, defer):
    assert alive(phase()) == []  # without hookdbg
    recording = RecordOptions.build(quiet=True, flight_recorder_mb=0, **options)
    with Recorder(tmp_path / "run.h5", recording, defer_cpu=defer):
        assert alive(phase()) == []  # the last step still open
        assert alive(phase()) == []  # and after a step of another model began


@pytest.mark.parametrize("defer", [False, True], ids=["host", "deferred"])
def test_the_flight_recorder_holds_tensors_only(tmp_path, defer):
    recording = RecordOptions.build(quiet=True, flight_recorder_mb=1)
    with Recorder(tmp_path / "run.h5", recording, defer_cpu=defer):
        held = alive(phase())
    assert set(held) <= {"input", "output", "weight"}, held  # copies within the budget
