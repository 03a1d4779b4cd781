"""The profile screen (``p``): where the step's time went, then module by module.

On top, htop-style meters of the step's parts as ``hookdbg profile`` prints them
(forward, backward, backward outside modules, optimizer, outside modules: the modules'
self times, which add up to the step), and hookdbg's own time, left out of all of
them; in small models the parts outside modules are often the largest. Below, the
modules by time, each with its self time (without its recorded submodules), its total
time (with them) and its self share of the step. Comparing two runs, the title says
whose profile it is, and ``b`` shows the other's.
"""

from __future__ import annotations

import dataclasses
import math

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Static
from textual.worker import get_current_worker

from hookdbg.analysis.profile import Profile, ProfileRow, StepTime
from hookdbg.store.schema import Phase
from hookdbg.text import printable

from .detail import Column, fit
from .dialogs import Closing, leave
from .keybar import KeyBar
from .model import RunView
from .plot import packed
from .screens import Jump

# the profile's columns; a narrow screen leaves out those of lowest keep first
PROFILE_COLUMNS = (
    Column("module", "module", 100, right=False),
    Column("type", "type", 40, right=False),
    Column("phase", "phase", 80, right=False),
    Column("calls", "calls", 60),
    Column("device_self", "device self ms", 96),
    Column("device_total", "device total ms", 94),
    Column("host_self", "host self ms", 95),
    Column("host_total", "host total ms", 85),
    Column("share", "self share", 90),
)
# the meters' order and colours: the modules' own work, then what runs outside them
PARTS = (
    ("forward", "green"),
    ("backward", "blue"),
    ("backward outside modules", "cyan"),
    ("optimizer", "magenta"),
    ("outside modules", "yellow"),
)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def meters(time: StepTime, width: int, steps: int = 1) -> Text:
    """A meter a line for each part of the step: its name, a bar of its share, the
    share and the milliseconds; then the step (a mean where ``steps`` are several) and
    hookdbg's own time. The bar takes what room the words leave, and goes before a
    word is cut."""
    step = time.step or 1.0
    name_w = max(len(name) for name, _ in PARTS)
    numbers = [(f"{value / step:.0%}", _ms(value)) for value in time.parts.values()]
    share_w = max(len(s) for s, _ in numbers)
    ms_w = max(len(m) for _, m in numbers)
    bar_w = width - name_w - share_w - ms_w - 5  # "name [bar] share ms"
    lines = []
    for (name, colour), value, (share, ms) in zip(PARTS, time.parts.values(), numbers, strict=True):
        line = Text(name.rjust(name_w), style="bold")
        if bar_w >= 4:
            filled = round(bar_w * min(max(value / step, 0.0), 1.0))
            line.append(" [")
            line.append("|" * filled, style=colour)
            line.append(" " * (bar_w - filled) + "]")
        line.append(f" {share.rjust(share_w)} {ms.rjust(ms_w)}")
        lines.append(line)
    mean = " (mean)" if steps > 1 else ""
    total = [Text(f"{'step'.rjust(name_w)}  {_ms(time.step)}{mean}", style="bold")]
    if not math.isnan(time.hookdbg):
        total.append(Text(f"hookdbg's own {_ms(time.hookdbg)}: left out of every time", "dim"))
    lines.append(packed(total, width))
    return Text("\n").join(lines)


