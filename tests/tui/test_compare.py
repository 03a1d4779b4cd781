"""Comparing two runs that do not line up: different step counts, different models."""

import pytest
from textual.widgets import DataTable

from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.stepbar import StepBar
from tests.helpers import SAMPLES, hookdbg
from tests.tui.pilot import SIZE, notices, records, settle, text, until

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


@pytest.fixture(scope="module")
def longer_mlp_h5(tmp_path_factory):
    """samples/numnet_mlp.py as mlp_h5 records it, run 7 steps instead of 4."""
    path = tmp_path_factory.mktemp("compare") / "mlp7.h5"
    out = hookdbg("record", "-q", "-o", path, SAMPLES / "numnet_mlp.py", "--steps", "7")
    assert out.returncode == 0, out.stderr
    return path


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    base = tmp_path_factory.mktemp("compare-models")
    (base / "depth.py").write_text(DEPTH)
    for name, args in (("shallow", []), ("deep", ["--deeper"])):
        out = hookdbg("record", "-q", "-o", base / f"{name}.h5", base / "depth.py", *args)
        assert out.returncode == 0, out.stderr
    return base / "shallow.h5", base / "deep.h5"


async def test_runs_of_4_and_7_steps_match_in_the_steps_both_have(mlp_h5, longer_mlp_h5):
    """The same seeded run, stopped after 4 and after 7 steps: no divergence, said as
    `hookdbg diff` says it, and the steps only the longer run has can be gone to."""
    app = HookdbgApp(open_recording(mlp_h5), open_recording(longer_mlp_h5))
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        assert await until(app, pilot, lambda: screen.diff is not None)
        verdict = "no divergence: the two recordings match in the steps both recorded"
        notice = text(screen.query_one("#notice"))
        assert notice.startswith(verdict)  # what it opened on, then what was left out
        assert "recorded steps differ: 4 in a, 7 in b; only steps in both were compared" in notice
        await pilot.press("f")
        assert notices(app).count(verdict) == 1
        await pilot.press("g", *"6", "enter")
        await settle(app, pilot)
        bar = text(screen.query_one(StepBar))
        assert bar.startswith(" step 6 ") and "7 of 7" in bar
        assert not any("was not recorded" in n for n in notices(app))
        assert "step 6 was recorded in b only" in notices(app)
        shown = records(screen.query_one("#detail-table", DataTable))
        assert shown and {r["run"] for r in shown} == {"b"}


async def test_modules_only_one_model_has_are_named(two_models):
    app = HookdbgApp(*(open_recording(p) for p in two_models))
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        assert await until(app, pilot, lambda: screen.diff is not None)
        await settle(app, pilot)
        notice = text(screen.query_one("#notice"))
        assert "2 modules only in b: net.3, net.4" in notice
        assert "modules only in a" not in notice
        assert screen.query_one("#notice").display
