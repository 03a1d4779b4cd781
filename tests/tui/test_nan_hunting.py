"""Finding a NaN on screen: counts next to the slot, nan printed as nan, tinted rows, a
readable table at 80x24, and plots that mark NaN/inf steps."""

import numpy as np
import pytest

from hookdbg.cells import stat_text
from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.detail import DetailPane, DetailTable
from hookdbg.tui.stepbar import StepBar
from hookdbg.tui.tree import ModuleTree
from tests.helpers import hookdbg
from tests.tui.pilot import SIZE, SIZES, SMALL, columns, notices, records, settle, text


async def test_non_finite_values_read_as_such_in_a_small_terminal(nan_h5):
    rec = open_recording(nan_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=SMALL) as pilot:
        await settle(app, pilot)
        app.screen.go_to(3, rec.modules.resolve("proj").id)
        await settle(app, pilot)
        table = app.screen.query_one(DetailTable)
        shown = columns(table)
        assert shown.index("nan/inf") == shown.index("slot") + 1  # next to the slot
        assert {"mean", "std"} <= set(shown)  # numbers, even at 80x24
        assert table.region.right <= SMALL[0]
        assert "columns: z zooms" in app.screen.query_one(DetailPane).border_subtitle
        grad = next(r for r in records(table) if r["slot"] == "param_grad[weight]")
        assert grad["nan/inf"] == "256" and grad["mean"] == "nan"  # NaN, not "not recorded"
        assert _tinted(app, table) == [r["nan/inf"] not in ("0", "-") for r in records(table)]
        assert any(_tinted(app, table))
        # the table moves across by keyboard, and ←/→ still change the step
        table.focus()
        await pilot.press("shift+right", "shift+right")
        assert table.cursor_coordinate.column == 2
        await pilot.press("left")
        await settle(app, pilot)
        assert "step 2" in text(app.screen.query_one(StepBar))
        before = records(table)  # before the NaN: nothing tinted, no nan
        assert before and not any(_tinted(app, table))
        assert all(r["nan/inf"] == "0" and r["mean"] != "nan" for r in before)


def _tinted(app, table) -> list[bool]:
    """Which rows have the non-finite tint, as drawn."""
    tint = app.screen.query_one(DetailPane).get_component_rich_style("detail-pane--nonfinite")
    return [
        bool(table.get_row_at(i)[0].style)
        and _style(table.get_row_at(i)[0]).bgcolor == tint.bgcolor
        for i in range(table.row_count)
    ]


def _style(cell):
    from rich.style import Style

    return cell.style if isinstance(cell.style, Style) else Style.parse(cell.style)


async def test_a_run_with_a_nan_opens_where_the_first_was_born(nan_h5):
    """As a comparison opens on the first divergence: step 3, model.standardize, said."""
    rec = open_recording(nan_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        screen = app.screen
        assert screen.step == 3 and screen.module == rec.modules.resolve("standardize").id
        assert "step 3" in text(screen.query_one(StepBar))
        assert "model.standardize" in text(screen.query_one("#detail-title"))
        tree = screen.query_one(ModuleTree)
        assert tree.cursor_node is not None and tree.cursor_node.data == screen.module
        assert "◆NaN" in tree.label_of(screen.module)
        assert not notices(app)  # no toast over the plot: a line at the top says it
        notice = text(screen.query_one("#notice"))
        assert notice.endswith("; opened where the first was born: model.standardize, step 3")


async def test_the_stored_tensors_histogram_says_which_tensor_it_is_of(nan_h5):
    """The flight recorder keeps the origin's inputs and output: the line under the
    table is of one of them, and says which."""
    rec = open_recording(nan_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)  # it opens on the origin, model.standardize
        said = text(app.screen.query_one("#histogram"))
        (output,) = [c for c in rec.captured(app.screen.module, 3) if c.label == "output"]
        values = rec.tensor(output)
        finite = values[np.isfinite(values)]
        assert said.endswith("(output, flight recorder)")
        assert said.startswith(f"values {stat_text(finite.min())} ")
        assert f" {stat_text(finite.max())}  (output" in said


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_histogram_line_never_cuts_its_largest_value(nan_h5, size):
    """At 80 columns the line ran past the pane's edge and lost the largest value and
    what the values are of: what they are of goes first, then bars are merged."""
    rec = open_recording(nan_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)  # it opens on the origin, model.standardize
        box = app.screen.query_one("#histogram")
        said = text(box)
        (output,) = [c for c in rec.captured(app.screen.module, 3) if c.label == "output"]
        values = rec.tensor(output)
        finite = values[np.isfinite(values)]
        assert len(said) <= box.size.width, (said, box.size)
        assert said.startswith(f"values {stat_text(finite.min())} ")
        assert f" {stat_text(finite.max())}" in said, said
        if size[0] >= 220:
            assert said.endswith(f" {stat_text(finite.max())}  (output, flight recorder)")


LOSS_NAN = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(4):
    opt.zero_grad()
    out = model(torch.randn(16, 4))
    shift = -100.0 if step == 2 else 1.0
    loss = torch.log(out.pow(2).mean() + shift)  # NaN at step 2, in no module
    loss.backward()
    opt.step()
"""


async def test_a_nan_born_in_the_loss_opens_on_the_loss_and_says_so(tmp_path):
    """The loss site is no module of the tree: what its alert says stands under the
    detail's title."""
    script = tmp_path / "loss_nan.py"
    script.write_text(LOSS_NAN)
    assert hookdbg("record", "-q", "-o", tmp_path / "run.h5", script).returncode == 0
    rec = open_recording(tmp_path / "run.h5")
    (alert,) = [a for a in rec.alerts if a["step"] == 2]
    app = HookdbgApp(rec)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.screen.step == 2 and app.screen.module == int(alert["module"])
        title = text(app.screen.query_one("#detail-title"))
        assert "◆ " + alert["message"].decode().splitlines()[0] in title
