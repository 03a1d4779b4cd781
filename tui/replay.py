"""The main screen: step through a recording, module by module (two, side by side).

All reading happens in thread workers (``@work(thread=True)``); they hand plain results
back with ``call_from_thread``, so the interface never waits on the file.
"""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from hookdbg.analysis.query import Query
from hookdbg.read import Status
from hookdbg.text import printable
from hookdbg.tui.model import PLOT_STATS, DiffView, RunView
from hookdbg.tui.screens import AlertsScreen, HelpScreen, Jump, ProfileScreen, SearchScreen
from hookdbg.tui.widgets import DetailPane, ModuleTree, PlotPane, StepBar


class ReplayScreen(Screen[None]):
    BINDINGS = [
        Binding("left,h", "step(-1)", "step ←", priority=True),
        Binding("right,l", "step(1)", "step →", priority=True),
        Binding("home", "edge(0)", "first step", show=False, priority=True),
        Binding("end", "edge(-1)", "last step", show=False, priority=True),
        Binding("s", "next_stat", "plot"),
        Binding("p", "profile", "profile"),
        Binding("a", "alerts", "alerts"),
        Binding("slash", "search", "search"),
        Binding("n", "hit(1)", "next hit", show=False),
        Binding("N", "hit(-1)", "previous hit", show=False),
        Binding("f", "first", "first divergence/alert"),
        Binding("F", "toggle_follow", "follow"),
        Binding("r", "next_rank", "rank", show=False),
        Binding("question_mark", "help", "help"),
        Binding("q", "app.quit", "quit"),
    ]

    def __init__(
        self,
        run: RunView,
        other: RunView | None = None,
        follow: bool = False,
        ranks: list[RunView] | None = None,
    ) -> None:
        super().__init__()
        self.run = run
        self.ranks = ranks or [run]  # a distributed run: one view per rank, r switches
        self.other = other
        self.following = follow
        self.diff: DiffView | None = None
        self.steps: list[int] = []
        self.step: int | None = None
        self.module: int | None = None
        self.stat = 0
        self.hits: list[tuple[int, int]] = []
        self.hit = -1
        self.query_text = ""
        self.alert_steps: set[int] = set()
        self.known_alerts = 0

    # -- layout ----------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="notice", classes="hidden")
        with Horizontal(id="main"):
            yield ModuleTree(self.run.rec.modules, id="tree")
            with Vertical(id="right"):
                yield DetailPane(id="detail")
                yield PlotPane(id="plot")
        yield StepBar(id="stepbar")
        yield Footer()

    def _title(self) -> None:
        title = self.run.name if self.other is None else f"{self.run.name}  vs  {self.other.name}"
        if len(self.ranks) > 1:
            title += f"  (rank {self.run.rec.info.rank} of {len(self.ranks)}: r switches)"
        self.app.title = f"hookdbg  {printable(title)}"

    def on_mount(self) -> None:
        self._title()
        self._load_meta()
        self.steps = self.run.steps
        if self.steps:  # following a live run starts at its newest step, like tail -f
            self.step = self.steps[-1] if self.following else self.steps[0]
        roots = self.run.rec.modules.roots()
        if roots:
            self.module = roots[0].id
            self.query_one(ModuleTree).select_module(self.module)
        self.query_one(ModuleTree).focus()
        self._refresh_all()
        if self.other is not None:
            self.load_diff()
        self.set_interval(1.0, self._maybe_poll)

    def _load_meta(self) -> None:
        alerts = self.run.rec.alerts
        self.alert_steps = set(alerts["step"].tolist())
        self.known_alerts = len(alerts)
        notice = self.query_one("#notice", Static)
        status = self.run.status
        text = None
        if status is Status.CUT_SHORT:
            text = (
                "this recording was cut short (its process ended without closing it): "
                "showing everything that was flushed"
            )
        elif status is Status.LIVE and not self.following:
            text = "this recording is still being written: press F to follow it"
        notice.set_class(text is None, "hidden")
        if text:
            notice.update(Text(text))

    def _refresh_all(self) -> None:
        self._show_stepbar()
        if self.step is not None:
            self.load_step(self.step)
            if self.module is not None:
                self.load_detail(self.module, self.step)
        if self.module is not None:
            self.load_series(self.module, self.stat)

    def _show_stepbar(self) -> None:
        self.query_one(StepBar).show(
            self.steps, self.step if self.step is not None else -1, self.alert_steps, self.following
        )

    # -- workers: all file reads -----------------------------------------------------

    @work(thread=True, exclusive=True, group="step")
    def load_step(self, step: int) -> None:
        table = self.run.step_table(step)
        divergence = self.diff.divergence(step) if self.diff else None
        self.app.call_from_thread(self.query_one(ModuleTree).badge, table, divergence)

    @work(thread=True, exclusive=True, group="detail")
    def load_detail(self, module: int, step: int) -> None:
        detail = self.run.detail(module, step)
        other = divergent = None
        if self.other is not None:
            twin = self.other.rec.modules.by_name(detail.module.name)
            if twin is not None and step in self.other.steps:
                other = self.other.detail(twin.id, step)
            if self.diff is not None:
                divergent = self.diff.divergent_slots(detail.module.name, step)
        self.app.call_from_thread(self.query_one(DetailPane).show, detail, other, divergent)

    @work(thread=True, exclusive=True, group="series")
    def load_series(self, module: int, stat_index: int) -> None:
        stat = PLOT_STATS[stat_index]
        series = self.run.series(module, stat)
        name = self.run.rec.modules.name(module)
        other = None
        if self.other is not None:
            twin = self.other.rec.modules.by_name(name)
            if twin is not None:
                other = self.other.series(twin.id, stat)
        step = self.step if self.step is not None else -1
        self.app.call_from_thread(self.query_one(PlotPane).show, stat, name, series, step, other)

    @work(thread=True, group="diff")
    def load_diff(self) -> None:
        assert self.other is not None
        self.app.call_from_thread(self.notify, "comparing the two recordings...", timeout=2)
        diff = DiffView.compute(self.run, self.other)
        self.app.call_from_thread(self._diff_ready, diff)

    def _diff_ready(self, diff: DiffView) -> None:
        self.diff = diff
        self.app.clear_notifications()
        first = diff.first()
        if first is None:
            self.notify("the two recordings match within tolerance")
        else:
            self.notify(
                f"first divergence: {printable(first[0])} at step {first[1]} (f jumps there)",
                severity="warning",
                markup=False,
            )
        self._refresh_all()

    @work(thread=True, exclusive=True, group="poll")
    def poll(self) -> None:
        if self.run.refresh():
            self.app.call_from_thread(self._new_data)

    def _maybe_poll(self) -> None:
        if self.following:
            self.poll()

    def _new_data(self) -> None:
        at_end = not self.steps or self.step == self.steps[-1]
        self.steps = self.run.steps
        alerts = self.run.rec.alerts
        for row in alerts[self.known_alerts :]:
            self.notify(
                printable(row["message"]),
                title="new NaN/inf alert",
                severity="error",
                timeout=8,
                markup=False,
            )
        self._load_meta()
        if at_end and self.steps:  # like tail -f: stay on the newest step
            self.step = self.steps[-1]
        self._refresh_all()

    @work(thread=True)
    def run_search(self, query: Query, screen: SearchScreen) -> None:
        result = self.run.search(query)
        self.query_text = query.text
        self.app.call_from_thread(screen.show, query.text, result)

    # -- reacting to the user --------------------------------------------------------

    def on_module_tree_picked(self, message: ModuleTree.Picked) -> None:
        if message.module == self.module:
            return
        self.module = message.module
        if self.step is not None:
            self.load_detail(self.module, self.step)
        self.load_series(self.module, self.stat)

    def go_to(self, step: int | None = None, module: int | None = None) -> None:
        if step is not None and step in self.steps:
            self.step = step
        if module is not None:
            self.module = module
            self.query_one(ModuleTree).select_module(module)
        self._refresh_all()

    def action_step(self, delta: int) -> None:
        if self.step is None or not self.steps:
            return
        i = max(0, min(len(self.steps) - 1, self.steps.index(self.step) + delta))
        self.go_to(self.steps[i])

    def action_edge(self, index: int) -> None:
        if self.steps:
            self.go_to(self.steps[index])

    def action_next_stat(self) -> None:
        self.plot((self.stat + 1) % len(PLOT_STATS))

    def plot(self, stat: int) -> None:
        self.stat = stat
        if self.module is not None:
            self.load_series(self.module, self.stat)

    def action_profile(self) -> None:
        self._open_profile(self.step)

    @work(thread=True)
    def _open_profile(self, step: int | None) -> None:
        prof = self.run.profile(step)
        self.app.call_from_thread(self.app.push_screen, ProfileScreen(prof, step), self._jump)

    def action_alerts(self) -> None:
        self._open_alerts()

    @work(thread=True)
    def _open_alerts(self) -> None:
        reports = self.run.alerts()
        self.app.call_from_thread(self.app.push_screen, AlertsScreen(reports), self._jump)

    def action_search(self) -> None:
        screen = SearchScreen(self.run.rec.modules, self.query_text)
        self.app.push_screen(screen, lambda jump: self._found(screen, jump))

    def _found(self, screen: SearchScreen, jump: Jump) -> None:
        if screen.hits:  # n / N walk through them from here
            self.hits = screen.hits
            self.hit = self.hits.index(jump) if jump in self.hits else -1
        self._jump(jump)

    def action_hit(self, delta: int) -> None:
        if not self.hits:
            self.notify("no search hits: / searches", severity="warning")
            return
        self.hit = (self.hit + delta) % len(self.hits)
        module, step = self.hits[self.hit]
        self.go_to(step, module)

    def action_first(self) -> None:
        if self.other is not None:
            if self.diff is None:
                self.notify("still comparing the recordings...")
                return
            first = self.diff.first()
            if first is None:
                self.notify("no divergence: the recordings match")
                return
            module = self.run.rec.modules.by_name(first[0])
            self.go_to(first[1], module.id if module else None)
            return
        first_alerts = self.run.rec.alerts
        if not len(first_alerts):
            self.notify("no NaN/inf alerts in this recording")
            return
        self.go_to(int(first_alerts["step"][0]), int(first_alerts["module"][0]))

    def action_toggle_follow(self) -> None:
        self.following = not self.following
        if self.following and self.steps:
            self.go_to(self.steps[-1])
        self.notify(
            "following: new steps appear as they are written"
            if self.following
            else "stopped following"
        )
        self._load_meta()
        self._show_stepbar()

    def action_next_rank(self) -> None:
        if len(self.ranks) < 2:
            self.notify("one rank only: r switches ranks of a distributed run")
            return
        old = self.run
        self.run = self.ranks[(self.ranks.index(self.run) + 1) % len(self.ranks)]
        self._title()
        self._load_meta()
        self.steps = self.run.steps
        if self.step not in self.steps:
            self.step = self.steps[0] if self.steps else None
        if self.module is not None:  # the same module, by name, on the other rank
            twin = self.run.rec.modules.by_name(old.rec.modules.name(self.module))
            self.module = twin.id if twin is not None else None
        self._refresh_all()

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen())

    def _jump(self, jump: Jump) -> None:
        if jump is not None:
            module, step = jump
            self.go_to(step, module)
