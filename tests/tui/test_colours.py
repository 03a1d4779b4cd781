"""Colours that every terminal shows: a NaN row's tint in a 256-colour terminal."""

import textual.constants
from rich.color import ColorSystem

from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.detail import DetailPane, DetailTable
from tests.helpers import ROOT
from tests.tui.pilot import SIZE, records, settle


async def test_nan_rows_are_tinted_not_black_in_a_256_colour_terminal(monkeypatch):
    """tmux without COLORTERM: the app's console writes 256 colours, to which a
    translucent tint blended into a dark background rounds as black (colour 16)."""
    monkeypatch.setattr(textual.constants, "COLOR_SYSTEM", "256")
    monkeypatch.chdir(ROOT)
    for theme in ("textual-dark", "textual-light"):
        app = HookdbgApp(open_recording("tests/data/nan_a.h5"))
        async with app.run_test(size=SIZE) as pilot:
            assert app.console.color_system == "256"
            await pilot.press("f")  # the NaN's origin: its rows tinted
            await settle(app, pilot)
            app.theme = theme  # after the table is drawn: its cells take the new colours
            await settle(app, pilot)
            table = app.screen.query_one(DetailTable)
            tint = app.screen.query_one(DetailPane).get_component_rich_style(
                "detail-pane--nonfinite"
            )
            y = next(i for i, r in enumerate(records(table)) if r["nan/inf"] not in ("0", "-"))
            table.show_cursor = False  # the cursor's cell has its own colours
            await settle(app, pilot)
            strip = table.render_line(y + 1)  # below the header
            tinted = [s.style for s in strip if s.text.strip() and s.style]
            assert tinted and all(s.bgcolor == tint.bgcolor for s in tinted)
            plain = [s.style for s in strip if not s.text.strip() and s.style]
            drawn = {_in_256(s.bgcolor) for s in tinted}
            assert (0, 0, 0) not in drawn, theme  # no black block
            assert drawn.isdisjoint(_in_256(s.bgcolor) for s in plain), theme  # still a tint
            assert all(_in_256(s.color) != _in_256(s.bgcolor) for s in tinted), theme


def _in_256(color) -> tuple[int, int, int]:
    """The colour a 256-colour terminal shows for ``color``."""
    return tuple(color.downgrade(ColorSystem.EIGHT_BIT).get_truecolor())
