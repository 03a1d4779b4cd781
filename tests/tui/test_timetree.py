"""The time tree (``t``): bars as wide as their recorded time, under their caller, moved
through with the arrows; Enter goes to the module in the replay."""

import itertools

import pytest
from rich.cells import cell_len

from hookdbg.analysis.timetree import time_tree
from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.dialogs import HelpScreen
from hookdbg.tui.replay import ReplayScreen
from hookdbg.tui.timetree import (
    TimeTreeScreen,
    TimeTreeView,
    duration,
    label_options,
    layout,
    short_name,
)
from hookdbg.tui.tree import ModuleTree
from tests.analysis.test_timetree import record_on_device
from tests.tui.pilot import notices, settle, text

SIZES = [(100, 30), (220, 60)]


def _check_layout(tree, width, device=False):
    """Each bar ``width * time / step time`` cells wide (edges rounded: one cell off at
    most), inside its parent's cells, and apart from its neighbours."""
    rows = layout(tree, width, device)
    whole = tree.root.time(device)
    assert [(b.x0, b.x1) for b in rows[0]] == [(0, width)]
    for row in rows:
        for bar in row:
            assert abs(bar.width - width * bar.node.time(device) / whole) <= 1
            if bar.parent is not None:
                assert bar.parent.x0 <= bar.x0 <= bar.x1 <= bar.parent.x1
                assert bar.parent.node.children[bar.nth] is bar.node
        for left, right in itertools.pairwise(row):
            assert left.x1 <= right.x0
    return rows


@pytest.mark.parametrize("width", [100, 220, 37])
def test_widths_are_proportional_and_nest(resnet_h5, width):
    with open_recording(resnet_h5) as rec:
        tree = time_tree(rec, 1)
    rows = _check_layout(tree, width)
    # children packed left to right from their parent's start, in call order
    for row in rows[1:]:
        for bar in row:
            siblings = [b for b in row if b.parent is bar.parent]
            if bar.nth == 0:
                assert bar.x0 == bar.parent.x0
            else:
                before = next(b for b in siblings if b.nth == bar.nth - 1)
                assert bar.x0 == before.x1
    assert len(rows) >= 7  # step, section, model, layer, block, downsample, its conv


def _cells(rows):
    return [[(id(b.node), b.x0, b.x1) for b in row] for row in rows]


def _drawn(view):
    """Each bar's cells as drawn: the text of its row from x0 to x1."""
    lines = text(view).split("\n")
    return [
        (bar, lines[bar.depth][bar.x0 : bar.x1]) for row in view.rows for bar in row if bar.width
    ]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_time_tree_of_the_step(mlp_h5, size):
    rec = open_recording(mlp_h5)
    want = time_tree(rec, 1)
    app = HookdbgApp(rec)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        await pilot.press("right", "t")  # step 1
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, TimeTreeScreen)
        view = screen.query_one(TimeTreeView)
        assert view.rows and view.rows[0][0].x1 == view.size.width
        # the bars drawn are the recorded times', each label whole or left out
        got = {(b.node.label, b.node.phase, b.node.total) for row in view.rows for b in row}
        assert got == {(n.label, n.phase, n.total) for n, _ in want.nodes()}
        _check_layout(view.steptree, view.size.width)
        for bar, cells in _drawn(view):
            label = cells.strip()
            options = label_options(bar.node, False, bar.depth == 0)
            if bar.width > cell_len(options[-1]):  # room for its total: it is there
                assert label in options, (label, options)
                assert cells.startswith(" " + label)
            else:
                cut = label.endswith("…") and short_name(bar.node).startswith(label[:-1])
                assert cut or not label, (label, options)
        lines = text(view).split("\n")
        assert lines[0].strip() == f"step 1 {duration(want.root.total)} (outside modules " + (
            f"{duration(want.root.self_time)})"
        )
        # the sections in time order from the left edge (their labels, as wide as their
        # times allow, are checked above: a fast forward can leave room for its time alone)
        sections = view.rows[1]
        assert [b.node.label for b in sections][:2] == ["forward", "backward"]
        assert sections[0].x0 == 0
        # the line below says all of the selected call, numbers whole
        await pilot.press("down", "down")  # forward, then its first call: the model
        await settle(app, pilot)
        model = view.selected
        assert model.module.name == "model" and model.phase == 0
        info = text(screen.query_one("#time-tree-info"))
        share = f"{model.total / want.root.total:.1%}"
        assert f"host: total {duration(model.total)}, self {duration(model.self_time)}" in info
        assert f"{share} of step 1" in info
        assert max(cell_len(line) for line in info.split("\n")) <= size[0] - 2
        await pilot.press("down")
        assert view.selected.module.name == "model.body"
        await pilot.press("right")
        assert view.selected.module.name == "model.head"
        await pilot.press("up")
        assert view.selected is model
        await pilot.press("down", "enter")  # go to model.body in the replay
        await settle(app, pilot)
        replay = app.screen
        assert isinstance(replay, ReplayScreen)
        body = rec.modules.by_name("model.body").id
        assert replay.module == body and replay.step == 1
        assert replay.query_one(ModuleTree).cursor_node.data == body
        assert text(replay.query_one("#detail-title")).startswith("model.body ")


