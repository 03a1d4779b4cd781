"""What the screen opened on (the first NaN/inf origin, the first divergence) is said
in the notice line at the top until the user moves, not in a toast over the plot and
the step bar for 5 to 13 seconds (at 80x24 the whole loss plot)."""

import os

import pytest

from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.plot import PlotPane
from hookdbg.tui.stepbar import StepBar
from tests.helpers import ROOT
from tests.tui.pilot import SIZES, notices, settle, text, until


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_where_a_run_opened_is_said_above_the_panes(nan_h5, size):
    app = HookdbgApp(open_recording(nan_h5))
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        screen = app.screen
        notice = screen.query_one("#notice")
        assert "opened where the first was born: model.standardize, step 3" in text(notice)
        assert not notices(app)  # nothing over the plot and the step bar
        assert notice.region.bottom <= screen.query_one(PlotPane).region.y
        assert notice.region.bottom <= screen.query_one(StepBar).region.y
        await pilot.press("j")  # the user moves on: the line goes, the panes grow back
        await settle(app, pilot)
        assert not notice.display


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_first_divergence_is_said_above_the_panes(size, monkeypatch):
    monkeypatch.chdir(ROOT)
    a, b = (open_recording(os.path.join("tests", "data", f"nan_{x}.h5")) for x in "ab")
    app = HookdbgApp(a, b)
    async with app.run_test(size=size) as pilot:
        screen = app.screen
        assert await until(app, pilot, lambda: screen.diff is not None)
        await settle(app, pilot)
        said = text(screen.query_one("#notice"))
        assert said.startswith("first divergence: model at step 3 (★ in the tree")
        assert not notices(app)
        await pilot.press("right")
        await settle(app, pilot)
        assert "first divergence" not in text(screen.query_one("#notice"))
