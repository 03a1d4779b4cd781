"""``profile`` and the time model (hookdbg/recorder/hooks/timing.py): every recorded second of a
step is counted once, so self <= total <= step for every row and the shares of a step
add up to at most all of it, on the shapes of training loop where a second could be
counted twice (a module called twice, a GAN, LBFGS's closure, a cell unrolled over time)."""

import sys
import time

import numpy as np
import pytest
import torch
from torch import nn

import hookdbg
from hookdbg.analysis.profile import profile
from hookdbg.read import open_recording
from hookdbg.recorder.alerts import actions
from hookdbg.store.schema import Phase


def test_profile_of_resnet18(resnet_h5):
    with open_recording(resnet_h5) as rec:
        prof = profile(rec)
        assert (prof.first, prof.last, prof.steps) == (0, 1, 2)
        rows = {(r.module.name, r.phase): r for r in prof.rows}
        layer1 = rows[("model.layer1.0", Phase.FWD)]
        assert layer1.calls_per_step == 1 and layer1.self_mean <= layer1.total_mean
        assert rows[("model.layer1.0.relu", Phase.FWD)].calls_per_step == 2  # used twice
        for phase in (Phase.FWD, Phase.BWD):  # self times add up to the root's total
            own = sum(
                r.self_mean
                for (name, ph), r in rows.items()
                if ph == phase and name.startswith("model")
            )
            assert np.isclose(own, rows[("model", phase)].total_mean, rtol=1e-6)
        assert 0 < sum(r.share for r in prof.rows) <= 1.0
        top = prof.sorted("self", 3)
        assert len(top) == 3 and top[0].self_mean >= top[1].self_mean >= top[2].self_mean
        only_bwd = profile(rec, 1, 1, (Phase.BWD,))
        assert only_bwd.steps == 1 and {r.phase for r in only_bwd.rows} == {Phase.BWD}
        assert only_bwd.time == profile(rec, 1, 1).time  # the model is of the whole step


def assert_adds_up(path) -> None:
    """The time model's promises, step by step, from the calls table itself."""
    with open_recording(path) as rec:
        steps = rec.steps[rec.steps["recorded"] == 1]
        calls = rec.calls(columns=["step", "module", "phase", "parent", "total", "self"])
        for row in steps:
            mine = calls[calls["step"] == row["step"]]
            duration = row["end"] - row["start"]
            assert np.all(mine["self"] >= 0) and np.all(mine["self"] <= mine["total"] + 1e-9)
            assert np.all(mine["total"] <= duration + 1e-9), f"a row outlasts step {row['step']}"
            assert mine["self"].sum() <= duration * 1.001, f"step {row['step']} counted twice"
            assert row["overhead"] >= 0
        prof = profile(rec)
        parts = prof.time.parts
        assert min(parts.values()) >= 0
        assert sum(parts.values()) == pytest.approx(prof.time.step, rel=1e-9)
        assert 0 < sum(r.share for r in prof.rows) <= 1.0
        for r in prof.rows:
            assert r.self_mean <= r.total_mean + 1e-12


def test_backward_of_a_module_called_twice_is_two_spans_of_its_own(tmp_path):
    """Two micro-batches through one Linear with user code between the backward passes:
    the first call's backward must not stretch to the second's."""
    model = nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        for _ in range(2):
            for _ in range(2):  # gradient accumulation
                model(torch.randn(8, 64)).sum().backward()
                time.sleep(0.05)  # user code between the backward passes
            opt.step()
            opt.zero_grad()
    with open_recording(tmp_path / "run.h5") as rec:
        linear = rec.modules.resolve("model").id
        calls = rec.calls(columns=["module", "phase", "index", "total"])
        bwd = calls[(calls["phase"] == Phase.BWD) & (calls["module"] == linear)]
        assert len(bwd) == 4 and bwd["total"].max() < 0.02  # each span is its own
    assert_adds_up(tmp_path / "run.h5")


def test_gan_profile_shares_add_up_to_at_most_the_step(tmp_path):
    torch.manual_seed(0)
    net_g = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
    net_d = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    opt_d = torch.optim.Adam(net_d.parameters())
    opt_g = torch.optim.Adam(net_g.parameters())
    bce = nn.BCEWithLogitsLoss()
    with hookdbg.record(tmp_path / "gan.h5", quiet=True):
        for _ in range(3):  # the DCGAN example: three discriminator calls, three backwards
            opt_d.zero_grad()
            bce(net_d(torch.randn(8, 16)), torch.ones(8, 1)).backward()
            fake = net_g(torch.randn(8, 8))
            bce(net_d(fake.detach()), torch.zeros(8, 1)).backward()
            opt_d.step()
            opt_g.zero_grad()
            bce(net_d(fake), torch.ones(8, 1)).backward()
            opt_g.step()
    with open_recording(tmp_path / "gan.h5") as rec:
        prof = profile(rec)
        assert prof.steps == 3
        for r in prof.rows:
            assert r.self_mean <= prof.step_mean
    assert_adds_up(tmp_path / "gan.h5")


