"""The detail pane: every tensor summary of the selected module in the current step.

Built for NaN hunting on any terminal: the NaN/inf count stands next to the slot, rows
holding non-finite values are tinted, a NaN statistic reads ``nan``, and on a narrow
screen the columns that matter least are left out first (the title says which);
shift+←/→ move across the columns that are there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.events import Resize
from textual.widgets import DataTable, Static

from hookdbg.analysis.histograms import has_histogram, sparkline
from hookdbg.cells import FRACTIONS, STATS, label, stat_text, tensor_text
from hookdbg.store.schema import HISTOGRAM, Phase
from hookdbg.text import plural, printable, utf8

from .model import Detail


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    keep: int  # a narrow pane leaves out the columns of lowest ``keep`` first
    right: bool = True


COLUMNS = (
    Column("run", "run", 90, right=False),
    Column("phase", "phase", 60, right=False),
    Column("slot", "slot", 100, right=False),
    Column("nonfinite", "nan/inf", 95),
    Column("min", "min", 68),
    Column("max", "max", 70),
    Column("mean", "mean", 80),
    Column("std", "std", 78),
    Column("norm", "norm", 50),
    Column("histogram", "histogram", 55, right=False),  # --histograms recordings only
    # the fractions (zeros, ...), those declared later first to go on a narrow pane
    *(Column(name, label(name), 30 - i) for i, name in enumerate(FRACTIONS)),
    Column("shape", "shape", 40, right=False),
    Column("dtype", "dtype", 20, right=False),
    Column("placement", "global", 85, right=False),  # the global view's rows only
)


@dataclass
class Row:
    """One tensor summary as text: what is shown, and what ``y`` copies."""

    cells: dict[str, str]
    copy: dict[str, str] = field(default_factory=dict)
    nonfinite: int = 0
    bad: set[str] = field(default_factory=set)  # statistics that are NaN/inf
    divergent: bool = False


def summary_rows(
    run: str, detail: Detail, divergent: set[tuple[int, int, str]] | None
) -> list[Row]:
    out = []
    for r in detail.rows:
        text = tensor_text(r)
        row = Row(
            {
                "run": run,
                "phase": text.phase,
                "slot": text.slot,
                "nonfinite": text.count,
                "shape": text.shape,
                "dtype": text.dtype,
                **text.fractions,
                "histogram": histogram_cell(r),
                "placement": placement_cell(r),
            },
            nonfinite=text.nonfinite,
            divergent=(int(r["phase"]), int(r["slot"]), text.path) in (divergent or ()),
        )
        for stat in STATS:
            row.cells[stat] = text.stat(stat)
            row.copy[stat] = repr(text.values[stat]) if row.cells[stat] != "-" else "-"
            if row.cells[stat] in ("nan", "inf", "-inf"):
                row.bad.add(stat)
        out.append(row)
    return out


def placement_cell(row: np.void) -> str:
    """In the global view: how a DTensor's row was made ('S(0) from ranks 0,1', or
    this rank's own shard where its global values cannot be had); '' for the others."""
    names = row.dtype.names or ()
    if "placement" not in names or not row["placement"]:
        return ""
    placement = printable(utf8(row["placement"]))
    ranks = utf8(row["ranks"])
    if ranks:
        return f"{placement} from ranks {ranks}"
    if "P" in placement:
        return f"{placement}: a partial sum, this rank's"
    return f"{placement}: this rank's"


def histogram_cell(row: np.void) -> str:
    """A sparkline of the row's value histogram, min to max ('' without one)."""
    return sparkline(row[HISTOGRAM], 12) if has_histogram(row) else ""


def fit(columns: list[Column], widths: dict[str, int], room: int) -> list[Column]:
    """The columns that fit in ``room`` cells, leaving out those of lowest ``keep`` first
    (always keeping three)."""
    shown = list(columns)
    for column in sorted(columns, key=lambda c: c.keep):
        if sum(widths[c.key] + 2 for c in shown) <= room or len(shown) <= 3:
            break
        shown.remove(column)
    return shown


class DetailTable(DataTable[Text]):
    """←/→ belong to steps; shift+←/→ move across columns."""

    BINDINGS = [
        Binding("shift+left", "cursor_left", "column ←", show=False),
        Binding("shift+right", "cursor_right", "column →", show=False),
    ]


