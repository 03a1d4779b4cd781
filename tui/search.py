"""The search screen (``/``): the ``hookdbg search`` language, taught as you type.

Under the query, the fields, flags, statistics and operators it knows; as you type, how
many tensor summaries or calls match (or what is wrong with the query, said before
Enter); ``↑``/``↓`` go through the queries searched before. Enter lists the matches,
the statistics the query names first.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Input, Static
from textual.worker import get_current_worker

from hookdbg.analysis.query import STATS as SEARCHED
from hookdbg.analysis.query import Query, QueryError, parse
from hookdbg.analysis.search import SearchResult
from hookdbg.cells import (
    FRACTIONS,
    LATER_STATS,
    STATS,
    cell_text,
    label,
    nonfinite_count,
    tensor_text,
)
from hookdbg.read.modules import ModuleTable
from hookdbg.store.schema import Phase, Slot
from hookdbg.text import plural, printable

from .detail import Column, fit
from .dialogs import Closing, leave
from .keybar import KeyBar
from .model import RunView
from .screens import Jump

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


def guide() -> Table:
    """What the language knows, from its own lists: fields, flags, statistics and
    operators, one kind a line (wrapped under itself on a narrow screen)."""
    lines = [
        (
            "match",
            "a module name glob (layer3.*), or name: type: phase: slot: step: dtype: path: shape:",
        ),
        (
            "values",
            f"phase:{'|'.join(p.label for p in Phase)}   "
            f"slot:{'|'.join(s.label for s in Slot)}|grad   step:3, step:3:7",
        ),
        ("flags", "nan inf nonfinite finite"),
        ("compare", f"{' '.join(SEARCHED)} with < <= > >= = != and a number: std<1e-6"),
        ("combine", "all terms must match; !term negates; a|b: either, within a field"),
    ]
    table = Table(box=None, show_header=False, padding=(0, 1, 0, 0), expand=True)
    table.add_column(style="bold", no_wrap=True, justify="right")
    table.add_column(style="dim", ratio=1)
    for kind, says in lines:
        table.add_row(kind, says)
    return table


class QueryInput(Input):
    """The query; ↑/↓ go through the queries searched before, as a shell's history."""

    BINDINGS = [
        Binding("up", "history(-1)", "earlier query", show=False),
        Binding("down", "history(1)", "later query", show=False),
    ]

    def __init__(self, history: list[str], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.history = history  # the app's, oldest first
        self._at = len(history)  # past the newest: what is being typed
        self._typed = ""

    def action_history(self, delta: int) -> None:
        if not self.history:
            return
        if self._at == len(self.history):
            self._typed = self.value
        self._at = max(0, min(len(self.history), self._at + delta))
        self.value = self.history[self._at] if self._at < len(self.history) else self._typed
        self.cursor_position = len(self.value)


class SearchScreen(Closing, Screen[Jump | None]):
    """Type a query (the `hookdbg search` language): the number of matches is said as
    you type; Enter lists them, then pick one."""

    BINDINGS = [Binding("escape", "dismiss(None)", "back")]
    COUNT_AFTER = 0.25  # seconds of no typing before the matches are counted

    def __init__(self, run: RunView, query: str = "", history: list[str] | None = None) -> None:
        super().__init__()
        self.run = run
        self.initial = query
        self.query_text = query
        self.history = history if history is not None else []
        self.hits: list[tuple[int, int]] = []
        self._columns: list[Column] = []
        self._cells: list[dict[str, str]] = []
        self._bad: list[bool] = []  # the match holds NaN/inf
        self._typed = query  # the text the count in the status line is of
        self._listed = ""  # the text Enter was pressed on

    def compose(self) -> ComposeResult:
        yield QueryInput(
            self.history,
            value=self.initial,
            id="query",
            placeholder="e.g.  nan   type:BatchNorm2d std<1e-6   layer4.* phase:bwd norm>10",
        )
        yield Static(id="search-status")
        yield Static(guide(), id="search-guide")
        yield DataTable(id="search-table", cursor_type="row", zebra_stripes=True)
        yield KeyBar()

    def on_mount(self) -> None:
        self.query_one(Input).focus()
        if self.initial:
            self._count(self.initial)

    def on_input_changed(self, event: Input.Changed) -> None:
        """Count the matches once typing pauses; say what is wrong before Enter."""
        self._typed = event.value
        self.set_timer(self.COUNT_AFTER, lambda value=event.value: self._count(value))

    def _count(self, value: str) -> None:
        if value != self._typed:
            return  # typed on since
        status = self.query_one("#search-status", Static)
        if not value.strip():  # emptied: no count of what was there before stays up
            status.update(Text("type a query: the number of matches is said as you type", "dim"))
            return
        if value.strip() == self._listed:
            return  # Enter listed its matches
        try:
            query = parse(value)
        except QueryError as exc:
            status.update(Text(f"not yet a query: {exc}", style="yellow"))
            return
        status.update(Text("counting...", style="dim"))
        self._count_matches(query)

    @work(thread=True, exclusive=True, group="count")
    def _count_matches(self, query: Query) -> None:
        result = self.run.search(query, limit=0)
        if not get_current_worker().is_cancelled:
            self.app.call_from_thread(self._counted, query, result)

    def _counted(self, query: Query, result: SearchResult) -> None:
        if query.text != self._typed.strip() or query.text == self._listed:
            return  # a count of what was typed before, or of what Enter listed
        said = f"{_what(result)} would match; Enter lists them"
        style = "green" if result.total else "yellow"
        self.query_one("#search-status", Static).update(Text(said, style=style))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        status = self.query_one("#search-status", Static)
        self._listed = event.value.strip()  # what Enter says stays: no late count over it
        try:
            query = parse(event.value)
        except QueryError as exc:
            status.update(Text(f"bad query: {exc}", style="bold red"))
            return
        status.update(Text("searching...", style="dim"))
        self.query_text = query.text
        if not self.history or self.history[-1] != query.text:
            self.history.append(query.text)
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
        what = _what(result)
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


def _what(result: SearchResult) -> str:
    """'3 tensor summaries', '1 module call': what a search found, counted."""
    if result.on_tensors:
        return plural(result.total, "tensor summary", "tensor summaries")
    return plural(result.total, "module call")
