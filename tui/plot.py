"""The plot pane: one statistic of the selected module over all steps.

Drawn here rather than with Textual's Sparkline, which cannot show what a NaN hunt
needs: steps at which the tensor holds NaN/inf (``×`` over the bar, as the tensor
table's nan/inf column says them), the value range on an axis, where the current step
is, and two runs in one plot on one scale. The bars fill the pane: a short run gets
wide bars. Comparing two runs, each step's bar of run a stands beside run b's, in two
colours, in one plot: one height for one value, whatever the pane's size.
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

from hookdbg.cells import num, stat_text
from hookdbg.text import plural, printable

from .messages import Goto
from .model import Curve, PlotStat

BLOCKS = " ▁▂▃▄▅▆▇█"
Series = tuple[np.ndarray, np.ndarray]  # (steps, values)
RUNS = ("a", "b")  # the component classes of each run's bars: plot--a, plot--b


@dataclass(frozen=True)
class Bucket:
    """The steps one column of the plot stands for, and each curve's part of it."""

    steps: np.ndarray
    tops: tuple[float | None, ...]  # per curve: its largest finite value, None if none
    bad: tuple[bool, ...]  # per curve: NaN/inf at one of its steps

    @property
    def top(self) -> float | None:
        return self.tops[0]


def curve_of(series: Series) -> Curve:
    """A series with its NaN/inf values as its bad steps (the stacked sparklines)."""
    steps, values = series
    return Curve(steps, values, ~np.isfinite(values))


def buckets(curves: list[Curve], columns: int) -> list[Bucket]:
    """The steps of all curves, split into at most ``columns`` runs of consecutive
    steps; each curve's largest finite value and NaN/inf in each."""
    steps = np.unique(np.concatenate([c.steps for c in curves])) if curves else np.zeros(0)
    per = max(1, math.ceil(len(steps) / max(columns, 1)))
    out = []
    for start in range(0, len(steps), per):
        chunk = steps[start : start + per]
        tops, bad = [], []
        for c in curves:
            mine = np.isin(c.steps, chunk)
            values = c.values[mine]
            finite = values[np.isfinite(values)]
            tops.append(float(finite.max()) if finite.size else None)
            bad.append(bool(c.bad[mine].any()))
        out.append(Bucket(chunk, tuple(tops), tuple(bad)))
    return out


def value_range(*series: Series | Curve | None) -> tuple[float, float] | None:
    """(lowest, highest) finite value of one or more series: a shared scale."""
    values = [s.values if isinstance(s, Curve) else s[1] for s in series if s is not None]
    finite = [f for v in values if (f := v[np.isfinite(v)]).size]
    if not finite:
        return None
    lo, hi = float(min(f.min() for f in finite)), float(max(f.max() for f in finite))
    if hi - lo <= 1e-6 * max(abs(lo), abs(hi)):
        return lo, lo  # flat: float32 rounding noise must not look like a curve
    return lo, hi


def range_labels(lo: float, hi: float) -> tuple[str, str]:
    """The lowest and the highest value as text, with the digits that tell them apart
    (``1022.6`` and ``1023.4``, not ``1023`` twice over bars that differ)."""
    low, high = stat_text(lo), stat_text(hi)
    for digits in range(5, 18):
        if low != high or lo == hi:
            break
        low, high = num(lo, digits), num(hi, digits)
    return low, high


def spans(width: int, count: int) -> list[range]:
    """The cells of ``count`` columns filling ``width``: widths differ by one at most."""
    edges = [round(i * width / count) for i in range(count + 1)] if count else [0]
    return [range(edges[i], edges[i + 1]) for i in range(count)]


