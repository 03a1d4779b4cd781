"""Helpers for driving the TUI as a user would and reading what is on screen."""

from __future__ import annotations

import contextlib
import io
import time
import unicodedata
from collections.abc import Callable, Iterable

from rich.console import Console, Group
from rich.segment import Segment
from rich.table import Table
from textual import events
from textual.app import App, _character_to_key
from textual.keys import REPLACED_KEYS, _get_unicode_name_from_key
from textual.pilot import Pilot
from textual.scrollbar import ScrollBar
from textual.widget import Widget
from textual.widgets import DataTable, Static
from textual.worker import WorkerCancelled

SIZE = (160, 48)
SMALL = (80, 24)
# the sizes every defect of the screen is checked at: a small terminal, an everyday
# one, a large one
SIZES = ((80, 24), (100, 30), (220, 60))


async def settle(app: App, pilot: Pilot) -> None:
    """Let workers finish and the screen catch up. A worker that a newer one of its
    group cancelled (the user moved on) is done too: on a busy machine that happens
    while we wait, and is no failure."""
    for _ in range(3):
        await pilot.pause(0.05)
        with contextlib.suppress(WorkerCancelled):
            await app.workers.wait_for_complete()
    await pilot.pause(0.05)


async def until(
    app: App,
    pilot: Pilot,
    condition: Callable[[], bool],
    timeout: float = 30.0,
    workers: bool = True,
) -> bool:
    """Wait (letting the app run) until ``condition()`` holds; a busy machine is slow.
    ``workers=False`` where a worker runs until the app ends (waiting for a file)."""
    deadline = time.time() + timeout
    while not condition() and time.time() < deadline:
        if workers:
            await settle(app, pilot)
        await pilot.pause(0.2)
    return condition()


def burst(app: App, keys: Iterable[str]) -> None:
    """Send keys all at once, as a terminal delivers a fast typist's or a held key's:
    each arrives before the app has handled the one before (``Pilot.press`` waits for
    the app to be idle after each key, which a user never does)."""
    driver = app._driver
    assert driver is not None
    for key in keys:
        if len(key) == 1 and not key.isalnum():
            key = _character_to_key(key)
        try:
            char: str | None = unicodedata.lookup(
                _get_unicode_name_from_key(REPLACED_KEYS.get(key, key))
            )
        except KeyError:
            char = key if len(key) == 1 else None
        event = events.Key(key, char)
        event.set_sender(app)
        driver.send_message(event)


def crashed(app: App) -> BaseException | None:
    """What ended the app on an error, if anything did (Textual holds it until the
    test's ``run_test`` block ends)."""
    return app._exception


def text(widget: Widget) -> str:
    """What a widget shows, as plain text (a Rich table, or a group of renderables, drawn
    as a terminal would)."""
    if isinstance(widget, Static):
        content = widget.content
        if isinstance(content, (Table, Group)):
            console = Console(width=widget.size.width or 200, file=io.StringIO(), record=True)
            console.print(content)
            return console.export_text()
        return str(content)
    return str(widget.render())


def rows(table: DataTable) -> list[list[str]]:
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def columns(table: DataTable) -> list[str]:
    return [str(c.label) for c in table.ordered_columns]


def records(table: DataTable) -> list[dict[str, str]]:
    """Each row as {column label: cell text}."""
    labels = columns(table)
    return [dict(zip(labels, row, strict=True)) for row in rows(table)]


def notices(app: App) -> list[str]:
    return [n.message for n in app._notifications]


def scrollbar_cells(app: App, widget: Widget) -> list[Segment]:
    """The cells the widget's scrollbars on screen are drawn with, one segment a cell,
    as the terminal gets them."""
    strips = app.screen._compositor.render_strips()
    cells = []
    for bar, geometry in app.screen._compositor.full_map.items():
        if not isinstance(bar, ScrollBar) or bar.parent is not widget:
            continue
        region = geometry.region.intersection(geometry.clip)
        for y in range(region.y, region.bottom):
            for segment in strips[y].crop(region.x, region.right):
                cells.extend(Segment(c, segment.style) for c in segment.text)
    return cells
