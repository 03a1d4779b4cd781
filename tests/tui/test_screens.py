"""The alerts screen as a user meets it: the list of origins, and under it the
highlighted alert's run-up, read back from the screen."""

from hookdbg.analysis.runup import TITLE
from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.screens import AlertsScreen
from tests.tui.pilot import SIZE, settle, text


async def test_the_alerts_screen_shows_the_highlighted_alerts_run_up(fp16_h5):
    app = HookdbgApp(open_recording(fp16_h5))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("a")
        await settle(app, pilot)
        assert isinstance(app.screen, AlertsScreen)
        shown = text(app.screen.query_one("#alert-run-up"))
        assert "run-up, last 5 recorded steps" in shown
        # a cell below 1% of the dtype's max shows no share: the title says so
        assert TITLE in shown
        [output] = [line for line in shown.splitlines() if line.lstrip().startswith("output ")]
        assert "(50%)" in output and output.rstrip().endswith(" inf"), shown  # model.0's
        # model.0's inf was found where model.1 passed it on: its op, seen a step later
        assert "the op: made by aten::addmm (inf) from torch/nn/modules/linear.py:" in shown
        await pilot.press("down")  # the second alert: model.2, fed by model.0's inf
        await settle(app, pilot)
        second = text(app.screen.query_one("#alert-run-up"))
        assert second != shown and "input[0]" in second and "inf" in second
        assert "the op:" not in second  # model.2's own words say it: made by aten::addmm
