"""The detail pane's histogram column, driven through Textual's Pilot."""

from textual.widgets import DataTable

from hookdbg.analysis.histograms import sparkline
from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.messages import Goto
from tests.cli.test_histograms import hist_h5  # noqa: F401  (the fixture)
from tests.tui.pilot import SIZE, columns, records, settle


async def test_detail_pane_shows_each_tensors_histogram(hist_h5):  # noqa: F811
    rec = open_recording(hist_h5)
    head = rec.modules.resolve("head").id
    app = HookdbgApp(rec)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        app.screen.post_message(Goto(module=head))
        await settle(app, pilot)
        table = app.screen.query_one("#detail-table", DataTable)
        assert "histogram" in columns(table), str(columns(table))
        shown = {r["slot"]: r["histogram"] for r in records(table)}
    rows = rec.tensors(0, 0, columns=["module", "slot", "path", "histogram"])
    output = rows[(rows["module"] == head) & (rows["slot"] == 1)][0]
    assert shown["output"] == sparkline(output["histogram"], 12) != ""


async def test_no_histogram_column_without_histograms(mlp_h5):
    rec = open_recording(mlp_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        app.screen.post_message(Goto(module=rec.modules.resolve("head").id))
        await settle(app, pilot)
        assert "histogram" not in columns(app.screen.query_one("#detail-table", DataTable))
