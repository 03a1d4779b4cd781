"""Screens over the replay: alerts and search (the profile is profile.py's). Each is
dismissed with a place to jump to (a ``Jump``), or None."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Input, Static
from textual.worker import get_current_worker

from hookdbg.analysis.alerts import AlertReport
from hookdbg.analysis.query import Query, QueryError, parse
from hookdbg.analysis.search import SearchResult
from hookdbg.cells import (
    FRACTIONS,
    LATER_STATS,
    STATS,
    cell_text,
    label,
    nonfinite_count,
    slot_label,
    tensor_text,
)
from hookdbg.read.modules import ModuleTable
from hookdbg.store.schema import Phase
from hookdbg.text import plural, printable, utf8

from .detail import Column, fit
from .dialogs import Closing, leave
from .keybar import KeyBar
from .model import RunView


@dataclass(frozen=True)
class Jump:
    """Where to go when a screen closes; a search also hands over its hits for n/N."""

    module: int
    step: int
    hits: tuple[tuple[int, int], ...] = ()  # (module, step), one per module and step
    rank: int | None = None  # the rank (index into the replay's ranks) to switch to


class AlertsScreen(Closing, Screen[Jump | None]):
    """Every NaN/inf origin of every rank in order; the first is marked; Enter jumps
    to it (on its rank)."""

    BINDINGS = [Binding("escape,a", "dismiss(None)", "back")]

    def __init__(self, reports: list[tuple[int, AlertReport]], ranks: list[int]) -> None:
        """``reports``: (rank index, report) in the order they happened; ``ranks``:
        the rank number of each index."""
        super().__init__()
        self.reports = reports
        self.ranks = ranks

    def compose(self) -> ComposeResult:
        where = "where it was born" if len(self.reports) == 1 else "where each was born"
        on = {rank for rank, _ in self.reports}
        ranks = f" on {len(on)} of {len(self.ranks)} ranks" if len(self.ranks) > 1 else ""
        yield Static(
            Text(f"{plural(len(self.reports), 'NaN/inf alert')}{ranks}: {where}", style="bold"),
            id="screen-title",
        )
        yield DataTable(id="alerts-table", cursor_type="row", zebra_stripes=True)
        yield KeyBar()

    def _first(self) -> int | None:
        """The run's first origin: each rank marks its own; the earliest of them."""
        firsts = [
            (int(r.alert["step"]), float(r.alert["time"]), i)
            for i, (_, r) in enumerate(self.reports)
            if r.alert["first"]
        ]
        return min(firsts)[2] if firsts else None

    def on_mount(self) -> None:
        self._fill()
        self.query_one(DataTable).focus()

    def on_resize(self) -> None:
        self._fill()

    def _fill(self) -> None:
        """The alerts, what each says in the room the other columns leave, wrapped onto
        more lines rather than cut."""
        table = self.query_one(DataTable)
        ranked = len(self.ranks) > 1
        star = self._first()
        rows = []
        for i, (rank, r) in enumerate(self.reports):
            a = r.alert
            rows.append(
                [
                    Text("★ first", style="bold red") if i == star else Text(""),
                    *((Text(str(self.ranks[rank]), justify="right"),) if ranked else ()),
                    Text(str(int(a["step"])), justify="right"),
                    Text(printable(r.module.name)),
                    Text(Phase(int(a["phase"])).label),
                    Text(printable(slot_label(int(a["slot"]), utf8(a["path"])))),
                    Text(printable(utf8(a["message"]).split(": ", 1)[-1])),
                ]
            )
        titles = ["", *(("rank",) if ranked else ()), "step", "module", "phase", "tensor"]
        widths = [max([len(t), *(r[k].cell_len for r in rows)]) for k, t in enumerate(titles)]
        room = (table.scrollable_content_region.width or self.size.width) - 1
        said = max([4, *(r[-1].cell_len for r in rows)])
        what = max(room - sum(w + 2 for w in widths) - 2, 12)
        cursor = table.cursor_row
        table.clear(columns=True)
        for title, width in zip(titles, widths, strict=True):
            table.add_column(title, width=width)
        table.add_column("what", width=min(what, said))
        for i, row in enumerate(rows):
            table.add_row(*row, key=str(i), height=None)
        if rows:
            table.move_cursor(row=min(cursor, len(rows) - 1))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        rank, r = self.reports[int(str(event.row_key.value))]
        leave(self, Jump(r.module.id, int(r.alert["step"]), rank=rank))