async def test_escape_and_t_go_back_and_loss_sites_are_not_jumped_to(gan_h5):
    rec = open_recording(gan_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        start = app.screen.module
        await pilot.press("t")
        await settle(app, pilot)
        view = app.screen.query_one(TimeTreeView)
        await pilot.press("down", "right", "down")  # backward, its first pass
        assert view.selected.module.name == "errD"
        await pilot.press("enter")  # a loss site is not in the module tree
        await settle(app, pilot)
        assert isinstance(app.screen, TimeTreeScreen)
        assert "errD is a loss site, not in the module tree" in notices(app)
        await pilot.press("right")
        assert view.selected.module.name == "errG"
        await pilot.press("escape")
        await settle(app, pilot)
        assert isinstance(app.screen, ReplayScreen) and app.screen.module == start
        await pilot.press("t")
        await settle(app, pilot)
        await pilot.press("t")
        await settle(app, pilot)
        assert isinstance(app.screen, ReplayScreen)
        await pilot.press("question_mark")
        await settle(app, pilot)
        assert isinstance(app.screen, HelpScreen)
        assert "time tree of the step" in text(app.screen.query_one("#help-keys"))


async def test_device_times_size_the_bars_and_d_switches_to_the_hosts(tmp_path, monkeypatch):
    rec = open_recording(record_on_device(tmp_path / "device.h5", monkeypatch))
    app = HookdbgApp(rec)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        await pilot.press("t")
        await settle(app, pilot)
        view = app.screen.query_one(TimeTreeView)
        tree = view.steptree
        assert tree.on_device and view.device
        title = text(app.screen.query_one("#screen-title"))
        assert "width = total time on the device" in title and "d: host time" in title
        assert _cells(view.rows) == _cells(_check_layout(tree, view.size.width, device=True))
        await pilot.press("down", "down")  # forward, the model
        info = text(app.screen.query_one("#time-tree-info"))
        node = view.selected
        assert f"device: total {duration(node.device_total)}, self " in info
        await pilot.press("d")
        await settle(app, pilot)
        assert not view.device
        assert "width = total time on the host" in text(app.screen.query_one("#screen-title"))
        text(view)  # drawn again
        assert _cells(view.rows) == _cells(_check_layout(tree, view.size.width, device=False))


async def test_a_model_nested_1000_deep_is_drawn_and_its_deepest_call_scrolled_to(deep_h5):
    """Built, laid out and walked with loops: a chain deeper than Python's recursion
    limit draws a row per level, and selecting its innermost call scrolls down to it."""
    app = HookdbgApp(open_recording(deep_h5))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        await pilot.press("t")
        await settle(app, pilot)
        view = app.screen.query_one(TimeTreeView)
        deepest, depth = max(view.steptree.nodes(), key=lambda nd: nd[1])
        assert depth > 1000 and len(view.rows) == depth + 1
        view.selected = deepest
        await settle(app, pilot)
        scroll = app.screen.query_one("#time-tree-scroll")
        assert scroll.scroll_y > depth - 30
        info = text(app.screen.query_one("#time-tree-info"))
        assert info.startswith(deepest.module.name)
        await pilot.press("up")
        assert view.selected.children[0] is deepest
