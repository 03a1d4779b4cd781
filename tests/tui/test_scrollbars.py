"""A scrollbar's thumb is whole cells of a colour of its own, apart from the track's
in a 256-colour terminal too. Textual ends a thumb in an eighth-of-a-cell glyph
(▁ ▆ ▍ ▉), which beside the tree's shares and the tables' numbers reads as a stray
mark."""

import pytest
from rich.color import ColorSystem
from rich.segment import Segment
from textual.scrollbar import ScrollBarRender
from textual.widget import Widget
from textual.widgets import DataTable

from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.profile import ProfileScreen
from hookdbg.tui.tree import ModuleTree
from tests.tui.pilot import SIZES, scrollbar_cells, settle, until

PARTS = set(ScrollBarRender.VERTICAL_BARS + ScrollBarRender.HORIZONTAL_BARS) - {" "}


def thumb_and_track(cells: list[Segment]) -> tuple[set[str], set[str]]:
    """The colours of the thumb's cells and of the track's, as a 256-colour terminal
    shows them (the thumb is drawn reversed, in its colour as the text's)."""
    thumb, track = set(), set()
    for cell in cells:
        style = cell.style
        assert style is not None
        colour = style.color if style.reverse else style.bgcolor
        assert colour is not None, cell
        (thumb if style.reverse else track).add(colour.downgrade(ColorSystem.EIGHT_BIT).name)
    return thumb, track


async def scroll_through(app, pilot, widget: Widget) -> int:
    """Scroll ``widget`` from top to bottom a third of its window at a time; at each
    place, its scrollbars are whole cells, the thumb apart from the track. Returns how
    many places had a scrollbar."""
    seen = 0
    step = max(1, widget.scrollable_content_region.height // 3)
    for y in range(0, int(widget.max_scroll_y) + step, step):
        widget.scroll_to(y=y, animate=False)
        await settle(app, pilot)
        cells = scrollbar_cells(app, widget)
        if not cells:
            continue
        seen += 1
        drawn = "".join(c.text for c in cells)
        assert not PARTS & set(drawn), f"a thumb's end glyph at y={y}: {drawn!r}"
        thumb, track = thumb_and_track(cells)
        assert thumb and track and not thumb & track, (thumb, track)
    return seen


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_tree_and_the_profile_scroll_with_whole_thumbs(resnet_h5, size):
    app = HookdbgApp(open_recording(resnet_h5))
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        tree = app.screen.query_one(ModuleTree)
        tree.root.expand_all()  # longer than the window at every size
        await settle(app, pilot)
        assert await scroll_through(app, pilot, tree) > 1
        await pilot.press("p")
        assert await until(app, pilot, lambda: isinstance(app.screen, ProfileScreen))
        await settle(app, pilot)
        assert await scroll_through(app, pilot, app.screen.query_one(DataTable)) > 1
