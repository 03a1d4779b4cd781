"""``hookdbg tui``: the Textual app. It holds the open recordings and the command
palette; the replay screen does the work (tui/replay.py)."""

from __future__ import annotations

from collections.abc import Iterable

from textual.app import App, SystemCommand
from textual.screen import Screen

from hookdbg.analysis.query import Query
from hookdbg.read import Recording
from hookdbg.tui.model import PLOT_STATS, RunView
from hookdbg.tui.replay import ReplayScreen
from hookdbg.tui.screens import SearchScreen


class HookdbgApp(App[None]):
    CSS_PATH = "hookdbg.tcss"
    TITLE = "hookdbg"
    ENABLE_COMMAND_PALETTE = True

    def __init__(
        self,
        recording: Recording,
        other: Recording | None = None,
        follow: bool = False,
        more_ranks: list[Recording] | None = None,
    ) -> None:
        super().__init__()
        self.view = RunView(recording)  # not self.run: that is App.run()
        self.other_view = RunView(other) if other is not None else None
        self.follow = follow
        self.ranks = [self.view, *(RunView(r) for r in more_ranks or [])]

    def get_default_screen(self) -> Screen:
        return ReplayScreen(self.view, self.other_view, self.follow, self.ranks)

    @property
    def replay(self) -> ReplayScreen:
        screen = self.screen_stack[0]
        assert isinstance(screen, ReplayScreen)
        return screen

    def search_from(self, query: Query, screen: SearchScreen) -> None:
        self.replay.run_search(query, screen)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        replay = self.replay
        yield SystemCommand("Profile", "module times for this step", replay.action_profile)
        yield SystemCommand("Alerts", "every NaN/inf origin", replay.action_alerts)
        yield SystemCommand("Search", "find tensors and calls", replay.action_search)
        yield SystemCommand("First alert or divergence", "jump to it", replay.action_first)
        yield SystemCommand(
            "Follow on/off", "show steps as they are written", replay.action_toggle_follow
        )
        for i, stat in enumerate(PLOT_STATS):
            yield SystemCommand(f"Plot: {stat.label}", "over all steps", lambda i=i: replay.plot(i))
