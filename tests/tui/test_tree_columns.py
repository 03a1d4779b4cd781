"""The module tree never cuts a number: its time shares stand right-aligned at the
pane's edge, as htop's columns do, and a narrow pane leaves out the type, then a
container's self share, then cuts the name (``encod…``), rather than show ``Σ1`` for
``Σ18%`` or ``Dropout 3`` for 3%. No horizontal scrollbar, whose thumb read as a
stray mark."""

import re

import pytest

from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.tree import ModuleTree
from tests.tui.pilot import SIZES, settle

NUMBER = re.compile(r"\d")


def drawn_lines(app, tree: ModuleTree) -> list[str]:
    """The tree's lines as the terminal shows them, inside its border, the scrollbar
    column left out."""
    region = tree.content_region
    right = region.x + tree.scrollable_content_region.width
    strips = app.screen._compositor.render_strips()
    return [s.crop(region.x, right).text for s in strips[region.y : region.bottom]]


def words(label: str) -> set[str]:
    return set(label.replace("-inf ×", "-inf_×").split())


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("recording", ["resnet_h5", "dict_output_h5"])
async def test_every_number_in_the_tree_is_whole_and_its_share_at_the_edge(
    recording, size, request
):
    rec = open_recording(request.getfixturevalue(recording))
    app = HookdbgApp(rec)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        tree = app.screen.query_one(ModuleTree)
        tree.root.expand_all()  # the deepest lines have the least room
        await settle(app, pilot)
        checked: set[int] = set()
        for top in range(0, tree.last_line + 1, tree.scrollable_content_region.height):
            tree.scroll_to(y=top, animate=False)
            await settle(app, pilot)
            for row, line in enumerate(drawn_lines(app, tree)):
                y = int(tree.scroll_y) + row
                if y > tree.last_line:
                    break
                whole = words(tree.label_of(tree._tree_lines[y].node.data))
                for word in words(line):
                    if NUMBER.search(word) and not word.isdigit():  # "0": a Sequential's child
                        assert word in whole, f"{word!r} cut, in {line!r}"
                shares = re.search(r"(Σ?\d+%)\s*$", line)
                if shares is None:
                    assert not re.search(r"\d+%", line), f"a share not at the edge: {line!r}"
                else:
                    assert line.endswith(shares.group(1)), line
                checked.add(y)
        assert len(checked) == tree.last_line + 1
        assert not tree.show_horizontal_scrollbar


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_a_narrow_tree_leaves_out_the_type_before_a_number(resnet_h5, size):
    rec = open_recording(resnet_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        tree = app.screen.query_one(ModuleTree)
        model = tree.line_of(rec.modules.resolve("model").id)
        share = re.search(r"Σ\d+%", tree.label_of(rec.modules.resolve("model").id))
        assert share is not None and model.rstrip().endswith(share.group())
        room = tree.scrollable_content_region.width
        if len("▼ model ResNet " + share.group()) > room:  # no room for the type
            assert "ResNet" not in model


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_gt_and_lt_widen_the_tree_and_z_zooms_the_focused_pane(resnet_h5, size):
    rec = open_recording(resnet_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        screen = app.screen
        tree = screen.query_one(ModuleTree)
        model = rec.modules.resolve("model").id
        width = tree.outer_size.width
        await pilot.press("greater_than_sign", "greater_than_sign")
        await settle(app, pilot)
        assert tree.outer_size.width == width + 8
        assert "ResNet" in tree.line_of(model)  # the room goes to what was left out
        await pilot.press("less_than_sign")
        await settle(app, pilot)
        assert tree.outer_size.width == width + 4
        await pilot.press("z")
        await settle(app, pilot)
        assert screen.maximized is tree and tree.outer_size.width == size[0]
        assert screen.query_one("StepBar").region.height == 1  # still in view
        await pilot.press("z")
        await settle(app, pilot)
        assert screen.maximized is None and tree.outer_size.width == width + 4
        for pane in ("DetailPane", "PlotPane"):
            await pilot.press("tab", "z")
            await settle(app, pilot)
            zoomed = screen.query_one(pane)
            assert screen.maximized is zoomed and zoomed.outer_size.width == size[0]
            await pilot.press("escape")  # as z again
            await settle(app, pilot)
            assert screen.maximized is None
