"""The selected module's statistics over steps, stacked (``m``): one sparkline a line.

The plot shows one statistic large; this shows several at once, each on its own scale,
so a drift of the mean and a blow-up of the norm can be told apart at a glance, as
htop's meters do. Each line says the current step's value and the range, and leaves
the range out before it would cut a number.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.text import Text
from textual import work
from textual.reactive import reactive
from textual.widget import Widget

from hookdbg.cells import stat_text
from hookdbg.store.schema import Slot, slot_label
from hookdbg.text import printable

from .model import Curve, PlotStat, RunView
from .plot import BLOCKS, buckets, range_labels, value_range

STACKED = (
    PlotStat("min", Slot.OUTPUT, "min"),
    PlotStat("max", Slot.OUTPUT, "max"),
    PlotStat("mean", Slot.OUTPUT, "mean"),
    PlotStat("std", Slot.OUTPUT, "std"),
    PlotStat("norm", Slot.OUTPUT, "norm"),
    PlotStat("grad norm", Slot.GRAD_OUTPUT, "norm"),
)
LABEL = max(len(s.label) for s in STACKED) + 1


@dataclass(frozen=True)
class Stacked:
    """What the stack shows of one module: a series per statistic of ``STACKED``."""

    key: tuple[int, int, bool]  # (id of the run view, module, evals)
    module: str
    tensor: str  # "output", or "output[logits]" for a module returning several
    series: tuple[Curve, ...]


def spark(curve: Curve, width: int, current: int | None) -> list[tuple[str, bool, bool]]:
    """``width`` cells or fewer of one curve on its own scale: (block, is the current
    step, NaN/inf: × where its tensor holds any, as the plot marks them) per cell."""
    scale = value_range(curve)
    lo, hi = scale or (0.0, 0.0)
    out = []
    for bucket in buckets([curve], width):
        here = current is not None and current in bucket.steps.tolist()
        bad = bucket.bad[0]
        if bucket.top is None:
            out.append(("×" if bad else " ", here, bad))
            continue
        level = (bucket.top - lo) / (hi - lo) if hi > lo else 0.5
        out.append(("×" if bad else BLOCKS[1 + round(level * 7)], here, bad))
    return out


def value_at(curve: Curve, step: int | None) -> str:
    steps, values = curve.steps, curve.values
    here = values[steps == step] if step is not None else values[:0]
    return stat_text(float(here[0])) if here.size else "-"


class StatStack(Widget, can_focus=True):
    """Sparklines of the selected module's output statistics and gradient norm."""

    COMPONENT_CLASSES = {
        "stat-stack--label",
        "stat-stack--bar",
        "stat-stack--here",
        "stat-stack--bad",
    }

    current: reactive[int | None] = reactive(None)

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.shown: Stacked | None = None
        self._want: tuple[int, int, bool] | None = None

    def load(self, run: RunView, module: int, evals: bool) -> None:
        """Read the module's series, in a worker; a late result for another module is
        dropped."""
        self._want = (id(run), module, evals)
        self._read(run, module, evals)

    @work(thread=True, exclusive=True, group="stack")
    def _read(self, run: RunView, module: int, evals: bool) -> None:
        path = run.plotted_path(module, STACKED[0]) or ""
        series = tuple(
            run.curve(module, stat, evals, path if stat.slot == Slot.OUTPUT else None)
            for stat in STACKED
        )
        name = run.rec.modules.name(module)
        shown = Stacked((id(run), module, evals), name, slot_label(Slot.OUTPUT, path), series)
        self.app.call_from_thread(self._show, shown)

    def _show(self, shown: Stacked) -> None:
        if shown.key == self._want:
            self.shown = shown
            self.refresh()

    def _style(self, name: str) -> str:
        return str(self.get_component_rich_style(f"stat-stack--{name}", partial=True))

    def render(self) -> Text:
        shown = self.shown
        if shown is None:
            return Text("reading...", style="dim")
        width = max(self.size.width, 20)
        title = Text(f"{printable(shown.tensor)} of {printable(shown.module)}", style="bold")
        steps = [c.steps for c in shown.series if len(c.steps)]
        if steps:
            first = min(int(s[0]) for s in steps)
            last = max(int(s[-1]) for s in steps)
            title.append(f"   steps {first}-{last}", style="dim")
        if self.current is not None:
            title.append(f"   at step {self.current}", style=self._style("here"))
        lines = [title]
        nows = [value_at(s, self.current) for s in shown.series]
        ranges = [_range(s) for s in shown.series]
        now_w = max(map(cell_len, nows))
        range_w = max(map(cell_len, ranges))
        room = width - LABEL - 1 - now_w
        with_range = room - 2 - range_w >= 12
        spark_w = max(room - 2 - range_w if with_range else room, 0)
        for stat, series, now, span in zip(STACKED, shown.series, nows, ranges, strict=True):
            line = Text(stat.label.rjust(LABEL - 1) + " ", self._style("label"))
            if not len(series.steps):
                line.append("not recorded", style="dim")
                lines.append(line)
                continue
            cells = spark(series, spark_w, self.current) if spark_w else []
            per = max(1, min(4, spark_w // max(len(cells), 1)))
            for char, here, bad in cells:
                style = "bad" if bad else "here" if here else "bar"
                line.append(char * per, self._style(style))
            line.append(" " * max(spark_w - per * len(cells), 0))
            line.append(" " + now.rjust(now_w), self._style("here"))
            if with_range:
                line.append("  " + span, style="dim")
            lines.append(line)
        return Text("\n").join(lines)


def _range(series: Curve) -> str:
    scale = value_range(series)
    if scale is None:
        return ""
    lo, hi = scale
    low, high = range_labels(lo, hi)
    return low if lo == hi else f"{low}..{high}"
