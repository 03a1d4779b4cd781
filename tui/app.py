"""``hookdbg tui``: the Textual app. It holds the open recordings and the command
palette; the replay screen does the work (tui/replay.py)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

from textual import on
from textual.app import App, SystemCommand
from textual.command import CommandList, CommandPalette
from textual.message import Message
from textual.screen import Screen
from textual.scrollbar import ScrollBar, ScrollBarRender
from textual.theme import ThemeProvider
from textual.widgets import Button, Input, OptionList

from hookdbg.read import RankSet, Recording

from .dialogs import WaitScreen
from .finder import ModuleFinder
from .messages import Opened
from .model import PLOT_STATS, RunView
from .replay import ReplayScreen


class Palette(CommandPalette):
    """Textual's command palette (8.2.8, the newest release), guarded against keys
    that come faster than it can follow.

    - PgUp/PgDn are ignored until its list is laid out: Textual pages by line positions
      its OptionList computes at layout, so PgUp right after Ctrl+P and a letter looked
      up a line not made yet (``KeyError`` in ``OptionList._move_page``).
    - Once it has closed, a second Enter queued behind the one that picked a command
      is dropped: Textual's palette would close again, popping the screen under it
      (``ScreenStackError``), and run the command twice."""

    def _action_command_list(self, action: str) -> None:
        if action.startswith("page_") and not self.query_one(CommandList).scrollable_content_region:
            return
        super()._action_command_list(action)

    @on(Input.Submitted)
    @on(Button.Pressed)
    @on(OptionList.OptionSelected)
    def _closed_already(self, event: Message) -> None:
        if not self.is_active:  # Textual's own handlers, in the class below, are skipped
            event.stop()
            event.prevent_default()


class WholeCellThumb(ScrollBarRender):
    """A scrollbar thumb of whole cells. Textual ends a thumb in an eighth-of-a-cell
    glyph (▁ ▆ ▍ ▉) in the track's colour over the thumb's, which beside the tree's
    shares and the tables' numbers reads as a stray mark."""

    VERTICAL_BARS: ClassVar[list[str]] = [" "] * 8
    HORIZONTAL_BARS: ClassVar[list[str]] = [" "] * 8


class HookdbgApp(App[None]):
    CSS_PATH = ["hookdbg.tcss", "views.tcss"]
    TITLE = "hookdbg"
    ENABLE_COMMAND_PALETTE = True
    COMMANDS = App.COMMANDS | {ModuleFinder}

    def __init__(
        self,
        recording: Recording | None,
        other: Recording | None = None,
        follow: bool = False,
        more_ranks: list[Recording] | None = None,
        wait_for: Path | None = None,
    ) -> None:
        """Replay ``recording`` (with ``more_ranks``, a distributed run), compare it with
        ``other``, or, with no recording, wait for ``wait_for`` to appear and follow it."""
        super().__init__()
        ScrollBar.renderer = WholeCellThumb  # Textual's one setting for every scrollbar
        self.follow = follow
        self.wait_for = wait_for
        self.other_view = RunView(other) if other is not None else None
        self.ranks: list[RunView] = []
        if recording is not None:
            self.ranks = [RunView(recording), *(RunView(r) for r in more_ranks or [])]

    def action_command_palette(self) -> None:
        if self.use_command_palette and not isinstance(self.screen, CommandPalette):
            self.push_screen(Palette(id="--command-palette"))

    def search_themes(self) -> None:
        """The palette's "Theme" command: the same palette, over the themes."""
        self.push_screen(Palette(providers=[ThemeProvider], placeholder="Search for themes…"))

    @property
    def view(self) -> RunView:
        return self.ranks[0]

    def get_default_screen(self) -> Screen:
        if not self.ranks:
            assert self.wait_for is not None, "a recording, or a path to wait for"
            return WaitScreen(self.wait_for)
        return ReplayScreen(self.ranks[0], self.other_view, self.follow, self.ranks)

    def on_opened(self, message: Opened) -> None:
        """The recording waited for is there: follow it."""
        opened = message.recording
        recordings = [opened[r] for r in opened.ranks] if isinstance(opened, RankSet) else [opened]
        self.ranks = [RunView(r) for r in recordings]
        self.push_screen(ReplayScreen(self.ranks[0], self.other_view, True, self.ranks))

    @property
    def replay(self) -> ReplayScreen | None:
        """The replay screen, under any screen open over it (None while waiting)."""
        return next((s for s in self.screen_stack if isinstance(s, ReplayScreen)), None)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        replay = self.replay
        if replay is None:
            return
        yield SystemCommand("Profile", "module times for this step", replay.action_profile)
        yield SystemCommand("Alerts", "every NaN/inf origin", replay.action_alerts)
        yield SystemCommand("Search", "find tensors and calls", replay.action_search)
        yield SystemCommand("Go to step", "by number", replay.action_goto)
        yield SystemCommand("First alert or divergence", "jump to it", replay.action_first)
        yield SystemCommand(
            "Follow on/off", "show steps as they are written", replay.action_toggle_follow
        )
        for i, stat in enumerate(PLOT_STATS):
            yield SystemCommand(
                f"Plot: {stat.label}", "over all steps", lambda i=i: replay.plot_stat(i)
            )
