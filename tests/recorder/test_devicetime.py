"""Module times on the device (recorder/hooks/devicetime.py). Without a GPU the device clock
runs on events that read the host's clock (``HostEvent``) and a CPU model counts as
on CUDA: the whole path, from the hooks (the C path's and the Python path's) to the
``device_times`` table and ``profile``, with times that must add up as the host's do.
With a GPU the same recording runs on CUDA events."""

import time

import numpy as np
import pytest
import torch
from torch import nn

import hookdbg
from hookdbg.analysis.profile import profile
from hookdbg.read import open_recording
from hookdbg.recorder import accelerated
from hookdbg.recorder.hooks import devicetime
from hookdbg.recorder.steps import segments
from hookdbg.store.schema import Phase
from tests.helpers import tables

CUDA = torch.cuda.is_available()


class HostEvent:
    """A CUDA event's interface over the host's clock: what the device clock reads."""

    made = 0

    def __init__(self, enable_timing: bool = False) -> None:
        HostEvent.made += 1
        self.at: float | None = None

    def record(self, stream=None) -> None:
        self.at = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "HostEvent") -> float:
        assert self.at is not None and end.at is not None
        return (end.at - self.at) * 1e3


@pytest.fixture
def device(monkeypatch):
    """'cuda' with a GPU; else 'cpu', with host events and a CPU model timed as on CUDA."""
    if CUDA:
        return "cuda"
    monkeypatch.setattr(devicetime.torch.cuda, "Event", HostEvent)
    monkeypatch.setattr(segments, "_on_cuda", lambda module: True)
    return "cpu"


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.out = nn.Linear(16, 16)

    def forward(self, x):
        return self.out(self.inner(x))


def train(device: str, steps: int = 4) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(Block(), nn.ReLU(), Block()).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 16, device=device)
    for _ in range(steps):
        opt.zero_grad()
        (model(x).pow(2).mean() * 2).backward()
        opt.step()


@pytest.mark.parametrize("pure", [False, True], ids=["c", "python"])
def test_every_recorded_call_has_device_times_that_add_up(tmp_path, device, monkeypatch, pure):
    if not pure and accelerated._hot is None:
        pytest.skip("the C extension hookdbg.recorder._hot is not built")
    monkeypatch.setenv(accelerated.PURE_PYTHON, "1" if pure else "")
    path = tmp_path / "run.h5"
    with hookdbg.record(path, quiet=True) as rec:
        train(device)
        assert rec.guard.live
    t = tables(path)
    calls, timed = t["calls"], t["device_times"]
    key = {(int(r["call"]), int(r["phase"])) for r in calls if r["phase"] != Phase.OPT}
    assert {(int(r["call"]), int(r["phase"])) for r in timed} == key
    assert (timed["self"] >= 0).all() and (timed["self"] <= timed["total"] + 1e-12).all()
    by_call = {(int(r["call"]), int(r["phase"])): r for r in timed}
    parent = {int(r["call"]): int(r["parent"]) for r in calls if r["phase"] == Phase.FWD}
    for phase in (Phase.FWD, Phase.BWD):
        # a call's total is its self time and its children's totals
        below: dict[int, float] = {}
        for (call, p), r in by_call.items():
            if p == phase and parent.get(call, -1) >= 0:
                below[parent[call]] = below.get(parent[call], 0.0) + float(r["total"])
        for (call, p), r in by_call.items():
            if p == phase and call in below:
                want = max(float(r["total"]) - below[call], 0.0)
                assert float(r["self"]) == pytest.approx(want, abs=1e-9)
    # each backward pass: the loss site's device total is the pass; its self time is
    # what its calls were not given
    sites = timed[(timed["phase"] == Phase.BWD) & ~np.isin(timed["call"], list(parent))]
    assert len(sites) == 4
    for site in sites:
        step = timed[(timed["step"] == site["step"]) & (timed["phase"] == Phase.BWD)]
        own = step["self"][np.isin(step["call"], list(parent))].sum()
        assert site["total"] == pytest.approx(own + site["self"], rel=1e-9)
    # a forward's device span holds its host span (the events sit inside the hooks)
    host = {(int(r["call"]), int(r["phase"])): float(r["total"]) for r in calls}
    for (call, p), r in by_call.items():
        if p == Phase.FWD and device == "cpu":
            assert float(r["total"]) >= 0.5 * host[(call, p)]


def test_profile_leads_with_device_times(tmp_path, device):
    path = tmp_path / "run.h5"
    with hookdbg.record(path, quiet=True):
        train(device)
    with open_recording(path) as rec:
        prof = profile(rec)
    assert prof.on_device
    rows = {(r.module.name, r.phase): r for r in prof.rows}
    inner = rows[("model.0.inner", Phase.FWD)]
    assert inner.device_total_mean >= inner.device_self_mean > 0
    assert not np.isnan(rows[("model.2.out", Phase.BWD)].device_self_mean)
    assert all(np.isnan(r.device_self_mean) for r in prof.rows if r.phase == Phase.OPT)


def test_events_are_reused_and_nothing_is_timed_on_the_cpu(tmp_path, device):
    HostEvent.made = 0
    path = tmp_path / "run.h5"
    with hookdbg.record(path, quiet=True):
        train(device, steps=8)
    if device == "cpu":
        per_step = len(tables(path)["device_times"]) / 8
        assert HostEvent.made < 4 * per_step  # the pool, not an event per mark
    cpu = tmp_path / "cpu.h5"
    # not timed as on CUDA here: no device times
    with hookdbg.record(cpu, quiet=True), pytest.MonkeyPatch.context() as mp:
        mp.setattr(segments, "_on_cuda", lambda module: False)
        train("cpu", steps=2)
    assert len(tables(cpu)["device_times"]) == 0
