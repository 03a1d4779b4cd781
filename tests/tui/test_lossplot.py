"""The loss as the first chart (each loss site in turn with ``L``), the plot following
the tree once the user moves in it, and the module's statistics stacked (``m``)."""

import numpy as np
import pytest
from rich.cells import cell_len

from hookdbg.analysis.losses import loss_series
from hookdbg.cells import stat_text
from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.plot import Plot, PlotPane
from hookdbg.tui.statstack import STACKED, StatStack
from tests.tui.pilot import notices, settle, text

SIZES = [(100, 30), (220, 60)]


def _axis(plot: Plot) -> tuple[str, str]:
    """The value axis: the labels at the top and the bottom of the bars."""
    lines = text(plot).split("\n")
    return lines[0].split("┤")[0].strip(), lines[-2].split("┤")[0].strip()


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_plot_opens_on_the_loss_and_follows_the_tree(long_mlp_h5, size):
    rec = open_recording(long_mlp_h5)
    (loss,) = loss_series(rec)
    app = HookdbgApp(rec)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        screen = app.screen
        title = screen.query_one("#plot-title")
        plot = screen.query_one("#plot-a", Plot)
        assert text(title).startswith("loss (numnet_mlp.py:")
        steps, values = plot._curves[0].steps, plot._curves[0].values
        assert steps.tolist() == list(range(60)) and values.tolist() == loss.values.tolist()
        assert _axis(plot) == (stat_text(loss.values.max()), stat_text(loss.values.min()))
        for step in (0, 1, 2, 12):
            assert f"step {step}: {stat_text(loss.values[step])}" in text(title)
            assert plot.current == step
            await pilot.press("right_square_bracket" if step == 2 else "right")  # ]: 10 steps on
            await settle(app, pilot)
        axis = text(plot).split("\n")[-1]
        here = plot.column_of(13)  # the ▲ under the current step's column
        assert here is not None and axis.index("▲") == here.start
        # moving in the tree: the plot shows the module's statistic
        await pilot.press("down")
        await settle(app, pilot)
        assert text(title).startswith("output std of model.body ")
        std = screen.run.series(screen.module, _stat("output std"))
        assert plot._curves[0].values.tolist() == std[1].tolist()
        await pilot.press("down")
        await settle(app, pilot)
        assert text(title).startswith("output std of model.body.0 ")
        # L brings the loss back, and then it stays
        await pilot.press("L")
        await settle(app, pilot)
        assert text(title).startswith("loss (numnet_mlp.py:")
        await pilot.press("down")
        await settle(app, pilot)
        assert text(title).startswith("loss (numnet_mlp.py:")
        await pilot.press("L")
        await settle(app, pilot)
        assert "one loss site: the script calls backward() in one place" in notices(app)


def _stat(label):
    from hookdbg.tui.model import PLOT_STATS

    return next(s for s in PLOT_STATS if s.label == label)


async def test_L_goes_through_the_loss_sites(gan_h5):
    rec = open_recording(gan_h5)
    err_d, err_g = loss_series(rec)
    app = HookdbgApp(rec)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        title = app.screen.query_one("#plot-title")
        plot = app.screen.query_one("#plot-a", Plot)
        for site in (err_d, err_g, err_d):
            assert text(title).startswith(f"{site.label}, loss ")
            assert plot._curves[0].values.tolist() == site.values.tolist()
            assert f"step 0: {stat_text(site.values[0])}" in text(title)
            await pilot.press("L")
            await settle(app, pilot)
        assert "loss 2 of 2 (L: next)" in text(title)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_m_stacks_the_modules_statistics(mlp_h5, size):
    rec = open_recording(mlp_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        screen = app.screen
        await pilot.press("down", "right", "m")  # model.body, step 1
        await settle(app, pilot)
        stack = screen.query_one(StatStack)
        assert stack.display and not screen.query_one(PlotPane).display
        lines = text(stack).split("\n")
        assert lines[0].startswith("output of model.body   steps 0-3   at step 1")
        body = rec.modules.by_name("model.body").id
        _check_stack(stack, _recorded(rec, body, 1))
        assert len(lines) == 1 + len(STACKED) <= stack.size.height
        await pilot.press("right")
        await settle(app, pilot)
        assert "at step 2" in text(stack).split("\n")[0]
        _check_stack(stack, _recorded(rec, body, 2))
        await pilot.press("up")  # another module: its statistics
        await settle(app, pilot)
        assert text(stack).startswith("output of model ")
        await pilot.press("m")
        await settle(app, pilot)
        assert not stack.display and screen.query_one(PlotPane).display
        assert np.isfinite(screen.query_one("#plot-a", Plot)._curves[0].values).all()


def _recorded(rec, module: int, step: int) -> dict[str, str]:
    """Each stacked statistic of the module's output (and its gradient) in a step, as
    the stack prints it."""
    rows = rec.tensors(step, step)
    rows = rows[rows["module"] == module]
    return {
        stat.label: stat_text(float(rows[rows["slot"] == stat.slot][0][stat.column]))
        for stat in STACKED
    }


def _check_stack(stack: StatStack, want: dict[str, str]) -> None:
    lines = text(stack).split("\n")[1:]
    assert [line.split()[0] for line in lines] == [s.label.split()[0] for s in STACKED]
    for stat, line in zip(STACKED, lines, strict=True):
        assert line.lstrip().startswith(stat.label + " ")
        # the value at the current step, whole, after the sparkline
        assert f" {want[stat.label]}" in line, (line, want[stat.label])
        assert cell_len(line) <= stack.size.width
