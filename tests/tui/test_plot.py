"""The plot as a NaN hunt needs it: ``×`` over every step at which the tensor holds
NaN/inf, as the tensor table's nan/inf column says (its std, of the finite values,
can look normal at the step the first NaN appeared); two runs in one plot on one
scale, one height for one value; bars that fill the pane; and the range on the axis
at every size."""

import os

import numpy as np
import pytest

from hookdbg.read import open_recording
from hookdbg.store.schema import Slot
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.detail import DetailTable
from hookdbg.tui.plot import BLOCKS, Plot, PlotPane, spans
from tests.helpers import ROOT
from tests.tui.pilot import SIZES, records, settle, text, until


def columns_drawn(plot: Plot) -> dict[int, list[str]]:
    """Each step's cells as drawn, a string per row from the top, the step axis left out."""
    lines = text(plot).splitlines()[:-1]
    out = {}
    for bucket in plot._buckets:
        span = plot.column_of(int(bucket.steps[0]))
        assert span is not None
        for step in bucket.steps.tolist():
            out[step] = [line[span.start : span.stop] for line in lines]
    return out


def eighths(cells: list[str], at: int = 0) -> int:
    """How tall the bar in cell column ``at`` is drawn, in eighths of a row (× and
    blanks: none)."""
    return sum(BLOCKS.index(row[at]) for row in cells if row[at] in BLOCKS)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_x_marks_every_step_whose_tensor_holds_nan_as_the_table_says(nan_h5, size):
    """model's output holds 16 NaN at step 3 (its std, of finite values, is normal
    there) and is all NaN at step 4: × over 3 and 4, 'first 3'."""
    rec = open_recording(nan_h5)
    model = rec.modules.resolve("model").id
    rows = rec.tensors(0, 4)
    output = rows[(rows["module"] == model) & (rows["slot"] == Slot.OUTPUT)]
    held = sorted(
        int(s) for s in output["step"][output["nan"] + output["posinf"] + output["neginf"] > 0]
    )
    assert held == [3, 4] and np.isfinite(output["std"][output["step"] == 3]).all()
    app = HookdbgApp(rec)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        app.screen.go_to(3, model)
        await pilot.press("s")  # output std
        await settle(app, pilot)
        title = text(app.screen.query_one("#plot-title"))
        assert "output std of model" in title and "× NaN/inf at 2 steps (first 3)" in title
        table = records(app.screen.query_one(DetailTable))
        assert int(next(r for r in table if r["slot"] == "output")["nan/inf"]) > 0
        drawn = columns_drawn(app.screen.query_one(Plot))
        for step, cells in drawn.items():
            assert (set(cells[0].strip()) == {"×"}) == (step in held), (step, cells)
        assert eighths(drawn[3]) > 0  # step 3's std is finite: its bar is drawn under the ×


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_two_runs_share_one_plot_one_scale_and_one_height(size, monkeypatch):
    """nan_a against nan_b: both runs' bars in one plot, the same value as tall in
    each, the lowest and highest value on its axis, at every size."""
    monkeypatch.chdir(ROOT)
    a, b = (open_recording(os.path.join("tests", "data", f"nan_{x}.h5")) for x in "ab")
    app = HookdbgApp(a, b)
    async with app.run_test(size=size) as pilot:
        screen = app.screen
        assert await until(app, pilot, lambda: screen.diff is not None)
        await settle(app, pilot)
        pane = screen.query_one(PlotPane)
        [plot] = pane.query(Plot)  # one plot, both runs in it
        curve_a, curve_b = plot._curves
        assert "side by side, one scale" in str(pane.border_title)
        lines = text(plot).splitlines()
        assert len(lines) >= 3  # two rows of bars at least, and the step axis
        top, bottom = lines[0].split("┤")[0].strip(), lines[-2].split("┤")[0].strip()
        assert top and bottom and top != bottom  # the range: highest and lowest value
        drawn = columns_drawn(plot)
        for bucket in plot._buckets:
            (step,) = bucket.steps.tolist()
            cells = drawn[step]
            width = len(cells[0])
            a_cells = len(spans(width - (1 if width >= 6 else 0), 2)[0])
            tall = [eighths(cells, 0), eighths(cells, a_cells)]
            if None not in bucket.tops and not any(bucket.bad):
                top_a, top_b = bucket.tops
                if top_a == top_b:
                    assert tall[0] == tall[1], step
                else:
                    assert tall[0] == tall[1] or (tall[0] > tall[1]) == (top_a > top_b), step
        assert len(curve_a.steps) and len(curve_b.steps)
        here = plot._buckets[plot._here]  # the current step's bars: a's colour, then b's
        rows = len(lines) - 1
        lo, hi = plot._range or (0.0, 0.0)
        drawn_here = plot._column(here, 8, rows - 1, rows, lo, hi, here=True)
        styles = {str(drawn_here.get_style_at_offset(app.console, i)) for i in (0, 5)}
        assert len(styles) == 2, styles


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_bars_fill_the_pane(nan_h5, size):
    """5 steps: each step's bar as wide as the pane allows, not 4 cells and blank."""
    app = HookdbgApp(open_recording(nan_h5))
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        plot = app.screen.query_one(Plot)
        width = plot.size.width - plot._axis
        last = plot.column_of(4)
        assert last is not None and last.stop - plot._axis == width
        first = plot.column_of(0)
        assert first is not None and len(first) >= width // 5 - 1