# what a search shows of a matching tensor summary, most wanted first: a narrow screen
# leaves out the columns of lowest ``keep`` rather than cut a number
TENSOR_MATCH = (
    Column("step", "step", 100),
    Column("module", "module", 99, right=False),
    Column("phase", "phase", 80, right=False),
    Column("tensor", "tensor", 98, right=False),
    Column("nonfinite", "nan/inf", 75),
    Column("min", "min", 68),
    Column("max", "max", 70),
    Column("mean", "mean", 66),
    Column("std", "std", 64),
    Column("norm", "norm", 50),
    # the statistics declared after these (hookdbg/store/summary.py), left out of a
    # narrow screen before the fractions and the shape
    *(Column(name, label(name), 35 - i) for i, name in enumerate(LATER_STATS)),
    Column("absmax", "max |x|", 45),
    Column("numel", "numel", 44),
    *(Column(name, label(name), 42 - i) for i, name in enumerate(FRACTIONS)),
    Column("shape", "shape", 40, right=False),
)
# a matching module call (a query about modules only)
CALL_MATCH = (
    Column("step", "step", 100),
    Column("module", "module", 99, right=False),
    Column("phase", "phase", 80, right=False),
    Column("call", "call", 70),
    Column("total", "total ms", 90),
    Column("self", "self ms", 85),
)
# a query about NaN/inf counts shows the nan/inf column
_COUNTS = {"nan": "nonfinite", "posinf": "nonfinite", "neginf": "nonfinite"}
# flags about NaN/inf (``nan``, ``inf``): the nan/inf column
_FLAGS = ("nan", "inf", "nonfinite", "finite")
# shown whatever the query: the other statistics only when it names them
_SHOWN = ("nonfinite", "min", "max", "mean", "std", "shape")


def match_columns(query: Query, on_tensors: bool) -> list[Column]:
    """The columns of a search's matches: for tensors, the statistics the query names
    come right after where the tensor is, and are the last left out; the statistics it
    does not name that are not always shown (norm, numel...) only when named."""
    if not on_tensors:
        return list(CALL_MATCH)
    named = list(
        dict.fromkeys(
            _COUNTS.get(t.stat, t.stat) if t.stat else "nonfinite"
            for t in query.terms
            if t.stat or t.text.lower() in _FLAGS
        )
    )
    by_key = {c.key: c for c in TENSOR_MATCH}
    where = [by_key[k] for k in ("step", "module", "phase", "tensor")]
    asked = [dataclasses.replace(by_key[k], keep=97 - i) for i, k in enumerate(named)]
    rest = [by_key[k] for k in _SHOWN if k not in named]
    return [*where, *asked, *rest]


def match_cells(row: np.void, modules: ModuleTable, on_tensors: bool) -> dict[str, str]:
    """One match as text, every number whole (``num``: at most 10 characters)."""
    cells = {
        "step": str(int(row["step"])),
        "module": printable(modules.name(int(row["module"]))),
        "phase": Phase(int(row["phase"])).label,
    }
    if not on_tensors:
        cells["call"] = str(int(row["index"]))
        cells["total"] = f"{float(row['total']) * 1e3:.3f}"
        cells["self"] = f"{float(row['self']) * 1e3:.3f}"
        return cells
    text = tensor_text(row)
    cells.update(tensor=text.slot, nonfinite=text.count, shape=text.shape, **text.fractions)
    cells.update({stat: text.stat(stat) for stat in STATS})
    absmax = max(abs(float(row["min"])), abs(float(row["max"])))
    cells["absmax"] = cell_text(absmax, text.nonfinite)
    cells["numel"] = f"{int(row['numel']):,}"
    return cells