class ProfileScreen(Closing, Screen[Jump | None]):
    """The step's parts, then modules by time in one step, or all steps (``a``);
    s/t/c/n sort by self, total, calls, name; Enter shows one; ``b`` the other run's."""

    BINDINGS = [
        Binding("escape,p", "dismiss(None)", "back"),
        Binding("a", "all_steps", "all steps / this step"),
        Binding("b", "other_run", "the other run", show=False),
        Binding("s", "order('self')", "sort: self"),
        Binding("t", "order('total')", "total"),
        Binding("c", "order('calls')", "calls"),
        Binding("n", "order('name')", "name"),
    ]

    def __init__(
        self,
        runs: list[tuple[str, RunView]],
        profile: Profile,
        step: int | None,
    ) -> None:
        """``runs``: the run shown (the replay's, whose modules the tree shows) and,
        comparing two, the other, each with its name on screen ("run a (before.h5)",
        "rank 1"; "" where it is the only one); ``profile`` is the first's."""
        super().__init__()
        self.runs = runs
        self.shown = 0  # which of them the profile is of
        self.profile = profile
        self.step = step  # the replay's step; None: the profile covers all steps
        self.all_steps = step is None
        self._sort_key = "self"

    @property
    def run(self) -> RunView:
        return self.runs[self.shown][1]

    def compose(self) -> ComposeResult:
        yield Static(id="screen-title")
        yield Static(id="profile-meters")
        yield DataTable(id="profile-table", cursor_type="row", zebra_stripes=True)
        yield KeyBar()

    def on_mount(self) -> None:
        self._fill()
        self.query_one(DataTable).focus()

    def on_resize(self) -> None:
        self._fill()

    def _meters(self) -> None:
        box = self.query_one("#profile-meters", Static)
        width = (box.size.width or self.size.width) - 2
        box.update(meters(self.profile.time, width, self.profile.steps))

    def _fill(self) -> None:
        p = self.profile
        span = f"step {p.first}" if p.first == p.last else f"steps {p.first}-{p.last} ({p.steps:,})"
        other = "this step" if self.all_steps else "all steps"
        keys = f"a: {other}, enter: go to the module"
        if len(self.runs) > 1:
            keys += f", b: {self.runs[1 - self.shown][0]}"
        head = Text(f"profile of {span}", style="bold")
        if self.runs[self.shown][0]:
            head.append(f", {self.runs[self.shown][0]}", style="bold")
        width = self.size.width - 2
        parts = [
            head,
            Text("ms per step; self: without its recorded submodules, total: with them"),
            Text(keys, style="dim"),
        ]
        self.query_one("#screen-title", Static).update(packed(parts, width))
        self._meters()
        self._table()

    def _table(self) -> None:
        """The modules in the columns that fit: none is cut, the type goes first."""
        p = self.profile
        device = p.on_device  # device times lead; the host's are the launches
        columns = [c for c in PROFILE_COLUMNS if device or not c.key.startswith("device")]
        if not device:  # the host's times are the only ones: no "host" in their names
            columns = [
                dataclasses.replace(c, label=c.label[5:]) if c.key.startswith("host") else c
                for c in columns
            ]
        rows = [_cells(row) for row in p.sorted(self._sort_key)]
        widths = {c.key: max([len(c.label), *(len(r[c.key].plain) for r in rows)]) for c in columns}
        table = self.query_one(DataTable)
        room = table.scrollable_content_region.width or self.size.width
        shown = fit(columns, widths, room)
        table.clear(columns=True)
        for c in shown:
            table.add_column(c.label, width=widths[c.key], key=c.key)
        for row, cells in zip(p.sorted(self._sort_key), rows, strict=True):
            table.add_row(*(cells[c.key] for c in shown), key=f"{row.module.id}:{row.phase}")

    def action_order(self, key: str) -> None:
        self._sort_key = key
        self._fill()

    def action_all_steps(self) -> None:
        if self.step is None:
            return  # no step to go back to
        self.all_steps = not self.all_steps
        self.notify(f"profiling {'all steps' if self.all_steps else f'step {self.step}'}...")
        self._load(self.run, None if self.all_steps else self.step)

    def action_other_run(self) -> None:
        """``b``: the other run's profile, of the same steps; again, this one's."""
        if len(self.runs) < 2:
            self.notify("one run: b shows the other run's profile when comparing two")
            return
        self.shown = 1 - self.shown
        self._load(self.run, None if self.all_steps else self.step)

    @work(thread=True, exclusive=True)
    def _load(self, run: RunView, step: int | None) -> None:
        profile = run.profile(step)
        if not get_current_worker().is_cancelled:
            self.app.call_from_thread(self._loaded, run, profile, step)

    def _loaded(self, run: RunView, profile: Profile, step: int | None) -> None:
        if (step is None) != self.all_steps or run is not self.run:
            return  # a late answer to an earlier press of a or b
        self.profile = profile
        self._fill()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        module = int(str(event.row_key.value).split(":")[0])
        if self.shown:  # the other run's module: the tree shows the first run's twin
            name = self.run.rec.modules.name(module)
            twin = self.runs[0][1].rec.modules.by_name(name)
            if twin is None:
                self.notify(f"{printable(name)} is in {self.runs[self.shown][0]} only")
                return
            module = twin.id
        step = self.step if self.step is not None else self.profile.first
        leave(self, Jump(module, step))


def _cells(row: ProfileRow) -> dict[str, Text]:
    return {
        "module": Text(printable(row.module.name)),
        "type": Text(printable(row.module.type), style="dim"),
        "phase": Text(Phase(row.phase).label),
        "calls": Text(f"{row.calls_per_step:g}", justify="right"),
        "device_self": _cell(row.device_self_mean),
        "device_total": _cell(row.device_total_mean, "dim"),
        "host_self": Text(f"{row.self_mean * 1e3:.3f}", justify="right"),
        "host_total": Text(f"{row.total_mean * 1e3:.3f}", justify="right"),
        "share": Text(f"{row.share:.1%}", justify="right", style="cyan"),
    }


def _cell(seconds: float, style: str = "") -> Text:
    """Milliseconds, or '-' for a call not timed on the device."""
    text = "-" if seconds != seconds else f"{seconds * 1e3:.3f}"
    return Text(text, justify="right", style=style)
