"""The search screen: its table shows the statistics a query names, call matches in
columns of their own, and no number cut at the screen's edge; it teaches its language
as you type."""

import pytest
from textual.widgets import DataTable

from hookdbg.analysis.query import parse
from hookdbg.analysis.search import search
from hookdbg.cells import cell_text, nonfinite_count
from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp
from tests.tui.pilot import SIZES, columns, records, settle, text, until


async def _search(app, pilot, query: str) -> DataTable:
    await settle(app, pilot)
    await pilot.press("slash", *query, "enter")
    await settle(app, pilot)
    return app.screen.query_one(DataTable)


def _whole(table: DataTable) -> bool:
    """Every column is on screen: none runs past the right edge."""
    return table.virtual_size.width <= table.scrollable_content_region.width


@pytest.mark.parametrize("size", [(100, 30), (220, 60)])
async def test_a_query_on_a_statistic_shows_it_and_no_number_is_cut(nan_h5, size):
    rec = open_recording(nan_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=size) as pilot:
        table = await _search(app, pilot, "norm>0.5")
        labels = columns(table)
        assert labels[:5] == ["step", "module", "phase", "tensor", "norm"]
        assert _whole(table), (table.virtual_size, table.scrollable_content_region)
        want = search(rec, parse("norm>0.5"), 500).rows
        shown = records(table)
        assert len(shown) == len(want)
        for row, cells in zip(want, shown, strict=True):
            for stat in {"min", "max", "mean", "std", "norm"} & set(labels):
                assert cells[stat] == cell_text(row[stat], nonfinite_count(row))
        if size[0] >= 220:  # room for every statistic shown by default
            assert {"nan/inf", "min", "max", "mean", "std", "shape"} <= set(labels)
        else:  # the query's statistic stays; the least wanted of the others go
            assert "shape" not in labels


async def test_nan_and_absmax_queries_lead_with_their_columns_in_their_order(nan_h5):
    app = HookdbgApp(open_recording(nan_h5))
    async with app.run_test(size=(100, 30)) as pilot:
        table = await _search(app, pilot, "nan absmax>1")
        assert columns(table)[3:6] == ["tensor", "nan/inf", "max |x|"]
        assert _whole(table)
        first = records(table)[0]
        assert first["nan/inf"] == "16" and first["max |x|"] == "2.568"


async def test_call_matches_have_columns_of_their_own(nan_h5):
    rec = open_recording(nan_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=(100, 30)) as pilot:
        table = await _search(app, pilot, "type:Linear")
        assert columns(table) == ["step", "module", "phase", "call", "total ms", "self ms"]
        status = text(app.screen.query_one("#search-status"))
        assert status.startswith("20 module calls match 'type:Linear'; Enter jumps")
        want = search(rec, parse("type:Linear"), 500).rows
        shown = records(table)
        assert [r["call"] for r in shown] == [str(int(w["index"])) for w in want]
        assert [r["total ms"] for r in shown] == [f"{w['total'] * 1e3:.3f}" for w in want]
        await pilot.press("enter")  # the first match
        await settle(app, pilot)
        assert text(app.screen.query_one("#detail-title")).startswith("model.proj ")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_search_teaches_itself_as_you_type(nan_h5, size):
    """The fields, flags, statistics and operators are listed under the query; the
    matches are counted as you type (what is wrong said before Enter); ↑ and ↓ go
    through the queries searched before."""
    rec = open_recording(nan_h5)
    total = search(rec, parse("nan")).total
    app = HookdbgApp(rec)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        await pilot.press("slash")
        await settle(app, pilot)
        guide = text(app.screen.query_one("#search-guide"))
        for known in ("type:", "phase:fwd|bwd|opt", "step:3:7", "nan inf", "std", "<=", "!="):
            assert known in guide, known
        status = app.screen.query_one("#search-status")
        await pilot.press(*"max>")
        assert await until(app, pilot, lambda: "not yet a query" in text(status))
        assert "incomplete" in text(status)
        await pilot.press("backspace", "backspace", "backspace", "backspace", *"nan")
        assert await until(app, pilot, lambda: "would match" in text(status))
        assert text(status).startswith(f"{total} tensor summaries would match")
        await pilot.press("enter")
        assert await until(app, pilot, lambda: app.screen.hits)
        await pilot.press("escape", "slash")
        await settle(app, pilot)
        query = app.screen.query_one("#query")
        query.value = ""
        await pilot.press(*"std<0", "enter")
        await settle(app, pilot)
        await pilot.press("escape", "slash")
        await settle(app, pilot)
        query = app.screen.query_one("#query")
        query.value = "type:"
        await pilot.press("up")
        assert query.value == "std<0"
        await pilot.press("up")
        assert query.value == "nan"
        await pilot.press("up")  # the oldest: stays
        assert query.value == "nan"
        await pilot.press("down", "down")  # back to what was being typed
        assert query.value == "type:"


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_an_emptied_query_box_says_no_count(nan_h5, size):
    """Backspaced to nothing, or ↓ past the newest query, the box is empty: the count of
    what was in it ("12 module calls would match") went on being said."""
    app = HookdbgApp(open_recording(nan_h5))
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        await pilot.press("slash", *"nan")
        await settle(app, pilot)
        status = app.screen.query_one("#search-status")
        assert await until(app, pilot, lambda: "would match" in text(status))
        await pilot.press("backspace", "backspace", "backspace")
        assert await until(app, pilot, lambda: "type a query" in text(status)), text(status)
        await pilot.press(*"nan", "enter")
        assert await until(app, pilot, lambda: app.screen.hits)
        await pilot.press("escape", "slash")
        await settle(app, pilot)
        status = app.screen.query_one("#search-status")
        await pilot.press("up")  # the query searched before, counted
        assert await until(app, pilot, lambda: "would match" in text(status))
        await pilot.press("down")  # past the newest: the empty box
        assert await until(app, pilot, lambda: "type a query" in text(status)), text(status)
