"""The plot pane: one statistic of the selected module over all steps.

Drawn here rather than with Textual's Sparkline, which cannot show what a NaN hunt
needs: steps whose value is NaN/inf (marked ×, not drawn as the minimum), the value
range on an axis, where the current step is, and the same scale for two runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

from hookdbg.cells import stat_text
from hookdbg.text import plural, printable

from .messages import Goto
from .model import PlotStat

BLOCKS = " ▁▂▃▄▅▆▇█"
Series = tuple[np.ndarray, np.ndarray]  # (steps, values)


@dataclass(frozen=True)
class Bucket:
    """The steps one column of the plot stands for."""

    steps: np.ndarray
    top: float | None  # the largest finite value, None if there is none
    bad: bool  # some value is NaN/inf


def buckets(series: Series, columns: int) -> list[Bucket]:
    """Split a series into at most ``columns`` runs of consecutive steps."""
    steps, values = series
    per = max(1, math.ceil(len(steps) / max(columns, 1)))
    out = []
    for start in range(0, len(steps), per):
        chunk = values[start : start + per]
        finite = chunk[np.isfinite(chunk)]
        out.append(
            Bucket(
                steps[start : start + per],
                float(finite.max()) if finite.size else None,
                finite.size < chunk.size,
            )
        )
    return out


def value_range(*series: Series | None) -> tuple[float, float] | None:
    """(lowest, highest) finite value of one or more series: a shared scale."""
    finite = [v[np.isfinite(v)] for s in series if s is not None for v in (s[1],)]
    finite = [f for f in finite if f.size]
    if not finite:
        return None
    lo, hi = float(min(f.min() for f in finite)), float(max(f.max() for f in finite))
    if hi - lo <= 1e-6 * max(abs(lo), abs(hi)):
        return lo, lo  # flat: float32 rounding noise must not look like a curve
    return lo, hi


class Plot(Widget):
    """Bars of one series, with the value axis on the left and the step axis below;
    a click goes to the step under it."""

    COMPONENT_CLASSES = {"plot--bar", "plot--here", "plot--bad", "plot--axis"}

    current: reactive[int | None] = reactive(None)

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._series: Series | None = None
        self._range: tuple[float, float] | None = None
        self._axis = 0  # cells left of the bars
        self._buckets: list[Bucket] = []
        self._cells = 1  # cells per bucket: a short run gets wider bars
        self._here: int | None = None  # the bucket of the current step

    def show(self, series: Series | None, scale: tuple[float, float] | None) -> None:
        self._series, self._range = series, scale
        self.refresh()

    def _style(self, name: str) -> str:
        return str(self.get_component_rich_style(f"plot--{name}", partial=True))

    def render(self) -> Text:
        series = self._series
        if series is None or not len(series[0]):
            self._buckets = []
            return Text("")
        lo, hi = self._range or (0.0, 0.0)
        labels = (stat_text(hi), stat_text(lo) if hi > lo else "")
        self._axis = max(map(len, labels)) + 1
        rows = max(1, self.size.height - 1)
        room = self.size.width - self._axis
        self._buckets = buckets(series, room)
        self._cells = max(1, min(4, room // max(len(self._buckets), 1)))
        self._here = next(
            (i for i, b in enumerate(self._buckets) if self.current in b.steps.tolist()), None
        )
        lines = []
        for row in range(rows):
            label = labels[0] if row == 0 else labels[1] if row == rows - 1 else ""
            line = Text(label.rjust(self._axis - 1) + ("┤" if label else "│"), self._style("axis"))
            for i, bucket in enumerate(self._buckets):
                char, style = self._cell(bucket, row, rows, lo, hi, i == self._here)
                line.append(char * self._cells, style)
            lines.append(line)
        lines.append(self._step_axis())
        return Text("\n").join(lines)

    def _cell(
        self, bucket: Bucket, row: int, rows: int, lo: float, hi: float, here: bool
    ) -> tuple[str, str]:
        if bucket.bad and row == 0:
            return "×", self._style("bad")
        if bucket.top is None:
            return " ", ""
        level = (bucket.top - lo) / (hi - lo) if hi > lo else 0.5
        eighths = max(1, round(level * rows * 8)) - 8 * (rows - 1 - row)
        return BLOCKS[min(8, max(0, eighths))], self._style("here" if here else "bar")

    def _step_axis(self) -> Text:
        """The first and last step at the ends, ▲ under the current step; a label the ▲
        would cover is left out rather than cut (the title says the current step)."""
        width = len(self._buckets) * self._cells
        here = range(0)
        if self._here is not None:
            here = range(self._here * self._cells, (self._here + 1) * self._cells)
        first, last = str(int(self._buckets[0].steps[0])), str(int(self._buckets[-1].steps[-1]))
        cells = [" "] * width
        if len(first) + len(last) + 1 < width:
            for span, label in (
                (range(len(first)), first),
                (range(width - len(last), width), last),
            ):
                if not set(span) & set(here):
                    cells[span.start : span.stop] = label
        line = Text(" " * self._axis, self._style("axis"))
        for i, c in enumerate(cells):
            if i in here:
                line.append("▲", self._style("here"))
            else:
                line.append(c, self._style("axis"))
        return line

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        column = (offset.x - self._axis) // self._cells
        if offset.x >= self._axis and column < len(self._buckets):
            self.post_message(Goto(step=int(self._buckets[column].steps[0])))


class PlotPane(Vertical, can_focus=True):
    """The loss, or one statistic of the selected module, over all steps (``s`` picks
    another); when comparing two runs, both on one scale. Tab comes here, for ``z``
    to zoom it."""

    COMPONENT_CLASSES = {"plot-pane--here", "plot-pane--bad"}

    current: reactive[int | None] = reactive(None)

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._shown: tuple[PlotStat, str, Series, Series | None, str] | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="plot-title")
        yield Plot(id="plot-a")
        yield Plot(id="plot-b", classes="hidden")

    def show(
        self, stat: PlotStat, module: str, series: Series, other: Series | None, tensor: str = ""
    ) -> None:
        """Plot ``series`` (and ``other``, the second run's); ``tensor`` says which of
        the module's tensors it is of, where it returned several ("output[logits]")."""
        self._shown = (stat, module, series, other, tensor)
        scale = value_range(series, other)
        self.query_one("#plot-a", Plot).show(series, scale)
        second = self.query_one("#plot-b", Plot)
        second.set_class(other is None, "hidden")
        second.show(other, scale)
        self._title()

    def watch_current(self, step: int | None) -> None:
        for plot in self.query(Plot):
            plot.current = step
        self._title()

    def _style(self, name: str) -> str:
        return str(self.get_component_rich_style(f"plot-pane--{name}", partial=True))

    def _title(self) -> None:
        if self._shown is None:
            return
        stat, module, (steps, values), other, tensor = self._shown
        shown = "{} over the run" if stat.of_run else f"{stat.label} of {{}}"
        title = Text(shown.format(printable(module)), style="bold")
        if tensor:
            title.append(f" ({printable(tensor)})", style="bold")
        if not len(values):
            missing = "not recorded" if stat.of_run else "not recorded for this module"
            title.append(f"   {missing}", style="dim")
        else:
            title.append(f"   steps {int(steps[0])}-{int(steps[-1])}", style="dim")
            here = values[steps == self.current]
            if here.size:
                title.append(f"   step {self.current}: {stat_text(here[0])}", self._style("here"))
            bad = steps[~np.isfinite(values)]
            if bad.size:
                title.append(
                    f"   × NaN/inf at {plural(bad.size, 'step')} (first {int(bad[0])})",
                    self._style("bad"),
                )
        if other is not None:
            title.append("\nupper: a, lower: b, on one scale", style="dim")
        self.query_one("#plot-title", Static).update(title)