class SearchScreen(Closing, Screen[Jump | None]):
    """Type a query (the `hookdbg search` language), Enter to search, then pick a hit."""

    BINDINGS = [Binding("escape", "dismiss(None)", "back")]

    def __init__(self, run: RunView, query: str = "") -> None:
        super().__init__()
        self.run = run
        self.initial = query
        self.query_text = query
        self.hits: list[tuple[int, int]] = []
        self._columns: list[Column] = []
        self._cells: list[dict[str, str]] = []
        self._bad: list[bool] = []  # the match holds NaN/inf

    def compose(self) -> ComposeResult:
        yield Input(
            value=self.initial,
            id="query",
            placeholder="e.g.  nan   type:BatchNorm2d std<1e-6   layer4.* phase:bwd norm>10",
        )
        yield Static(id="search-status")
        yield DataTable(id="search-table", cursor_type="row", zebra_stripes=True)
        yield KeyBar()

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        status = self.query_one("#search-status", Static)
        try:
            query = parse(event.value)
        except QueryError as exc:
            status.update(Text(f"bad query: {exc}", style="bold red"))
            return
        status.update(Text("searching...", style="dim"))
        self.query_text = query.text
        self._search(query)

    @work(thread=True, exclusive=True)
    def _search(self, query: Query) -> None:
        result = self.run.search(query)
        if not get_current_worker().is_cancelled:
            self.app.call_from_thread(self._show, query, result)

    def _show(self, query: Query, result: SearchResult) -> None:
        if query.text != self.query_text:
            return  # a late result of an earlier query
        modules = self.run.rec.modules
        self._columns = match_columns(query, result.on_tensors)
        self._cells = [match_cells(r, modules, result.on_tensors) for r in result.rows]
        self._bad = [result.on_tensors and nonfinite_count(r) > 0 for r in result.rows]
        self.hits = [(int(r["module"]), int(r["step"])) for r in result.rows]
        self._fill()
        what = (
            plural(result.total, "tensor summary", "tensor summaries")
            if result.on_tensors
            else plural(result.total, "module call")
        )
        shown = (
            f" (the first {len(result.rows):,} shown)" if result.total > len(result.rows) else ""
        )
        found = f"{what} match {query.text!r}{shown}"
        if result.total:
            found += "; Enter jumps, n/N in the replay go to the next / previous matching module"
        self.query_one("#search-status", Static).update(
            Text(found, style="green" if result.total else "yellow")
        )
        if result.total:
            self.query_one(DataTable).focus()

    def on_resize(self) -> None:
        if self._columns:
            self._fill()

    def _fill(self) -> None:
        """The matches in the columns that fit: none is cut, the least wanted go first."""
        table = self.query_one(DataTable)
        widths = {
            c.key: max(len(c.label), *(len(cells[c.key]) for cells in self._cells))
            if self._cells
            else len(c.label)
            for c in self._columns
        }
        room = table.scrollable_content_region.width or self.size.width
        shown = fit(self._columns, widths, room) if room else self._columns
        table.clear(columns=True)
        for c in shown:
            table.add_column(c.label, width=widths[c.key], key=c.key)
        for i, (cells, bad) in enumerate(zip(self._cells, self._bad, strict=True)):
            table.add_row(
                *(
                    Text(
                        cells[c.key],
                        justify="right" if c.right else "left",
                        style="bold red" if bad and c.key == "nonfinite" else "",
                    )
                    for c in shown
                ),
                key=str(i),
            )

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        module, step = self.hits[int(str(event.row_key.value))]
        places = tuple(dict.fromkeys(self.hits))  # n/N: one stop per module and step
        leave(self, Jump(module, step, places))
