"""The smaller things a new user tripped on: an alert's words cut at 100 columns, a
range that read 1023..1023 over bars that differ, 'step 99 was not recorded' for a run
of 5 steps, the R dialog in the top-left corner, and the global view at 100 columns
keeping one number of five."""

import pytest

from hookdbg.read import open_recording, open_run
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.detail import DetailPane, DetailTable
from hookdbg.tui.dialogs import RecordStepsScreen
from hookdbg.tui.plot import Plot
from hookdbg.tui.statstack import StatStack
from tests.helpers import live_recording
from tests.tui.pilot import SIZES, columns, notices, records, settle, text, until

SIZE_IDS = [f"{w}x{h}" for w, h in SIZES]


def drawn(app, widget) -> list[str]:
    """A widget's lines as the terminal shows them."""
    region = widget.region
    strips = app.screen._compositor.render_strips()
    return [s.crop(region.x, region.right).text for s in strips[region.y : region.bottom]]


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
@pytest.mark.parametrize("recording", ["nan_h5", "ddp_nan_h5"])
async def test_what_an_alert_says_is_on_screen_whole(recording, size, request):
    """The 'what' column takes the room the others leave and wraps onto more lines."""
    path = request.getfixturevalue(recording)
    run = open_run(path)
    ranks = [run[r] for r in run.ranks] if hasattr(run, "ranks") else [run]
    app = HookdbgApp(ranks[0], more_ranks=ranks[1:])
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        await pilot.press("a")
        assert await until(app, pilot, lambda: app.screen.query("#alerts-table"))
        await settle(app, pilot)
        table = app.screen.query_one("#alerts-table")
        assert table.region.right <= size[0] and not table.show_horizontal_scrollbar
        lines = drawn(app, table)
        at = lines[0].index("what")
        shown = "".join(line[at:] for line in lines[1:]).replace(" ", "")
        for said in (r[-1] for r in (table.get_row_at(i) for i in range(table.row_count))):
            assert str(said).replace(" ", "") in shown, (str(said), lines)


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
async def test_a_narrow_range_gets_the_digits_that_tell_its_ends_apart(creeping_h5, size):
    rec = open_recording(creeping_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        await pilot.press("s", "s")  # output mean: 1023 down to 1022.996
        await settle(app, pilot)
        lines = text(app.screen.query_one(Plot)).splitlines()
        top, bottom = lines[0].split("┤")[0].strip(), lines[-2].split("┤")[0].strip()
        assert top != bottom and float(top) > float(bottom), (top, bottom)
        await pilot.press("m")  # the statistics stacked: each line's range
        await settle(app, pilot)
        mean = next(
            line
            for line in text(app.screen.query_one(StatStack)).split("\n")[1:]
            if line.strip().startswith("mean")
        )
        low, high = mean.split()[-1].split("..")
        assert low != high and float(low) < float(high), mean


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
async def test_a_step_past_the_end_is_said_to_be(nan_h5, size):
    app = HookdbgApp(open_recording(nan_h5))
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        await pilot.press("g", "9", "9", "enter")
        await settle(app, pilot)
        assert app.screen.step == 4
        assert "the last recorded step is 4: 99 is past the end" in notices(app)
        assert not any("was not recorded" in n for n in notices(app))


async def test_the_record_dialog_opens_in_the_middle(tmp_path):
    path = tmp_path / "live.h5"
    with live_recording(path):  # one recorder for every size: each takes seconds to start
        for size in SIZES:
            app = HookdbgApp(open_recording(path))
            async with app.run_test(size=size) as pilot:
                await settle(app, pilot)
                await pilot.press("R")
                assert await until(
                    app, pilot, lambda a=app: isinstance(a.screen, RecordStepsScreen)
                )
                await settle(app, pilot)
                box = app.screen.query_one("#goto").region
                assert abs(box.x + box.width / 2 - size[0] / 2) <= 1, size
                assert abs(box.y + box.height / 2 - size[1] / 2) <= 1, size
                await pilot.press("escape")


NUMBERS = {"min", "max", "mean", "std", "norm"}


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
async def test_the_global_view_keeps_the_numbers_the_ranks_view_shows(fsdp_h5, size):
    """G adds where each row was merged from; at 100 columns that column pushed every
    number but the mean out. It goes before a number does, and what a narrow pane
    leaves out is a zoom (z) away."""
    run = open_run(fsdp_h5)
    rec = run[0]
    app = HookdbgApp(rec, more_ranks=[run[r] for r in run.ranks[1:]])
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        app.screen.go_to(0, rec.modules.resolve("blocks.0.0").id)
        await settle(app, pilot)
        table = app.screen.query_one(DetailTable)
        numbers = NUMBERS & set(columns(table))
        await pilot.press("G")
        assert await until(
            app, pilot, lambda: "global:" in text(app.screen.query_one("#detail-title"))
        )
        await settle(app, pilot)
        assert numbers <= set(columns(table)), columns(table)
        if size[0] >= 200:  # room for it: where each row was merged from
            weight = next(r for r in records(table) if r["slot"] == "param[weight]")
            assert weight["global"].startswith("S(0) from ranks 0,1")
            return
        # the columns left out are a zoom away, as the pane's border says
        pane = app.screen.query_one(DetailPane)
        assert "z zooms" in str(pane.border_subtitle)
        shown = columns(table)
        table.focus()
        await pilot.press("z")
        await settle(app, pilot)
        assert app.screen.maximized is pane
        assert set(shown) < set(columns(table)), columns(table)
        if size[0] >= 100:
            assert "global" in columns(table)
        assert "z zooms" not in str(pane.border_subtitle)
