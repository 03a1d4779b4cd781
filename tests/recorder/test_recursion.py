"""What recording costs the stack: torch's one frame per nested module call while global
hooks are installed, and the room the recorder makes for it under the recursion limit
(recorder/hooks/recursion.py)."""

import sys

import pytest
import torch
from torch import nn

import hookdbg
from hookdbg.recorder import accelerated
from hookdbg.recorder.hooks.recursion import room
from tests.cli.nested_chain import chain


def headroom(depth: int = 0) -> int:
    """How many more calls fit under the recursion limit here."""
    try:
        return headroom(depth + 1)
    except RecursionError:
        return depth


class Probe(nn.Module):
    """The innermost module of a chain: measures the headroom left inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.left = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.left = headroom()
        return x * 2


def units_per_level() -> float:
    """The recursion limit one level of nested module calls takes, from the headroom
    left at the bottom of chains 10 and 40 deep."""
    left = []
    for depth in (10, 40):
        probe = Probe()
        model = chain(depth)
        last = model
        while last.inner is not None:
            last = last.inner
        last.inner = probe
        model(torch.ones(1, 4, requires_grad=True)).sum().backward()
        left.append(probe.left)
    return (left[0] - left[1]) / 30


@pytest.mark.parametrize("pure", [False, True], ids=["c", "python"])
def test_recording_adds_one_frame_per_nested_call(tmp_path, monkeypatch, pure):
    """torch's ``_call_impl`` runs forward inside a closure while hooks are installed;
    hookdbg adds nothing per level on top of it, on either per-call path."""
    monkeypatch.setenv(accelerated.PURE_PYTHON, "1" if pure else "")
    plain = units_per_level()
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        recorded = units_per_level()
    assert recorded - plain == 1, (plain, recorded)


def test_the_limit_makes_room_follows_the_script_and_is_put_back(tmp_path):
    before = sys.getrecursionlimit()
    model = nn.Sequential(nn.Linear(2, 2))
    try:
        with hookdbg.record(tmp_path / "run.h5", quiet=True):
            assert sys.getrecursionlimit() == room(before) > before + before // 3
            sys.setrecursionlimit(5000)  # as a script with a deep model does
            model(torch.ones(1, 2)).sum().backward()  # a step begins: the room follows
            assert sys.getrecursionlimit() == room(5000)
            sys.setrecursionlimit(4000)
        assert sys.getrecursionlimit() == 4000  # set since the last step: the script's
        with hookdbg.record(tmp_path / "again.h5", quiet=True):
            model(torch.ones(1, 2))
        assert sys.getrecursionlimit() == 4000  # the script's own, put back
    finally:
        sys.setrecursionlimit(before)
