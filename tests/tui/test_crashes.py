"""Keys that came faster than the screen could follow ended the app: Enter twice on a
list that closes on Enter, PgUp in the command palette before its list was drawn. And
an app that ended on an error said so to the shell only in words, with status 0."""

import itertools

import pytest
from textual.command import CommandPalette
from textual.widgets import DataTable, OptionList

from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.dialogs import GotoStepScreen
from hookdbg.tui.profile import ProfileScreen
from hookdbg.tui.replay import ReplayScreen
from hookdbg.tui.screens import AlertsScreen
from hookdbg.tui.search import SearchScreen
from tests.helpers import hookdbg_in_terminal
from tests.tui.pilot import SIZES, burst, crashed, settle, until


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_enter_twice_closes_a_screen_once(nan_h5, size):
    """The profile, the alerts, the search and the go-to-step dialog close on Enter: a
    second Enter queued behind the first finds them closed, and is the replay's."""
    rec = open_recording(nan_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        replay = app.screen
        assert isinstance(replay, ReplayScreen)
        for key, screen in (("p", ProfileScreen), ("a", AlertsScreen)):
            await pilot.press("home")
            await settle(app, pilot)
            await pilot.press(key)
            assert await until(app, pilot, lambda s=screen: isinstance(app.screen, s))
            table = app.screen.query_one(DataTable)
            chosen = int(str(table.coordinate_to_cell_key(table.cursor_coordinate)[0].value)[:1])
            burst(app, ["enter", "enter"])
            await settle(app, pilot)
            assert crashed(app) is None and app.screen is replay
            if screen is AlertsScreen:  # the origin: step 3, model.standardize
                assert (replay.step, replay.module) == (3, rec.modules.resolve("standardize").id)
            else:
                assert replay.module == chosen
        await pilot.press("slash")
        await pilot.press(*"nan", "enter")
        assert await until(app, pilot, lambda: app.screen.hits)
        burst(app, ["enter", "enter"])
        await settle(app, pilot)
        assert crashed(app) is None and app.screen is replay and replay.step == 3
        await pilot.press("g")
        await settle(app, pilot)
        assert isinstance(app.screen, GotoStepScreen)
        await pilot.press("1")
        burst(app, ["enter", "enter"])
        await settle(app, pilot)
        assert crashed(app) is None and app.screen is replay and replay.step == 1
        for key, screen in (("p", ProfileScreen), ("a", AlertsScreen), ("slash", SearchScreen)):
            await pilot.press(key)
            assert await until(app, pilot, lambda s=screen: isinstance(app.screen, s))
            burst(app, ["escape", "escape"])  # Esc twice: back once, the second is the replay's
            await settle(app, pilot)
            assert crashed(app) is None and app.screen is replay


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_page_keys_in_the_palette_before_its_list_is_drawn(mlp_h5, size):
    """Ctrl+P, a letter and PgUp at once: Textual's list had no lines to page by yet.
    Whether the list is drawn before the page key arrives is a race: tried often."""
    app = HookdbgApp(open_recording(mlp_h5))
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        for page, letter in itertools.product(("pageup", "pagedown"), "sfp"):
            burst(app, ["ctrl+p", letter, page])
            await settle(app, pilot)
            assert crashed(app) is None and isinstance(app.screen, CommandPalette)
            await pilot.press("escape")
            await settle(app, pilot)
            assert isinstance(app.screen, ReplayScreen)
        await pilot.press("ctrl+p", "s")  # once drawn, the list pages
        await settle(app, pilot)
        options = app.screen.query_one(OptionList)
        await pilot.press("pageup")
        await settle(app, pilot)
        top = options.highlighted
        await pilot.press("pagedown")
        await settle(app, pilot)
        assert top == 0 and (options.highlighted or 0) > top


# the command's way of running the app, on an app that fails as it starts: no key
# makes hookdbg's own fail any more
FAILING = """
import click
from textual.app import App
from hookdbg.cli.tui import run_app


class Failing(App):
    def on_mount(self):
        raise RuntimeError("an error inside the app")


click.command()(lambda: run_app(Failing()))()
"""


def test_an_app_that_ends_on_an_error_exits_non_zero():
    """Textual prints the error as the app ends; the shell sees a failure too."""
    status, screen = hookdbg_in_terminal(script=FAILING, size=(30, 100))
    assert status == 1, screen[-2000:]
    assert b"an error inside the app" in screen


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_keys_that_open_a_screen_twice_open_it_once(mlp_h5, size):
    """Enter twice on a command the palette found closed the palette twice (popping
    the replay: the app ended) and ran the command twice; ``p`` twice before the
    profile was read opened two profiles, and ``p`` then ``/`` a profile over the search."""
    app = HookdbgApp(open_recording(mlp_h5))
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        replay = app.screen
        await pilot.press("ctrl+p", *"Profile")
        await settle(app, pilot)
        burst(app, ["enter", "enter"])
        await settle(app, pilot)
        assert crashed(app) is None and isinstance(app.screen, ProfileScreen)
        assert app.screen_stack == [replay, app.screen]
        await pilot.press("escape")
        for keys in (["p", "p"], ["p", "a"]):  # one screen over the replay
            burst(app, keys)
            await settle(app, pilot)
            assert crashed(app) is None and len(app.screen_stack) == 2, app.screen_stack
            assert isinstance(app.screen, (ProfileScreen, AlertsScreen))
            await pilot.press("escape")
            await settle(app, pilot)
            assert app.screen is replay
        burst(app, ["p", "slash"])
        await settle(app, pilot)
        assert app.screen_stack == [replay, app.screen] and isinstance(app.screen, SearchScreen)
