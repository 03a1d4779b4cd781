"""Screens over the replay: profile, alerts, search, help. Each returns a place to jump
to ((module id, step), or None) when it is dismissed."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Input, Markdown, Static

from hookdbg.analysis.alerts import AlertReport
from hookdbg.analysis.profile import Profile
from hookdbg.analysis.query import QueryError, parse
from hookdbg.analysis.search import SearchResult
from hookdbg.read.modules import ModuleTable
from hookdbg.store.schema import Phase, nonfinite_count, slot_label
from hookdbg.text import num, printable, utf8

Jump = tuple[int, int] | None  # (module id, step)


class ProfileScreen(Screen[Jump]):
    """Modules by time; s/t/c/n sort by self, total, calls, name; Enter shows one."""

    BINDINGS = [
        Binding("escape,p", "dismiss(None)", "back"),
        Binding("s", "order('self')", "sort: self"),
        Binding("t", "order('total')", "total"),
        Binding("c", "order('calls')", "calls"),
        Binding("n", "order('name')", "name"),
    ]

    def __init__(self, profile: Profile, step: int | None) -> None:
        super().__init__()
        self.profile = profile
        self.step = step
        self._sort_key = "self"

    def compose(self) -> ComposeResult:
        span = f"step {self.step}" if self.step is not None else "all steps"
        yield Static(
            Text(
                f"profile of {span}: milliseconds per step, self = without recorded submodules",
                style="bold",
            ),
            id="screen-title",
        )
        yield DataTable(id="profile-table", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("module", "type", "phase", "calls", "self ms", "total ms", "share")
        self._fill()
        table.focus()

    def _fill(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        for row in self.profile.sorted(self._sort_key):
            table.add_row(
                Text(printable(row.module.name)),
                Text(printable(row.module.type), style="dim"),
                Text(Phase(row.phase).label),
                Text(f"{row.calls_per_step:g}", justify="right"),
                Text(f"{row.self_mean * 1e3:.3f}", justify="right"),
                Text(f"{row.total_mean * 1e3:.3f}", justify="right"),
                Text(f"{row.share:.1%}", justify="right", style="cyan"),
                key=f"{row.module.id}:{row.phase}",
            )

    def action_order(self, key: str) -> None:
        self._sort_key = key
        self._fill()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        module = int(str(event.row_key.value).split(":")[0])
        step = self.step if self.step is not None else self.profile.first
        self.dismiss((module, step))


class AlertsScreen(Screen[Jump]):
    """Every NaN/inf origin in order; the first is marked; Enter jumps to it."""

    BINDINGS = [Binding("escape,a", "dismiss(None)", "back")]

    def __init__(self, reports: list[AlertReport]) -> None:
        super().__init__()
        self.reports = reports

    def compose(self) -> ComposeResult:
        yield Static(
            Text(f"{len(self.reports)} NaN/inf alerts: where each was born", style="bold"),
            id="screen-title",
        )
        yield DataTable(id="alerts-table", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("", "step", "module", "phase", "tensor", "what")
        for i, r in enumerate(self.reports):
            a = r.alert
            first = Text("★ first", style="bold red") if a["first"] else Text("")
            table.add_row(
                first,
                Text(str(int(a["step"])), justify="right"),
                Text(printable(r.module.name)),
                Text(Phase(int(a["phase"])).label),
                Text(printable(slot_label(int(a["slot"]), utf8(a["path"])))),
                Text(printable(utf8(a["message"]).split(": ", 1)[-1])),
                key=str(i),
            )
        table.focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        r = self.reports[int(str(event.row_key.value))]
        self.dismiss((r.module.id, int(r.alert["step"])))


class SearchScreen(Screen[Jump]):
    """Type a query (the `hookdbg search` language), Enter to search, then pick a hit."""

    BINDINGS = [Binding("escape", "dismiss(None)", "back")]

    def __init__(self, modules: ModuleTable, query: str = "") -> None:
        super().__init__()
        self.modules = modules
        self.initial = query
        self.hits: list[tuple[int, int]] = []

    def compose(self) -> ComposeResult:
        yield Input(
            value=self.initial,
            id="query",
            placeholder="e.g.  nan   type:BatchNorm2d std<1e-6   layer4.* phase:bwd norm>10",
        )
        yield Static(id="search-status")
        yield DataTable(id="search-table", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(
            "step", "module", "phase", "tensor", "shape", "min", "max", "mean", "std", "nan/inf"
        )
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        status = self.query_one("#search-status", Static)
        try:
            query = parse(event.value)
        except QueryError as exc:
            status.update(Text(f"bad query: {exc}", style="bold red"))
            return
        status.update(Text("searching...", style="dim"))
        self.app.search_from(query, self)  # type: ignore[attr-defined]

    def show(self, query: str, result: SearchResult) -> None:
        """Called by the app with the search's result."""
        table = self.query_one(DataTable)
        table.clear()
        self.hits = []
        for i, r in enumerate(result.rows):
            self.hits.append((int(r["module"]), int(r["step"])))
            if result.on_tensors:
                bad = nonfinite_count(r)
                cells = [
                    Text(printable(slot_label(int(r["slot"]), utf8(r["path"])))),
                    Text(printable(r["shape"])),
                    *(Text(num(r[k]), justify="right") for k in ("min", "max", "mean", "std")),
                    Text("-" if bad < 0 else str(bad), style="bold red" if bad > 0 else ""),
                ]
            else:
                cells = [
                    Text(f"call {int(r['index'])}"),
                    Text(""),
                    Text(f"{float(r['total']) * 1e3:.3f} ms", justify="right"),
                    Text(""),
                    Text(""),
                    Text(""),
                    Text(""),
                ]
            table.add_row(
                Text(str(int(r["step"])), justify="right"),
                Text(printable(self.modules.name(int(r["module"])))),
                Text(Phase(int(r["phase"])).label),
                *cells,
                key=str(i),
            )
        shown = f" (first {len(result.rows):,})" if result.total > len(result.rows) else ""
        self.query_one("#search-status", Static).update(
            Text(
                f"{result.total:,} matches for {query!r}{shown}; Enter jumps, n/N in the replay "
                "walk through them",
                style="green" if result.total else "yellow",
            )
        )
        if result.total:
            table.focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.dismiss(self.hits[int(str(event.row_key.value))])


HELP = """\
# hookdbg tui

| key | does |
| --- | --- |
| `←` `→` (`h` `l`) | previous / next recorded step |
| `home` `end` | first / last step |
| `↑` `↓`, `enter` | move in the module tree, fold / unfold |
| `tab` | move between the tree and the tensor table |
| `s` | plot another statistic over steps |
| `p` | profile (`a` in it: all steps) |
| `a` | NaN/inf alerts; `enter` jumps to one |
| `/` | search; `n` / `N` next / previous hit |
| `f` | first divergence (comparing two runs) or first alert |
| `F` | follow a recording that is still being written on / off |
| `ctrl+p` | command palette |
| `?` | this help; `q` quits |

**Search** uses the language of `hookdbg search`: `nan`, `inf`, `type:Conv2d`,
`layer3.*`, `phase:bwd`, `slot:grad`, `step:3:7`, `max>1e4`, `std<1e-6`, `!type:Dropout`.

**Badges** in the tree: share of the step's time, `×N` calls, `◆` a NaN/inf was born
here, `⚠` non-finite values passed through, `≠` differs from the other run.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss(None)", "close")]

    def compose(self) -> ComposeResult:
        yield Markdown(HELP, id="help")
