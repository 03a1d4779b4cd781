"""Comparing two runs in the detail table: whatever the width, the value that differs is
on screen, highlighted, with run b's row of the same tensor right under run a's."""

import pytest
from rich.style import Style

from hookdbg.analysis.diff import diff
from hookdbg.read import open_recording
from hookdbg.store.schema import Slot, parse_slot_label, slot_label
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.detail import DetailPane, DetailTable
from tests.helpers import ROOT
from tests.tui.pilot import columns, records, settle, until


def _style(cell) -> Style:
    return cell.style if isinstance(cell.style, Style) else Style.parse(cell.style or "")


@pytest.mark.parametrize("size", [(100, 30), (220, 60)], ids=["100x30", "220x60"])
async def test_the_differing_norm_is_shown_highlighted_with_the_rows_side_by_side(
    mlp_h5, mlp_lr_h5, size
):
    """Two runs that differ in learning rate part in the first optimizer step, in
    model.body.1's weight norm (4.59694 against 4.59683): a column a narrow table
    would leave out first."""
    a, b = open_recording(mlp_h5), open_recording(mlp_lr_h5)
    first = diff(a, b).first
    assert (first.module, first.step, first.slot, first.path, first.stat) == (
        "model.body.1",
        0,
        Slot.PARAM,
        "weight",
        "norm",
    )
    app = HookdbgApp(a, b)
    async with app.run_test(size=size) as pilot:
        screen = app.screen
        assert await until(app, pilot, lambda: screen.diff is not None)
        await settle(app, pilot)
        assert "model.body.1" in str(screen.query_one("#detail-title").content)
        assert "★first the two runs' first divergence (at step 0)" in str(
            screen.query_one("#detail-title").content
        )
        table = screen.query_one(DetailTable)
        assert "norm" in columns(table)
        shown = records(table)
        # a then b, tensor by tensor
        assert [r["run"] for r in shown] == ["a", "b"] * (len(shown) // 2)
        for ra, rb in zip(shown[::2], shown[1::2], strict=True):
            assert (ra["slot"], ra.get("phase")) == (rb["slot"], rb.get("phase"))
        differs = screen.query_one(DetailPane).get_component_rich_style("detail-pane--differs")
        norm = columns(table).index("norm")
        lit = {
            (i, j)
            for i in range(table.row_count)
            for j, cell in enumerate(table.get_row_at(i))
            if _style(cell).reverse == differs.reverse and _style(cell).color == differs.color
        }
        weight = [i for i, r in enumerate(shown) if r["slot"] == "param[weight]"]
        assert len(weight) == 2 and {(i, norm) for i in weight} <= lit
        assert {(i, j) for i, j in lit if j != norm} == set()  # nothing else differs here
        assert len({i for i, _ in lit}) >= 2  # param[bias] after the step differs too
        # read apart, not 4.597 twice, and the cursor on it
        assert shown[weight[0]]["norm"] != shown[weight[1]]["norm"]
        assert table.cursor_coordinate == (weight[0], norm)
        assert table.region.right <= size[0]
        # scrolled sideways to the difference, the rows still say which tensor they are
        fixed = columns(table)[: table.fixed_columns]
        assert fixed[0] == "run" and fixed[-1] == "slot"


async def test_a_module_called_several_times_numbers_its_calls(gan_h5, mlp_h5):
    """The GAN's discriminator runs three times a step (real, detached fake, the
    generator's pass): each row says which call, numbered as `hookdbg show` does."""
    from tests.cli.test_reports import run_json

    rec = open_recording(gan_h5)
    disc = rec.modules.resolve("disc").id
    app = HookdbgApp(rec)
    async with app.run_test(size=(160, 40)) as pilot:
        app.screen.go_to(step=1, module=disc)
        await settle(app, pilot)
        table = app.screen.query_one(DetailTable)
        fixed = columns(table)[: table.fixed_columns]
        assert fixed[0] == "call" and fixed[-1] == "slot"
        shown = [(r["call"], r["phase"], r["slot"]) for r in records(table)]
    rows = run_json("show", gan_h5, "disc", "--step", "1")["rows"]
    label = {r["slot"]: parse_slot_label(r["slot"])[0] for r in rows}
    called = [
        (
            "" if r["call"] is None else str(r["call"]),
            r["phase"],
            slot_label(label[r["slot"]], r["path"]),
        )
        for r in rows
    ]
    assert sorted(shown) == sorted(called)  # the optimizer's rows belong to no call
    assert {call for call, phase, _ in shown if phase != "opt"} == {"0", "1", "2"}
    app = HookdbgApp(open_recording(mlp_h5))  # called once a step: no call column
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        assert "call" not in columns(app.screen.query_one(DetailTable))


async def test_scrolled_sideways_no_number_is_shown_cut():
    """At 80x24, shift+→ scrolled the table a cell at a time: next to the frozen slot
    column stood the tail of a cut number ("b input[0]  9  1.042", 9 the end of
    0.09269), under a blank header. A column shows whole, or not at all."""
    a, b = (open_recording(ROOT / "tests" / "data" / f"nan_{x}.h5") for x in "ab")
    app = HookdbgApp(a, b)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        assert await until(app, pilot, lambda: app.screen.diff is not None)
        await settle(app, pilot)
        table = app.screen.query_one(DetailTable)
        scrolled = False
        for _ in range(len(table.columns)):
            await pilot.press("shift+right")
            await settle(app, pilot)
            scrolled = scrolled or table.scroll_x > 0
            rows = [columns(table)] + [  # each line on screen: the header, then rows
                [str(c) for c in table.get_row_at(i)]
                for i in range(int(table.scroll_y), table.row_count)
            ]
            for y, cells in enumerate(rows[: table.size.height]):
                words = {w for cell in cells for w in cell.split()}
                line = table.render_line(y).text.split()
                assert set(line) <= words, (y, line, table.scroll_x)
        assert scrolled  # the table was wider than the pane


async def test_a_short_screens_notice_leaves_the_table_its_rows(mlp_h5, deep_h5):
    """At 80x24 the notice (the first divergence, the modules one run lacks, the rows
    without a counterpart) took three lines for the session and left the tensor table
    its header alone: a short screen folds it to one line."""
    app = HookdbgApp(open_recording(mlp_h5), open_recording(deep_h5))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        assert await until(app, pilot, lambda: app.screen.diff is not None)
        await settle(app, pilot)
        assert len(app.screen._diff_notes) >= 1  # said with the opening: two lines or more
        notice = app.screen.query_one("#notice")
        assert notice.display and notice.size.height == 1
        table = app.screen.query_one(DetailTable)
        assert table.row_count and table.size.height >= 3, table.size  # header and rows
