"""Moving through a recording fast and landing where asked: folded branches, late
results, go to step, pages, clicks, the module finder, copy."""

import re
import time

from textual.widgets import DataTable

from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.detail import DetailTable
from hookdbg.tui.messages import Goto
from hookdbg.tui.plot import Plot
from hookdbg.tui.stepbar import StepBar
from hookdbg.tui.tree import ModuleTree
from tests.tui.pilot import SIZE, notices, records, settle, text, until


def title(app) -> str:
    return text(app.screen.query_one("#detail-title"))


def bar_step(app) -> int:
    return int(text(app.screen.query_one(StepBar)).split()[1])


async def test_a_jump_into_a_folded_branch_lands_on_the_module(resnet_h5):
    rec = open_recording(resnet_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        tree = app.screen.query_one(ModuleTree)
        conv = rec.modules.resolve("layer3.0.conv1")
        assert not tree._node_of[conv.parent].is_expanded  # layer3.0 starts folded
        await pilot.press("slash")
        await pilot.press(*"layer3.0.conv1 slot:output", "enter")
        await settle(app, pilot)
        await pilot.press("enter")
        await settle(app, pilot)
        assert title(app).startswith("model.layer3.0.conv1 ")
        assert tree.cursor_node is not None and tree.cursor_node.data == conv.id
        await pilot.press("down")  # on from the module, not from the root
        await settle(app, pilot)
        assert title(app).startswith("model.layer3.0.bn1 ")


async def test_late_results_of_earlier_steps_are_dropped(long_mlp_h5):
    """Holding → : many step changes while reads are still running; what the detail,
    the plot and the tree show at the end is the step the bar shows. Reads of even
    steps take longer (a slow disk), so they finish after the reads of later steps."""
    rec = open_recording(long_mlp_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        view = app.screen.run
        read = view.detail

        def slow_on_even_steps(module: int, step: int, evals: bool = False, run=None):
            time.sleep(0.5 if step % 2 == 0 else 0.0)
            return read(module, step, evals, run)

        view.detail = slow_on_even_steps
        app.screen.go_to(module=rec.modules.resolve("head").id)
        for _ in range(3):
            for _ in range(12):
                await pilot.press("right")
                await pilot.pause(0.01)  # faster than a read: workers overlap
            await pilot.press("left")
        await settle(app, pilot)
        step = bar_step(app)
        assert step == 33
        assert title(app).startswith(f"model.head  Linear  step {step}")
        assert f"step {step}:" in text(app.screen.query_one("#plot-title"))
        want = rec.tensors(step, step)
        want = want[(want["module"] == rec.modules.resolve("head").id) & (want["slot"] == 1)]
        output = next(r for r in records(app.screen.query_one(DataTable)) if r["slot"] == "output")
        assert output["mean"] == f"{want['mean'][0]:.4g}"


async def test_go_to_step_pages_and_clicks(long_mlp_h5):
    app = HookdbgApp(open_recording(long_mlp_h5))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("g", *"42", "enter")
        await settle(app, pilot)
        assert bar_step(app) == 42 and "step 42" in title(app)
        await pilot.press("colon", *"7", "enter")
        await settle(app, pilot)
        assert bar_step(app) == 7
        await pilot.press("right_square_bracket")
        await settle(app, pilot)
        assert bar_step(app) == 17
        await pilot.press("right_curly_bracket")
        await settle(app, pilot)
        assert bar_step(app) == 59  # the last step: a page past it stops there
        await pilot.press("left_square_bracket")
        await settle(app, pilot)
        assert bar_step(app) == 49
        await pilot.press("left_curly_bracket")
        await settle(app, pilot)
        assert bar_step(app) == 0
        bar = app.screen.query_one(StepBar)
        await pilot.click(StepBar, offset=(1 + bar._timeline_at + 30 // bar._per, 0))
        await settle(app, pilot)
        assert bar_step(app) == 30 and "step 30" in title(app)
        plot = app.screen.query_one("#plot-a", Plot)
        column = plot.column_of(5)
        assert column is not None
        await pilot.click("#plot-a", offset=(column.start, 1))
        await settle(app, pilot)
        assert bar_step(app) == 5 and "step 5" in title(app)


async def test_the_plot_marker_never_covers_part_of_a_step_label(long_mlp_h5):
    """▲ under the last steps would turn the label 59 into '5▲': a label the marker
    would cover is left out whole."""
    app = HookdbgApp(open_recording(long_mlp_h5))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        plot = app.screen.query_one("#plot-a", Plot)
        for keys in (("end",), ("left",), ("home",), ("right",)):
            await pilot.press(*keys)
            await settle(app, pilot)
            axis = plot.render().plain.splitlines()[-1]
            assert "▲" in axis
            assert set(re.findall(r"\d+", axis)) <= {"0", "59"}, axis
        assert "59" in axis  # the labels the marker leaves alone stay


async def test_the_palette_finds_modules_by_name(resnet_h5):
    app = HookdbgApp(open_recording(resnet_h5))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("ctrl+p", *"layer3")
        assert await until(app, pilot, lambda: "layer3" in _palette_text(app))
        assert "No matches" not in _palette_text(app)
        await pilot.press("enter")
        await settle(app, pilot)
        assert title(app).startswith("model.layer3")


def _palette_text(app) -> str:
    from textual.command import CommandList

    lists = app.screen.query(CommandList)
    if not lists:
        return ""
    options = lists.first()
    return " ".join(str(options.get_option_at_index(i).prompt) for i in range(options.option_count))


async def test_y_copies_the_module_name_or_the_cell(mlp_h5):
    rec = open_recording(mlp_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        app.screen.go_to(module=rec.modules.resolve("head").id)
        await settle(app, pilot)
        await pilot.press("y")
        assert app.clipboard == "model.head" and "copied model.head" in notices(app)
        app.screen.query_one(DetailTable).focus()
        await pilot.press("shift+right", "shift+right", "shift+right")  # phase, slot, nan/inf, min
        await settle(app, pilot)
        table = app.screen.query_one(DetailTable)
        row = records(table)[table.cursor_coordinate.row]
        assert table.cursor_coordinate.column == 3
        await pilot.press("y")
        assert float(app.clipboard) == float(row["min"]) or app.clipboard.startswith(
            row["min"].rstrip("0")[:4]
        )
        assert f"copied {app.clipboard}" in notices(app)


async def test_a_recording_without_root_modules_shows_its_modules(rootless_h5):
    rec = open_recording(rootless_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        tree = app.screen.query_one(ModuleTree)
        assert len(tree._node_of) == len(rec.modules)
        assert "m0 Linear" in tree.label_of(rec.modules.resolve("model.m0").id)
        assert title(app).startswith("model.m0 ")
        await pilot.press("down")
        await settle(app, pilot)
        assert title(app).startswith("model.m1 ")


async def test_eval_batches_are_marked_and_browsed_apart(eval_h5):
    rec = open_recording(eval_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        bar = app.screen.query_one(StepBar)
        assert text(bar).startswith(" step 0 ") and "4 eval batches (e)" in text(bar)
        app.screen.go_to(module=rec.modules.resolve("head").id)
        await settle(app, pilot)
        await pilot.press("e")
        await settle(app, pilot)
        assert text(bar).startswith(" eval batch 0 ") and "1 of 4" in text(bar)
        assert title(app).startswith("model.head  Linear  eval batch 0")
        shown = records(app.screen.query_one("#detail-table", DataTable))
        assert {r["phase"] for r in shown} == {"fwd"}  # forward only
        await pilot.press("right")
        await settle(app, pilot)
        assert title(app).startswith("model.head  Linear  eval batch 1")
        await pilot.press("e")
        await settle(app, pilot)
        assert text(bar).startswith(" step 0 ") and title(app).startswith(
            "model.head  Linear  step 0"
        )


async def test_a_model_nested_1000_deep_opens_and_its_deepest_module_is_reached(deep_h5):
    """The tree is built with a loop: a chain of modules deeper than Python's recursion
    limit opens, and a jump to its innermost module unfolds every branch above it."""
    rec = open_recording(deep_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        tree = app.screen.query_one(ModuleTree)
        assert len(tree._node_of) == 2000
        deepest = max(rec.modules, key=lambda m: m.depth)
        assert deepest.depth == 1000
        app.screen.post_message(Goto(module=deepest.id))
        assert await until(app, pilot, lambda: tree.cursor_node.data == deepest.id)
        assert title(app).startswith("model.inner.inner.")
        assert "Linear" in title(app)
