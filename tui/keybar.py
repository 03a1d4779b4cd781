"""The footer: the keys that apply here, as k9s and lazygit show them.

A screen says which keys apply now (``context_keys``: ``r`` in a multi-rank run,
``R``/``F`` on a live recording, ``n``/``N`` after a search, ``G`` on sharded runs...),
most wanted first; the bar shows as many whole ones as fit and leaves out the rest,
never a key cut in half (every key is in ``?``). A screen without ``context_keys``
shows its bindings that are marked to be shown, as Textual's Footer does. A click on
a key does what it says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text
from textual import events
from textual.reactive import reactive
from textual.widget import Widget

from hookdbg.read import Status

from .model import first_origin

if TYPE_CHECKING:
    from .replay import ReplayScreen

GAP = 2  # cells between two keys


@dataclass(frozen=True)
class Key:
    shown: str  # "←→", "r", "n N"
    says: str  # "step", "rank"
    action: str  # what a click runs on the screen: "step(1)", "next_rank"


def fitted(keys: tuple[Key, ...], width: int) -> list[Key]:
    """The keys that fit in ``width`` cells, in order; one that does not fit is left
    out whole, and a shorter one after it can still take its place."""
    shown: list[Key] = []
    used = 0
    for key in keys:
        cells = len(key.shown) + 1 + len(key.says) + (GAP if shown else 1)
        if used + cells <= width:
            shown.append(key)
            used += cells
    return shown


class KeyBar(Widget):
    """The keys that apply now, whole."""

    COMPONENT_CLASSES = {"key-bar--key", "key-bar--says"}

    keys: reactive[tuple[Key, ...]] = reactive(())

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._spans: list[tuple[range, Key]] = []

    def on_mount(self) -> None:
        if not self.keys:  # a screen without context keys: its bindings, once focused
            self.call_after_refresh(self._bound)

    def _bound(self) -> None:
        if not self.keys:  # the screen has not said its own meanwhile
            self.keys = bound_keys(self.screen, self.screen.focused)

    def _style(self, name: str) -> str:
        return str(self.get_component_rich_style(f"key-bar--{name}", partial=True))

    def render(self) -> Text:
        line = Text(" ")
        self._spans = []
        for key in fitted(self.keys, self.size.width):
            if len(line) > 1:
                line.append(" " * GAP)
            start = len(line)
            line.append(key.shown, self._style("key"))
            line.append(" ")
            line.append(key.says, self._style("says"))
            self._spans.append((range(start, len(line)), key))
        return line

    async def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        for span, key in self._spans:
            if offset.x in span:
                await self.screen.run_action(key.action)


def bound_keys(screen: object, focused: object = None) -> tuple[Key, ...]:
    """A screen's bindings marked to be shown and its focused widget's, in their order
    (as Textual's Footer shows them), and the command palette's key."""
    keys = []
    for binding in [*getattr(screen, "BINDINGS", ()), *getattr(focused, "BINDINGS", ())]:
        if getattr(binding, "show", False):
            shown = binding.key_display or binding.key.split(",")[0]
            keys.append(Key(_display(shown), binding.description, binding.action))
    return (*keys, Key("^p", "palette", "app.command_palette"))


_NAMES = {"escape": "esc", "question_mark": "?", "slash": "/", "enter": "enter"}


def _display(key: str) -> str:
    return _NAMES.get(key, key)


def replay_keys(replay: ReplayScreen) -> tuple[Key, ...]:
    """The replay's keys that apply now, most wanted first (the bar shows what fits):
    stepping, help and quit; then what only this run or this moment has (ranks, search
    matches, a live run, sharded tensors, a zoomed pane); then the NaN hunt's keys."""
    rec = replay.run.rec
    ranks = replay.ranks
    keys = [Key("←→", "step", "step(1)"), Key("?", "help", "help"), Key("q", "quit", "app.quit")]
    if len(ranks) > 1:
        keys.append(Key("r", f"rank {rec.info.rank} of {len(ranks)}", "next_rank"))
    if replay.hits:
        keys.append(Key("n N", "next/prev match", "hit(1)"))
    if replay.run.status is Status.LIVE:
        keys.append(Key("F", "stop following" if replay.following else "follow", "toggle_follow"))
        keys.append(Key("R", "record steps", "record_next"))
    if len(ranks) > 1 and rec.shards:
        keys.append(Key("G", "ranks' own" if replay.merged else "global", "toggle_global"))
    if replay.maximized is not None:
        keys.append(Key("z", "unzoom", "zoom"))
    if replay.other is not None:
        keys.append(Key("f", "first divergence", "first"))
    elif first_origin(ranks) is not None:
        keys.append(Key("f", "first NaN", "first"))
    if any(len(view.rec.alerts) for view in ranks):
        keys.append(Key("a", "alerts", "alerts"))
    keys += [
        Key("/", "search", "search"),
        Key("p", "profile", "profile"),
        Key("t", "time tree", "time_tree"),
        Key("s", "plot", "next_stat(1)"),
        Key("g", "go to step", "goto"),
    ]
    if len(rec.evals):
        says = "training steps" if replay.evals else "eval batches"
        keys.append(Key("e", says, "toggle_evals"))
    if replay.maximized is None:
        keys.append(Key("z", "zoom", "zoom"))
    keys += [
        Key("m", "stats", "stack"),
        Key("o", "source", "source"),
        Key("[ ]", "10 steps", "step(10)"),
        Key("^p", "palette", "app.command_palette"),
    ]
    return tuple(keys)
