"""The detail pane: every tensor summary of the selected module in the current step.

Built for NaN hunting on any terminal: the NaN/inf count stands next to the slot, rows
holding non-finite values are tinted, a NaN statistic reads ``nan``, min and max read
``-inf``/``inf`` where the tensor holds them (the recorded ones are of its finite
values), an attention mask's ``-inf`` reads ``-inf ×N`` without alarm, and on a narrow
screen the columns that matter least are left out first (the title says which);
shift+←/→ move across the columns that are there. Comparing two runs, each tensor's
row of run a is followed by its row of run b, the cells in which they differ are
highlighted, and the columns holding them are never the ones left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.events import Resize
from textual.message import Message
from textual.strip import Strip
from textual.widgets import DataTable, Static

from hookdbg.analysis.histograms import has_histogram, sparkline
from hookdbg.analysis.stepview import call_index, mask_rows
from hookdbg.cells import FRACTIONS, LATER_STATS, STATS, label, num, stat_text, tensor_text
from hookdbg.store.schema import HISTOGRAM, Phase
from hookdbg.text import plural, printable, utf8

from .model import Detail, RowPair, pair_rows


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    keep: int  # a narrow pane leaves out the columns of lowest ``keep`` first
    right: bool = True


COLUMNS = (
    Column("run", "run", 90, right=False),
    Column("call", "call", 92),  # a module called more than once in the step only
    Column("phase", "phase", 60, right=False),
    Column("slot", "slot", 100, right=False),
    Column("nonfinite", "nan/inf", 95),
    Column("min", "min", 68),
    Column("max", "max", 70),
    Column("mean", "mean", 80),
    Column("std", "std", 78),
    Column("norm", "norm", 77),  # all a parameter's or a step gradient's row has
    # the statistics declared after these (hookdbg/store/summary.py), each its own
    # column, left out of a narrow pane before the fractions and the shape
    *(Column(name, label(name), 25 - i) for i, name in enumerate(LATER_STATS)),
    Column("histogram", "histogram", 55, right=False),  # --histograms recordings only
    # the fractions (zeros, ...), those declared later first to go on a narrow pane
    *(Column(name, label(name), 30 - i) for i, name in enumerate(FRACTIONS)),
    Column("shape", "shape", 40, right=False),
    Column("dtype", "dtype", 20, right=False),
    # the global view's rows only: where a row was merged from, left out before a number
    Column("placement", "global", 62, right=False),
)


@dataclass
class Row:
    """One tensor summary as text: what is shown, and what ``y`` copies."""

    cells: dict[str, str]
    copy: dict[str, str] = field(default_factory=dict)
    nonfinite: int = 0
    bad: set[str] = field(default_factory=set)  # statistics that are NaN/inf
    differ: frozenset[str] = frozenset()  # columns that differ from the other run's row
    values: dict[str, float] = field(default_factory=dict)  # the statistics, as numbers


# the tensors-table columns the comparison looks at, as the detail table's columns
_COMPARED = {"nan": "nonfinite", "posinf": "nonfinite", "neginf": "nonfinite"}


def summary_rows(run: str, detail: Detail) -> list[Row]:
    out = []
    masks = mask_rows(detail.rows) if len(detail.rows) else np.zeros(0, bool)
    calls = _call_numbers(detail.timings)
    for r, mask in zip(detail.rows, masks, strict=True):
        text = tensor_text(r)
        row = Row(
            {
                "run": run,
                "call": calls.get(int(r["call"]), ""),
                "phase": text.phase,
                "slot": text.slot,
                "nonfinite": text.count,
                "shape": text.shape,
                "dtype": text.dtype,
                **text.fractions,
                "histogram": histogram_cell(r),
                "placement": placement_cell(r),
            },
            nonfinite=0 if mask else text.nonfinite,
        )
        if mask:  # a mask: no alarm (tree.py says the same)
            row.cells["nonfinite"] = f"-inf ×{int(r['neginf']):,}"
        for stat in STATS:
            row.cells[stat] = text.stat(stat)
            row.values[stat] = text.values[stat]
            row.copy[stat] = repr(text.values[stat]) if row.cells[stat] != "-" else "-"
        for stat in STATS:
            if row.cells[stat] in ("nan", "inf", "-inf") and not mask:
                row.bad.add(stat)
        out.append(row)
    return out


def _call_numbers(calls: np.ndarray) -> dict[int, str]:
    """Each call's number among the module's calls in the step (its call rows'
    ``index``, as `hookdbg show` numbers them); {} for a module called once."""
    index = call_index(calls)
    return {c: str(i) for c, i in index.items()} if len(set(index.values())) > 1 else {}


def paired_rows(detail: Detail, other: Detail, pairs: list[RowPair] | None) -> list[Row]:
    """Both runs' rows, run a's then run b's of each tensor, with the cells that differ
    (``pairs`` from the comparison; without one, the rows are paired and not compared)."""
    rows_a, rows_b = summary_rows("a", detail), summary_rows("b", other)
    out = []
    for pair in pairs if pairs is not None else pair_rows(detail, other):
        differ = frozenset(_COMPARED.get(c, c) for c in pair.differ)
        for rows, i in ((rows_a, pair.a), (rows_b, pair.b)):
            if i is not None:
                rows[i].differ = differ
                out.append(rows[i])
        if pair.a is not None and pair.b is not None:
            _tell_apart(rows_a[pair.a], rows_b[pair.b])
    return out


def _tell_apart(a: Row, b: Row) -> None:
    """Give two differing statistics that read the same at 4 digits the digits that
    tell them apart (4.597 and 4.597 are 4.59694 and 4.59683)."""
    for stat in a.differ & set(STATS):
        if a.cells[stat] != b.cells[stat] or a.cells[stat] in ("-", "nan"):
            continue
        for digits in range(5, 18):
            x, y = num(a.values[stat], digits), num(b.values[stat], digits)
            if x != y:
                a.cells[stat], b.cells[stat] = x, y
                break


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


def fit(
    columns: list[Column], widths: dict[str, int], room: int, needed: frozenset[str] = frozenset()
) -> list[Column]:
    """The columns that fit in ``room`` cells, leaving out those of lowest ``keep`` first
    (always keeping three, and the ``needed`` ones: where two runs differ)."""
    shown = list(columns)
    for column in sorted(columns, key=lambda c: c.keep):
        if sum(widths[c.key] + 2 for c in shown) <= room or len(shown) <= 3:
            break
        if column.key not in needed:
            shown.remove(column)
    return shown


class DetailTable(DataTable[Text]):
    """←/→ belong to steps; shift+←/→ move across columns (the replay's bindings,
    wherever the focus is). Scrolled sideways, a column that would show in part is
    left blank: the tail of ``0.09269`` read ``9`` next to the frozen slot column."""

    @dataclass
    class Taller(Message):
        """The table's height changed (its pane's did not, or not as much)."""

        height: int

    def on_resize(self, event: Resize) -> None:
        self.post_message(self.Taller(event.size.height))

    def render_line(self, y: int) -> Strip:
        strip = super().render_line(y)
        width, x = self.size.width, int(self.scroll_x)
        edges, start = [], 0
        for column in self.ordered_columns:
            end = start + column.get_render_width(self)
            edges.append((start, end))
            start = end
        fixed = edges[self.fixed_columns - 1][1] if self.fixed_columns and edges else 0
        shown = [
            (a, b) for a, b in edges[self.fixed_columns :] if a >= x + fixed and b <= x + width
        ]
        if not x or not shown:
            return strip  # not scrolled: the table's width is one of whole columns
        left, right = shown[0][0] - x, shown[-1][1] - x
        blank = self.rich_style
        return Strip.join(
            [
                strip.crop(0, fixed),
                Strip.blank(left - fixed, blank),
                strip.crop(left, right),
                Strip.blank(width - right, blank),
            ]
        )


class DetailPane(Vertical):
    """The selected module in the current step: timings, tensor summaries (both runs
    when comparing), and a histogram of a stored full tensor when there is one."""

    ALLOW_MAXIMIZE = True  # z zooms the pane, title and all, rather than the table alone

    COMPONENT_CLASSES = {
        "detail-pane--nonfinite",
        "detail-pane--bad",
        "detail-pane--divergent",
        "detail-pane--differs",
    }

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._rows: list[Row] = []
        self._title = Text()
        self._marks: Text | None = None
        # (module, step, compared) the rows are of
        self._showing: tuple[str, str, bool] | None = None
        self._shown: list[Column] = []
        self._histogram_of: Detail | None = None
        self._tall = False  # the rows were taller than the table at the last fill

    def compose(self) -> ComposeResult:
        yield Static(id="detail-title")
        yield DetailTable(id="detail-table", zebra_stripes=True, cursor_type="cell")
        yield Static(id="histogram", classes="hidden")

    def on_mount(self) -> None:
        # the cells carry the theme's colours (the NaN tint): drawn again in a new theme
        self.watch(self.app, "theme", self._restyle, init=False)

    def _restyle(self) -> None:
        if self._rows:  # once the new theme's styles are in place
            self.call_after_refresh(self._fill)

    def show(
        self,
        detail: Detail,
        other: Detail | None = None,
        pairs: list[RowPair] | None = None,
        run: str = "",
    ) -> None:
        """Show ``detail`` (with ``other``'s rows paired with its rows); ``run``: the
        run the rows are of, where it is one of two and the other lacks the module."""
        self._title = _title(detail)
        if run:
            self._title.append(f"  only in run {run}", style="bold magenta")
        if other is None:
            self._rows = summary_rows(run, detail)
        else:
            self._rows = paired_rows(detail, other, pairs)
        self._fill()
        showing = (detail.module.name, detail.label, pairs is not None)
        if showing != self._showing:  # another module or step: to what differs in it
            self._showing = showing
            # once the title (and the marks said under it) has taken its height
            self.call_after_refresh(self._to_first_difference)
        self._histogram(detail)

    def on_resize(self, event: Resize) -> None:
        if self._rows:
            self._fill()
        if self._histogram_of is not None:
            self._histogram(self._histogram_of)

    def on_detail_table_taller(self, event: DetailTable.Taller) -> None:
        """The table grew or shrank inside the pane (a notice or the histogram line
        above or below it changed): whether its rows need a vertical scrollbar, and so
        which columns fit, may have changed with it."""
        if self._rows and (len(self._rows) + 1 > event.height) != self._tall:
            self._fill()

    def _style(self, name: str) -> str:
        return str(self.get_component_rich_style(f"detail-pane--{name}", partial=True))

    def _fill(self) -> None:
        table = self.query_one(DetailTable)
        two = any(r.cells["run"] for r in self._rows)
        columns = [c for c in COLUMNS if c.key != "run" or two]
        for optional in ("call", "histogram", "placement"):
            if not any(r.cells[optional] for r in self._rows):
                columns = [c for c in columns if c.key != optional]
        widths = {
            c.key: max(len(c.label), *(len(r.cells[c.key]) for r in self._rows))
            if self._rows
            else len(c.label)
            for c in columns
        }
        # the room is the pane's (the table itself may be narrowed), less a column for
        # the vertical scrollbar where the rows and header are taller than the table,
        # or than the table less a row for the horizontal one that a narrowed table has
        width, lines = self.content_region.width, len(self._rows) + 1
        tall, tall_narrowed = lines > table.size.height, lines > table.size.height - 1
        self._tall = tall
        room = width - tall if width else 0
        needed = frozenset(k for r in self._rows for k in r.differ)
        self._shown = fit(columns, widths, room, needed | {"run", "slot"}) if room else columns
        edge = _whole_columns([widths[c.key] for c in self._shown], width - tall_narrowed)
        narrowed = None if edge is None else edge + tall_narrowed
        table.styles.width = narrowed
        hidden = len(columns) - len(self._shown)
        said = [self._hidden_said(hidden, columns, widths, needed, tall)] if hidden else []
        if narrowed is not None:
            said.append("shift+→ for more")
        self.border_subtitle = "; ".join(said)
        self._show_title()
        cursor = table.cursor_coordinate
        table.clear(columns=True)
        for c in self._shown:
            table.add_column(c.label, width=widths[c.key], key=c.key)
        # which tensor a row is stays in view while the table scrolls sideways
        labels = ("run", "call", "phase", "slot")
        table.fixed_columns = next(
            (i for i, c in enumerate(self._shown) if c.key not in labels), len(self._shown)
        )
        for row in self._rows:
            tint = self._style("nonfinite") if row.nonfinite > 0 else ""
            cells = []
            for c in self._shown:
                style = tint
                if c.key in row.differ:
                    style = f"{tint} {self._style('differs')}"
                elif c.key in row.bad or (c.key == "nonfinite" and row.nonfinite > 0):
                    style = f"{tint} {self._style('bad')}"
                elif c.key == "slot" and row.differ:
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

    def _hidden_said(
        self,
        hidden: int,
        columns: list[Column],
        widths: dict[str, int],
        needed: frozenset[str],
        tall: bool,
    ) -> str:
        """How many columns are left out, and how to see them: zoomed (``z``), where the
        screen's width shows more of them than the pane's, else a wider window."""
        if not self.is_maximized:
            frame = self.outer_size.width - self.content_region.width
            room = self.screen.size.width - frame - tall
            if len(fit(columns, widths, room, needed | {"run", "slot"})) > len(self._shown):
                return f"+{hidden} columns: z zooms"
        return f"+{hidden} columns in a wider window"

    def _to_first_difference(self) -> None:
        """Put the cursor on the first cell in which the two runs differ, with the row
        of run b below it in view too."""
        table = self.query_one(DetailTable)
        keys = [c.key for c in self._shown]
        for i, row in enumerate(self._rows):
            columns = [keys.index(k) for k in keys if k in row.differ]
            if columns:
                if i + 1 < len(self._rows):
                    table.move_cursor(row=i + 1, column=columns[0])
                table.move_cursor(row=i, column=columns[0])
                return

    def explain(self, marks: Text | None) -> None:
        """What the tree's marks on the selected module mean, in words, under the title."""
        self._marks = marks
        self._show_title()

    def _show_title(self) -> None:
        title = self._title if not self._marks else Text("\n").join([self._title, self._marks])
        self.query_one("#detail-title", Static).update(title)

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
        self._histogram_of = detail  # drawn again to a new width
        width = self.content_region.width
        box = self.query_one("#histogram", Static)
        box.set_class(not detail.captures, "hidden")
        if not detail.captures:
            return
        shown = detail.histogram_of or detail.captures[0]
        if detail.histogram is None:
            said = f"stored {shown.label} has no finite values ({shown.source})"
            box.update(Text(said, style="dim"))
            return
        counts, low, high = detail.histogram
        box.update(histogram_line(counts, low, high, f"{shown.label}, {shown.source}", width))


def histogram_line(counts: list[float], low: float, high: float, what: str, width: int) -> Text:
    """``values low ▁▃█ high  (what)`` in ``width`` cells (0: any): what the values are
    goes first, then neighbouring bars are merged, so that neither number is cut."""
    ends = f"values {stat_text(low)}  {stat_text(high)}"
    label = f"  ({what})"
    if width and len(ends) + len(counts) + len(label) > width:
        label = ""
    room = width - len(ends) if width else len(counts)
    if 0 < room < len(counts):  # each bar the sum of ``merge`` bins, the range the same
        merge = math.ceil(len(counts) / room)
        counts = [sum(counts[i : i + merge]) for i in range(0, len(counts), merge)]
    peak = max(counts) or 1.0
    bars = "".join(" ▁▂▃▄▅▆▇█"[min(8, math.ceil(8 * c / peak))] for c in counts)
    return Text.assemble(
        ("values ", "dim"),
        (f"{stat_text(low)} ", ""),
        (bars if room > 0 else "", "green"),
        (f" {stat_text(high)}", ""),
        (label, "dim"),
    )


def _whole_columns(widths: list[int], room: int) -> int | None:
    """Where the columns that must stay (those in which two runs differ) are wider than
    the room: the width of the whole columns that fit, so that the table drawn that wide
    shows none in part (``90.`` for ``90.39``) and the rest are a sideways scroll away;
    else None (the width the stylesheet gives it)."""
    cells = [width + 2 for width in widths]  # and each cell's padding
    if room <= 0 or sum(cells) <= room:
        return None
    edge = 0
    for width in cells:
        if edge + width > room:
            break
        edge += width
    return edge or None


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