def test_lbfgs_closure_is_not_counted_in_the_optimizer_and_the_modules_both(tmp_path):
    """LBFGS runs forward and backward inside ``step(closure)``: those are the modules'
    time, and the optimizer's self time is what is left."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    x, y = torch.randn(32, 8), torch.randn(32, 1)

    def closure():
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        return loss

    with hookdbg.record(tmp_path / "lbfgs.h5", quiet=True):
        for _ in range(3):
            opt.step(closure)
    assert_adds_up(tmp_path / "lbfgs.h5")
    with open_recording(tmp_path / "lbfgs.h5") as rec:
        prof = profile(rec)
        rows = {(r.module.name, r.phase): r for r in prof.rows}
        optimizer = rows[("opt", Phase.OPT)]
        assert optimizer.self_mean < optimizer.total_mean  # the closure ran inside it
        inside = rows[("model", Phase.FWD)].total_mean + rows[("model", Phase.BWD)].total_mean
        assert optimizer.self_mean + inside <= optimizer.total_mean * 1.001


def test_a_cell_unrolled_over_time_counts_its_backward_once(tmp_path):
    """pytorch/examples time_sequence_prediction: two LSTMCells called once per time step,
    one backward through all of them. Their backward self times together stay within the
    backward pass; the model's backward total is the sum of what is inside it."""

    class Sequence(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm1 = nn.LSTMCell(1, 16)
            self.lstm2 = nn.LSTMCell(16, 16)
            self.linear = nn.Linear(16, 1)

        def forward(self, x):
            h1 = c1 = torch.zeros(x.size(0), 16)
            h2 = c2 = torch.zeros(x.size(0), 16)
            outputs = []
            for t in x.split(1, dim=1):
                h1, c1 = self.lstm1(t, (h1, c1))
                h2, c2 = self.lstm2(h1, (h2, c2))
                outputs.append(self.linear(h2))
            return torch.cat(outputs, dim=1)

    torch.manual_seed(0)
    seq = Sequence()
    opt = torch.optim.SGD(seq.parameters(), lr=0.1)
    x = torch.randn(4, 20)
    with hookdbg.record(tmp_path / "lstm.h5", quiet=True):
        for _ in range(2):
            opt.zero_grad()
            loss = ((seq(x) - x) ** 2).mean()
            loss.backward()
            opt.step()
    assert_adds_up(tmp_path / "lstm.h5")
    with open_recording(tmp_path / "lstm.h5") as rec:
        rows = {(r.module.name, r.phase): r for r in profile(rec).rows}
        cells = sum(rows[(f"seq.lstm{i}", Phase.BWD)].total_mean for i in (1, 2))
        model = rows[("seq", Phase.BWD)].total_mean
        assert cells <= model * 1.0001
        assert model <= rows[("loss", Phase.BWD)].total_mean * 1.0001


def test_a_network_called_twice_keeps_each_backward_inside_its_parent(tmp_path):
    """A siamese network: one embedding net called on two inputs, one backward. Each
    call's backward total stays inside the root call's, and containers never exceed
    their parents."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Sequential(nn.Linear(8, 32), nn.ReLU()), nn.Linear(32, 8))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with hookdbg.record(tmp_path / "siamese.h5", quiet=True):
        for _ in range(3):
            opt.zero_grad()
            a, b = net(torch.randn(16, 8)), net(torch.randn(16, 8))
            loss = torch.nn.functional.cosine_embedding_loss(a, b, torch.ones(16))
            loss.backward()
            opt.step()
    assert_adds_up(tmp_path / "siamese.h5")
    with open_recording(tmp_path / "siamese.h5") as rec:
        calls = rec.calls(columns=["call", "phase", "parent", "total"])
        bwd = calls[calls["phase"] == Phase.BWD]
        totals = dict(zip(bwd["call"].tolist(), bwd["total"].tolist(), strict=True))
        for call, parent, total in zip(bwd["call"], bwd["parent"], bwd["total"], strict=True):
            if int(parent) in totals:
                assert total <= totals[int(parent)] + 1e-12, f"call {call} outgrows its parent"


def test_the_debugger_prompt_and_alert_work_are_hookdbgs_own_time(tmp_path, monkeypatch):
    """--on-nan break: the seconds at the debugger prompt belong to no module; they are
    hookdbg's own time (the step's overhead), left out of every module time."""
    monkeypatch.setattr(actions, "interactive", lambda: True)
    monkeypatch.setattr(sys, "breakpointhook", lambda *a, **k: time.sleep(0.3))

    class Boom(nn.Module):
        def forward(self, x):
            return x / 0.0 * 0.0 if self.blow else x

    torch.manual_seed(0)
    boom = Boom()
    model = nn.Sequential(nn.Linear(4, 4), boom)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hookdbg.record(tmp_path / "break.h5", quiet=True, on_nan="break"):
        for step in range(3):
            boom.blow = step == 1
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
    assert_adds_up(tmp_path / "break.h5")
    with open_recording(tmp_path / "break.h5") as rec:
        assert len(rec.alerts) >= 1
        calls = rec.calls(columns=["step", "phase", "self"])
        assert calls["self"].max() < 0.1  # not the prompt's 0.3 s
        nan_step = rec.steps[rec.steps["step"] == 1][0]
        assert nan_step["overhead"] >= 0.3
        assert nan_step["end"] - nan_step["start"] < 0.2


def test_the_steps_tile_the_wall_clock(tmp_path):
    """Each step's wall time is end - start + overhead; together the steps cover the
    training loop's wall time, measured outside hookdbg, within 1%."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # what the first recording of a process does once at its first call (seen at up to
    # 3 ms) comes before its first step begins: the tiling is measured on a second one
    with hookdbg.record(tmp_path / "first.h5", quiet=True):
        model(torch.randn(32, 16)).pow(2).mean().backward()
    with hookdbg.record(tmp_path / "wall.h5", quiet=True):
        began = time.perf_counter()
        for _ in range(6):
            loss = model(torch.randn(32, 16)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(0.02)  # data loading
        took = time.perf_counter() - began
    with open_recording(tmp_path / "wall.h5") as rec:
        steps = rec.steps
        walls = steps["end"] - steps["start"] + steps["overhead"]
        assert walls.sum() == pytest.approx(took, rel=0.01)
    assert_adds_up(tmp_path / "wall.h5")