class Plot(Widget):
    """Bars of one or two curves (run a and run b, side by side at each step), with
    the value axis on the left and the step axis below; a click goes to the step
    under it."""

    COMPONENT_CLASSES = {"plot--a", "plot--b", "plot--here", "plot--bad", "plot--axis"}

    current: reactive[int | None] = reactive(None)

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._curves: list[Curve] = []
        self._range: tuple[float, float] | None = None
        self._axis = 0  # cells left of the bars
        self._buckets: list[Bucket] = []
        self._spans: list[range] = []  # each bucket's cells, from the axis
        self._here: int | None = None  # the bucket of the current step

    def show(self, curves: list[Curve], scale: tuple[float, float] | None) -> None:
        self._curves, self._range = curves, scale
        self.refresh()

    def _style(self, name: str) -> str:
        return str(self.get_component_rich_style(f"plot--{name}", partial=True))

    def column_of(self, step: int) -> range | None:
        """The cells (from the widget's left) of the column holding ``step``."""
        for bucket, span in zip(self._buckets, self._spans, strict=True):
            if step in bucket.steps.tolist():
                return range(self._axis + span.start, self._axis + span.stop)
        return None

    def render(self) -> Text:
        curves = [c for c in self._curves if len(c.steps)]
        if not curves:
            self._buckets, self._spans = [], []
            return Text("")
        lo, hi = self._range or (0.0, 0.0)
        rows = max(1, self.size.height - 1)
        low, high = range_labels(lo, hi)
        labels = (high, low if hi > lo else "")
        if rows == 1 and labels[1]:  # one row: the range on it
            labels = (f"{labels[1]}..{labels[0]}", "")
        self._axis = max(map(len, labels)) + 1
        room = max(self.size.width - self._axis, len(self._curves))
        self._buckets = buckets(curves, room // len(self._curves))
        self._spans = spans(room, len(self._buckets))
        self._here = next(
            (i for i, b in enumerate(self._buckets) if self.current in b.steps.tolist()), None
        )
        lines = []
        for row in range(rows):
            label = labels[0] if row == 0 else labels[1] if row == rows - 1 else ""
            line = Text(label.rjust(self._axis - 1) + ("┤" if label else "│"), self._style("axis"))
            for i, (bucket, span) in enumerate(zip(self._buckets, self._spans, strict=True)):
                here = i == self._here
                line.append_text(self._column(bucket, len(span), row, rows, lo, hi, here))
            lines.append(line)
        lines.append(self._step_axis())
        return Text("\n").join(lines)

    def _column(
        self, bucket: Bucket, width: int, row: int, rows: int, lo: float, hi: float, here: bool
    ) -> Text:
        """One row of a bucket's cells: each curve's share of them (a's then b's), and a
        blank cell between buckets where the bars are wide enough to spare it."""
        count = len(bucket.tops)
        gap = 1 if width >= 3 * count else 0
        widths = [len(s) for s in spans(width - gap, count)]
        out = Text()
        for k, (top, bad, cells) in enumerate(zip(bucket.tops, bucket.bad, widths, strict=True)):
            if bad and row == 0:
                out.append("×" * cells, self._style("bad"))
                continue
            if top is None:
                out.append(" " * cells)
                continue
            level = (top - lo) / (hi - lo) if hi > lo else 0.5
            eighths = max(1, round(level * rows * 8)) - 8 * (rows - 1 - row)
            # the current step's colour where one run is drawn; in a diff each run keeps
            # its own (the ▲ under the axis says which step is the current one)
            style = self._style("here" if here and count == 1 else RUNS[k])
            out.append(BLOCKS[min(8, max(0, eighths))] * cells, style)
        out.append(" " * gap)
        return out

    def _step_axis(self) -> Text:
        """The first and last step at the ends, ▲ under the current step; a label the ▲
        would cover is left out rather than cut (the title says the current step)."""
        width = self._spans[-1].stop if self._spans else 0
        here = self._spans[self._here] if self._here is not None else range(0)
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
        x = offset.x - self._axis
        for bucket, span in zip(self._buckets, self._spans, strict=True):
            if x in span:
                self.post_message(Goto(step=int(bucket.steps[0])))


class PlotPane(Vertical, can_focus=True):
    """The loss, or one statistic of the selected module, over all steps (``s`` picks
    another); when comparing two runs, both in one plot on one scale. Tab comes here,
    for ``z`` to zoom it."""

    COMPONENT_CLASSES = {"plot-pane--here", "plot-pane--bad", "plot-pane--a", "plot-pane--b"}

    current: reactive[int | None] = reactive(None)

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._shown: tuple[PlotStat, str, Curve, Curve | None, str] | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="plot-title")
        yield Plot(id="plot-a")

    def show(
        self, stat: PlotStat, module: str, curve: Curve, other: Curve | None, tensor: str = ""
    ) -> None:
        """Plot ``curve`` (and ``other``, the second run's, beside it); ``tensor`` says
        which of the module's tensors it is of, where it returned several."""
        self._shown = (stat, module, curve, other, tensor)
        curves = [curve] if other is None else [curve, other]
        self.query_one(Plot).show(curves, value_range(*curves))
        self._title()

    def watch_current(self, step: int | None) -> None:
        self.query_one(Plot).current = step
        self._title()

    def _style(self, name: str) -> str:
        return str(self.get_component_rich_style(f"plot-pane--{name}", partial=True))

    def _title(self) -> None:
        if self._shown is None:
            return
        stat, module, curve, other, tensor = self._shown
        shown = "{}" if stat.of_run else f"{stat.label} of {{}}"
        head = Text(shown.format(printable(module)), style="bold")
        if tensor:
            head.append(f" ({printable(tensor)})", style="bold")
        parts = [head]
        runs = [("", curve)] if other is None else [("a: ", curve), ("b: ", other)]
        self.border_title = self._legend() if other is not None else None
        if not any(len(c.steps) for _, c in runs):
            missing = "not recorded" if stat.of_run else "not recorded for this module"
            parts.append(Text(missing, style="dim"))
        else:
            steps = np.concatenate([c.steps for _, c in runs])
            parts.append(Text(f"steps {int(steps.min())}-{int(steps.max())}", style="dim"))
            here = [(name, c.values[c.steps == self.current]) for name, c in runs]
            if any(v.size for _, v in here):
                said = ", ".join(f"{n}{stat_text(v[0]) if v.size else '-'}" for n, v in here)
                parts.append(Text(f"step {self.current}: {said}", self._style("here")))
            bad = [
                f"{name}{plural(c.bad_steps.size, 'step')} (first {int(c.bad_steps[0])})"
                for name, c in runs
                if c.bad_steps.size
            ]
            if bad:
                said = ("× NaN/inf at " if other is None else "× NaN/inf ") + ", ".join(bad)
                parts.append(Text(said, self._style("bad")))
        width = self.query_one("#plot-title", Static).size.width or self.size.width
        self.query_one("#plot-title", Static).update(packed(parts, width))

    def _legend(self) -> Text:
        """The border's title comparing two runs: which colour is which run."""
        legend = Text(" a ")
        legend.append("██", self._style("a"))
        legend.append("  b ")
        legend.append("██", self._style("b"))
        legend.append(" side by side, one scale ", style="dim")
        return legend

    def on_resize(self) -> None:
        self._title()


def packed(parts: list[Text], width: int, gap: str = "   ") -> Text:
    """``parts`` on as few lines of ``width`` as they fit on, a line broken only
    between parts: a value never stands apart from what it is of."""
    lines: list[Text] = []
    for part in parts:
        if lines and width and lines[-1].cell_len + len(gap) + part.cell_len <= width:
            lines[-1].append(gap)
            lines[-1].append_text(part)
        else:
            lines.append(part.copy())
    return Text("\n").join(lines)
