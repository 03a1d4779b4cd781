"""The module tree's marks as a user in a 100-column tmux pane sees them: before the
name, so no scrollbar hides them; a folded branch says what is marked inside it; a
container shows its total time, labelled apart from self time."""

import os

import pytest

from hookdbg.read import open_recording
from hookdbg.store.schema import Phase
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.tree import ModuleTree
from tests.helpers import ROOT
from tests.tui.pilot import SIZE, settle, text, until

NARROW, WIDE = (100, 30), (220, 60)


def drawn(app, widget) -> list[str]:
    """The lines of the screen inside a widget's region, as the terminal shows them
    (cut where the widget is cut, scrollbars included)."""
    region = widget.region
    strips = app.screen._compositor.render_strips()
    return [s.crop(region.x, region.right).text for s in strips[region.y : region.bottom]]


def line_of(app, tree: ModuleTree, name: str) -> str:
    """The drawn tree line of the module whose own name (last part) is ``name`` (cut
    with "…" where the marks leave it too little room)."""
    top = 1 - int(tree.scroll_y)  # the border, then the first line shown
    modules = app.screen.run.rec.modules
    found = [
        line
        for y, line in enumerate(drawn(app, tree))
        if 0 <= y - top <= tree.last_line
        and modules[tree._tree_lines[y - top].node.data].name.rpartition(".")[2] == name
    ]
    assert len(found) == 1, (name, drawn(app, tree))
    return found[0]


def _nan_pair():
    return [open_recording(os.path.join(ROOT, "tests", "data", f"nan_{x}.h5")) for x in "ab"]


@pytest.mark.parametrize("size", [NARROW, WIDE], ids=["100x30", "220x60"])
async def test_marks_are_drawn_in_full_beside_the_name_at_any_width(size):
    """nan_a vs nan_b at the first divergence (step 3): model diverges first, a NaN is
    born in standardize, and every mark is on screen in full next to its module."""
    a, b = _nan_pair()
    app = HookdbgApp(a, b)
    async with app.run_test(size=size) as pilot:
        screen = app.screen
        assert await until(app, pilot, lambda: screen.diff is not None)
        await settle(app, pilot)
        tree = screen.query_one(ModuleTree)
        assert screen.step == 3
        model = line_of(app, tree, "model")
        assert "★first" in model and "≠fwd" in model
        assert "◆NaN" in line_of(app, tree, "standardize")
        for name in ("proj", "length", "head"):  # NaN/inf passed on, and different
            line = line_of(app, tree, name)
            assert "≠fwd" in line and "⚠" in line
        # the words behind the marks are under the detail pane's title
        said = text(screen.query_one("#detail-title"))
        assert "★first the two runs' first divergence" in said
        assert "≠fwd forward differs from b" in said


async def test_a_folded_branch_shows_what_is_marked_inside_it(nan_h5):
    rec = open_recording(nan_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=NARROW) as pilot:
        await settle(app, pilot)
        await pilot.press("f")  # the NaN's origin: model.standardize, step 3
        await settle(app, pilot)
        tree = app.screen.query_one(ModuleTree)
        model = rec.modules.resolve("model").id
        assert "◆" not in line_of(app, tree, "model")  # unfolded: the child shows its own
        tree.root.children[0].collapse()
        await settle(app, pilot)
        folded = line_of(app, tree, "model")
        assert "◆" in folded and "…" in folded
        assert folded.index("…") < folded.index(" model ")  # before the name: never cut
        assert "◆" in tree.line_of(model) and "◆" not in tree.label_of(model)
        tree.root.children[0].expand()
        await settle(app, pilot)
        assert "…" not in line_of(app, tree, "model")


async def test_a_folded_branch_shows_the_first_divergence_inside_it(mlp_h5, mlp_lr_h5):
    app = HookdbgApp(open_recording(mlp_h5), open_recording(mlp_lr_h5))
    async with app.run_test(size=NARROW) as pilot:
        screen = app.screen
        assert await until(app, pilot, lambda: screen.diff is not None)
        await settle(app, pilot)
        tree = screen.query_one(ModuleTree)
        assert "★first" in line_of(app, tree, "1")  # model.body.1
        assert "…" not in line_of(app, tree, "body")
        tree.select_module(tree.first_module)  # the cursor off the branch it folds
        await settle(app, pilot)
        tree.root.children[0].children[0].collapse()  # model.body
        await settle(app, pilot)
        inside = next(w for w in line_of(app, tree, "body").split() if w.endswith("…"))
        assert "★" in inside and "≠" in inside


async def test_containers_show_their_total_time_and_leaves_their_own(mlp_h5):
    rec = open_recording(mlp_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        tree = app.screen.query_one(ModuleTree)
        calls = rec.calls(0, 0)
        step = rec.steps[rec.steps["step"] == 0][0]
        length = float(step["end"] - step["start"])

        def share(name: str, column: str) -> float:
            mine = calls[calls["module"] == rec.modules.resolve(name).id]
            return float(mine[column][mine["phase"] != Phase.OPT].sum()) / length

        body = tree.label_of(rec.modules.resolve("model.body").id)
        total = share("model.body", "total")
        assert total > 2 * share("model.body", "self")  # its children's time, counted in
        assert f"Σ{total:.0%}" in body
        head = tree.label_of(rec.modules.resolve("model.head").id)  # a leaf: its own time
        own = share("model.head", "self")
        # a share under half a percent (a step the machine stalled in) is not shown
        assert (f" {own:.0%}" in head) if own >= 0.005 else ("%" not in head)
        assert "Σ" not in head
