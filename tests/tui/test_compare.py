"""Comparing two runs that do not line up: different step counts, different models."""

import pytest
from textual.widgets import DataTable

from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.statstack import StatStack
from hookdbg.tui.stepbar import StepBar
from hookdbg.tui.tree import ONLY_B, ModuleTree
from tests.helpers import SAMPLES, hookdbg
from tests.tui.pilot import (
    SIZE,
    SIZES,
    notices,
    records,
    scrollbar_cells,
    settle,
    text,
    until,
)


@pytest.fixture(scope="module")
def longer_mlp_h5(tmp_path_factory):
    """samples/numnet_mlp.py as mlp_h5 records it, run 7 steps instead of 4."""
    path = tmp_path_factory.mktemp("compare") / "mlp7.h5"
    out = hookdbg("record", "-q", "-o", path, SAMPLES / "numnet_mlp.py", "--steps", "7")
    assert out.returncode == 0, out.stderr
    return path


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


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_modules_only_run_b_has_can_be_browsed(two_models, size):
    """net.3 and net.4 are only in b: they are in the tree (+b), and selecting one
    shows b's rows of it, its plot and its marks said in words."""
    shallow, deep = (open_recording(p) for p in two_models)
    app = HookdbgApp(shallow, deep)
    async with app.run_test(size=size) as pilot:
        screen = app.screen
        assert await until(app, pilot, lambda: screen.diff is not None)
        await settle(app, pilot)
        tree = screen.query_one(ModuleTree)
        only = {tree.module_of(k).name: k for k in tree._node_of if k >= ONLY_B}
        assert set(only) == {"net.3", "net.4"}
        assert "+b" in tree.label_of(only["net.4"])
        net = tree._node_of[shallow.modules.resolve("net").id]
        assert tree._node_of[only["net.4"]].parent is net  # under its parent, by name
        screen.go_to(step=1, module=only["net.4"])
        await pilot.press("s")  # output std of it
        await settle(app, pilot)
        title = text(screen.query_one("#detail-title"))
        assert title.startswith("net.4") and "only in run b" in title
        assert "+b only run b has this module" in title
        shown = records(screen.query_one("#detail-table", DataTable))
        assert shown and {r["run"] for r in shown} == {"b"}
        net4 = deep.modules.resolve("net.4").id
        assert len(shown) == int((deep.tensors(1, 1)["module"] == net4).sum())
        plot = text(screen.query_one("#plot-title"))
        assert plot.startswith("output std of net.4") and "b: " in plot
        await pilot.press("y", "m")  # its name copied, its statistics stacked
        await settle(app, pilot)
        assert app.clipboard == "net.4"
        assert text(screen.query_one(StatStack)).startswith("output of net.4")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_a_diffs_table_draws_no_column_in_part(two_models, size):
    """The columns in which the runs differ stay, even when they do not all fit: the
    table then ends at the last whole one, the rest a sideways scroll away, rather
    than show 90. for 90.39 at its edge."""
    app = HookdbgApp(*(open_recording(p) for p in two_models))
    async with app.run_test(size=size) as pilot:
        screen = app.screen
        assert await until(app, pilot, lambda: screen.diff is not None)
        await settle(app, pilot)
        table = screen.query_one("#detail-table", DataTable)
        inside = table.scrollable_content_region.width
        right = 0
        for column in table.ordered_columns:
            right += column.get_render_width(table)
            assert right <= inside or right - column.get_render_width(table) >= inside, (
                f"{column.label} drawn in part: {right} > {inside}"
            )
        if right > inside:  # the rest a sideways scroll away, as the pane says
            assert "shift+→ for more" in str(screen.query_one("DetailPane").border_subtitle)
            await pilot.press(*["shift+right"] * len(table.ordered_columns))
            await settle(app, pilot)
            assert table.cursor_column == len(table.ordered_columns) - 1
            assert table.scroll_x >= right - inside
            drawn = {c.text for c in scrollbar_cells(app, table)}
            assert drawn == {" "}, f"a scrollbar thumb's end glyph: {drawn}"
