"""The profile screen opens on where the step's time went, as ``hookdbg profile``
says it (forward, backward, backward outside modules, optimizer, outside modules:
in small models the parts outside modules are the largest), labels self and total
time, never cuts a number, and in a diff says whose profile it is (``b``: the
other's)."""

import json
import os

import pytest
from textual.widgets import DataTable

from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.profile import ProfileScreen
from tests.helpers import ROOT, hookdbg
from tests.tui.pilot import SIZES, columns, settle, text, until

PARTS = {
    "forward": "forward",
    "backward": "backward",
    "backward outside modules": "backward_outside_modules",
    "optimizer": "optimizer",
    "outside modules": "outside_modules",
}


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_profile_opens_on_the_steps_breakdown_as_the_cli_says_it(nan_h5, size):
    cli = json.loads(hookdbg("profile", nan_h5, "--step", "2", "--json").stdout)
    per_step = cli["seconds_per_step"]
    app = HookdbgApp(open_recording(nan_h5))
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        app.screen.go_to(2)
        await pilot.press("p")
        assert await until(app, pilot, lambda: isinstance(app.screen, ProfileScreen))
        await settle(app, pilot)
        meters = text(app.screen.query_one("#profile-meters")).splitlines()
        for name, key in PARTS.items():
            line = next(m for m in meters if m.strip().startswith(name + " "))
            assert f"{per_step[key] * 1e3:.3f} ms" in line, line
            assert f"{per_step[key] / per_step['step']:.0%}" in line, line
        # one step profiled: its time, not a mean ("(mean)" said of one step misled)
        assert f"{per_step['step'] * 1e3:.3f} ms" in "\n".join(meters)
        assert "(mean)" not in "\n".join(meters)
        assert f"hookdbg's own {per_step['hookdbg'] * 1e3:.3f} ms" in "\n".join(meters)
        title = text(app.screen.query_one("#screen-title"))
        assert "self: without its recorded submodules, total: with them" in title
        table = app.screen.query_one(DataTable)
        shown = columns(table)
        assert {"module", "self ms", "total ms", "self share"} <= set(shown)  # as the CLI
        assert "share" not in shown
        assert not table.show_horizontal_scrollbar  # every number whole, on screen
        assert table.region.right <= size[0]
        await pilot.press("a")  # all steps: the step's time is their mean
        assert await until(
            app, pilot, lambda: "(mean)" in text(app.screen.query_one("#profile-meters"))
        )


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_a_diffs_profile_says_whose_it_is_and_b_shows_the_others(size, monkeypatch):
    monkeypatch.chdir(ROOT)
    a, b = (open_recording(os.path.join("tests", "data", f"nan_{x}.h5")) for x in "ab")
    app = HookdbgApp(a, b)
    async with app.run_test(size=size) as pilot:
        assert await until(app, pilot, lambda: app.screen.diff is not None)
        await settle(app, pilot)
        await pilot.press("p")
        assert await until(app, pilot, lambda: isinstance(app.screen, ProfileScreen))
        await settle(app, pilot)
        title = text(app.screen.query_one("#screen-title"))
        assert f"run a ({os.path.join('tests', 'data', 'nan_a.h5')})" in title
        assert "b: run b" in title
        first = app.screen.profile
        await pilot.press("b")
        await settle(app, pilot)
        title = text(app.screen.query_one("#screen-title"))
        assert f"run b ({os.path.join('tests', 'data', 'nan_b.h5')})" in title
        assert app.screen.profile is not first and app.screen.run.rec is b
        await pilot.press("enter")  # run b's module: the replay goes to run a's twin
        await settle(app, pilot)
        assert not isinstance(app.screen, ProfileScreen)
        assert app.screen.module is not None
