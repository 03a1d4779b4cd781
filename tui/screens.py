"""The alerts screen, and what every screen over the replay is dismissed with: a place
to jump to (a ``Jump``), or None. The profile is profile.py's, the search search.py's."""

from __future__ import annotations

from dataclasses import dataclass

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Static

from hookdbg.analysis.alerts import AlertReport
from hookdbg.analysis.runup import TITLE, Climb, run_up
from hookdbg.cells import (
    slot_label,
)
from hookdbg.read import Recording, RecordingError
from hookdbg.store.schema import Phase
from hookdbg.text import plural, printable, utf8

from .dialogs import Closing, leave
from .keybar import KeyBar


@dataclass(frozen=True)
class Jump:
    """Where to go when a screen closes; a search also hands over its hits for n/N."""

    module: int
    step: int
    hits: tuple[tuple[int, int], ...] = ()  # (module, step), one per module and step
    rank: int | None = None  # the rank (index into the replay's ranks) to switch to


class AlertsScreen(Closing, Screen[Jump | None]):
    """Every NaN/inf origin of every rank in order; the first is marked; Enter jumps
    to it (on its rank). Under the list, the highlighted alert's run-up: how its tensor,
    what fed it and its module's parameters climbed over the last recorded steps."""

    BINDINGS = [Binding("escape,a", "dismiss(None)", "back")]

    def __init__(
        self,
        reports: list[tuple[int, AlertReport]],
        ranks: list[int],
        recordings: list[Recording],
    ) -> None:
        """``reports``: (rank index, report) in the order they happened; ``ranks``:
        the rank number of each index; ``recordings``: its recording."""
        super().__init__()
        self.reports = reports
        self.ranks = ranks
        self.recordings = recordings
        self._climbs: dict[int, list[Climb]] = {}  # by report, read when first shown

    def compose(self) -> ComposeResult:
        where = "where it was born" if len(self.reports) == 1 else "where each was born"
        on = {rank for rank, _ in self.reports}
        ranks = f" on {len(on)} of {len(self.ranks)} ranks" if len(self.ranks) > 1 else ""
        yield Static(
            Text(f"{plural(len(self.reports), 'NaN/inf alert')}{ranks}: {where}", style="bold"),
            id="screen-title",
        )
        yield DataTable(id="alerts-table", cursor_type="row", zebra_stripes=True)
        yield Static(id="alert-run-up")
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

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key  # None while the table is being filled anew (a resize)
        if key is not None and key.value is not None:
            self._show_run_up(int(str(key.value)))

    def _show_run_up(self, i: int) -> None:
        """Under the list: the op that made the highlighted alert (where the alert's own
        words do not say it already) and its run-up."""
        shown = self.query_one("#alert-run-up", Static)
        rank, report = self.reports[i]
        op = report.op_said_apart
        parts: list[RenderableType] = []
        if op is not None:
            parts.append(Text(printable(f"the op: {op}")))
        if i not in self._climbs:
            try:
                self._climbs[i] = run_up(self.recordings[rank], report)
            except RecordingError as exc:  # its tensors damaged since they were checked
                shown.update(Group(*parts, Text(printable(f"no run-up: {exc}"))))
                return
        climbs = self._climbs[i]
        if climbs and len(climbs[0].steps) >= 2:
            steps = climbs[0].steps
            table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
            table.add_column("tensor", no_wrap=True)
            table.add_column("dtype", no_wrap=True)
            for step in steps:
                table.add_column(f"step {step}", justify="right", no_wrap=True)
            for climb in climbs:
                cells = map(climb.text, range(len(steps)))
                table.add_row(printable(climb.label), climb.dtype, *cells)
            # Climb.text gives the share only from 1% up: a cell without one is below
            said = f"run-up, last {len(steps)} recorded steps: {TITLE}"
            title = Text(said, style="bold")
            parts += [title, table]  # the title as wide as the screen, not the table
        shown.update(Group(*parts) if parts else "")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        rank, r = self.reports[int(str(event.row_key.value))]
        leave(self, Jump(r.module.id, int(r.alert["step"]), rank=rank))