class DetailPane(Vertical):
    """The selected module in the current step: timings, tensor summaries (both runs
    when comparing), and a histogram of a stored full tensor when there is one."""

    COMPONENT_CLASSES = {"detail-pane--nonfinite", "detail-pane--bad", "detail-pane--divergent"}

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._rows: list[Row] = []
        self._title = Text()
        self._shown: list[Column] = []

    def compose(self) -> ComposeResult:
        yield Static(id="detail-title")
        yield DetailTable(id="detail-table", zebra_stripes=True, cursor_type="cell")
        yield Static(id="histogram", classes="hidden")

    def show(
        self,
        detail: Detail,
        other: Detail | None = None,
        divergent: set[tuple[int, int, str]] | None = None,
    ) -> None:
        self._title = _title(detail)
        self._rows = summary_rows("a" if other else "", detail, divergent)
        if other is not None:
            self._rows += summary_rows("b", other, divergent)
        self._fill()
        self._histogram(detail)

    def on_resize(self, event: Resize) -> None:
        if self._rows:
            self._fill()

    def _style(self, name: str) -> str:
        # the tint is a translucent background: it needs the full style to be blended
        partial = name != "nonfinite"
        return str(self.get_component_rich_style(f"detail-pane--{name}", partial=partial))

    def _fill(self) -> None:
        table = self.query_one(DetailTable)
        two = any(r.cells["run"] for r in self._rows)
        columns = [c for c in COLUMNS if c.key != "run" or two]
        for optional in ("histogram", "placement"):
            if not any(r.cells[optional] for r in self._rows):
                columns = [c for c in columns if c.key != optional]
        widths = {
            c.key: max(len(c.label), *(len(r.cells[c.key]) for r in self._rows))
            if self._rows
            else len(c.label)
            for c in columns
        }
        room = table.scrollable_content_region.width or self.size.width
        self._shown = fit(columns, widths, room) if room else columns
        hidden = len(columns) - len(self._shown)
        self.border_subtitle = f"+{hidden} columns in a wider window" if hidden else ""
        self.query_one("#detail-title", Static).update(self._title)
        cursor = table.cursor_coordinate
        table.clear(columns=True)
        for c in self._shown:
            table.add_column(c.label, width=widths[c.key], key=c.key)
        for row in self._rows:
            tint = self._style("nonfinite") if row.nonfinite > 0 else ""
            cells = []
            for c in self._shown:
                style = tint
                if c.key in row.bad or (c.key == "nonfinite" and row.nonfinite > 0):
                    style = f"{tint} {self._style('bad')}"
                elif c.key == "slot" and row.divergent:
                    style = f"{tint} {self._style('divergent')}"
                text = Text(row.cells[c.key], style=style.strip())
                if c.right:
                    text.justify = "right"
                cells.append(text)
            table.add_row(*cells)
        if self._rows:
            table.move_cursor(
                row=min(cursor.row, len(self._rows) - 1),
                column=min(cursor.column, len(self._shown) - 1),
                scroll=False,
            )

    def selected_value(self) -> str | None:
        """The text of the cell under the cursor (a statistic at full precision)."""
        table = self.query_one(DetailTable)
        if not self._rows or not self._shown:
            return None
        coordinate = table.cursor_coordinate
        row = self._rows[min(coordinate.row, len(self._rows) - 1)]
        key = self._shown[min(coordinate.column, len(self._shown) - 1)].key
        return row.copy.get(key, row.cells[key])

    def _histogram(self, detail: Detail) -> None:
        box = self.query_one("#histogram", Static)
        box.set_class(not detail.captures, "hidden")
        if not detail.captures:
            return
        if detail.histogram is None:
            box.update(Text("stored tensors have no finite values", style="dim"))
            return
        counts, low, high = detail.histogram
        peak = max(counts) or 1.0
        bars = "".join(" ▁▂▃▄▅▆▇█"[min(8, math.ceil(8 * c / peak))] for c in counts)
        box.update(
            Text.assemble(
                ("values ", "dim"),
                (f"{stat_text(low)} ", ""),
                (bars, "green"),
                (f" {stat_text(high)}", ""),
                (f"  ({detail.captures[0].source})", "dim"),
            )
        )


def _title(detail: Detail) -> Text:
    module = detail.module
    fwd = detail.timings[detail.timings["phase"] == Phase.FWD]
    bwd = detail.timings[detail.timings["phase"] == Phase.BWD]
    title = Text(printable(module.name), style="bold")
    title.append(f"  {printable(module.type)}  {detail.label}", style="dim")
    if detail.merged:
        merged = int((detail.rows["ranks"] != b"").sum())
        title.append(
            f"  global: {plural(merged, 'row')} merged from the ranks' shards",
            style="cyan",
        )
    if len(fwd):
        title.append(
            f"\nforward {fwd['total'].sum() * 1e3:.3f} ms total, "
            f"{fwd['self'].sum() * 1e3:.3f} ms self"
        )
    if len(bwd):
        title.append(
            f"   backward {bwd['total'].sum() * 1e3:.3f} ms total, "
            f"{bwd['self'].sum() * 1e3:.3f} ms self"
        )
    if len(fwd) > 1:
        title.append(f"   {len(fwd)} calls")
    return title
