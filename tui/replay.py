"""The main screen: step through a recording, module by module (two, side by side).

Its state (step, module, statistic, following, rank) lives in reactive attributes, and
their watchers start the thread workers that read the file. A worker posts its result
back as a message tagged with the state it was read for; a result whose tag is not the
screen's state any more is dropped. A thread cannot be stopped in the middle of a read,
so after fast key presses late results of earlier steps do arrive, and must not win.

The module is a little over 400 lines on purpose: the screen is the one owner of that
state, and splitting its actions into mixins would spread who changes it.
"""

from __future__ import annotations

import numpy as np
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.events import Resize
from textual.reactive import reactive
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Header, Static
from textual.worker import get_current_worker

from hookdbg.analysis.steer import SteerError, steer
from hookdbg.read import RankSet, RecordingError, Status
from hookdbg.store.schema import slot_label
from hookdbg.text import plural, printable, utf8

from .detail import DetailPane, DetailTable
from .dialogs import GotoStepScreen, HelpScreen, RecordStepsScreen
from .editor import edit, source_problem
from .keybar import KeyBar, replay_keys
from .messages import DetailLoaded, DiffReady, Goto, NewData, SeriesLoaded, StepLoaded
from .model import (
    PLOT_STATS,
    Curve,
    DiffView,
    RunView,
    alerts_notice,
    first_origin,
    nearest_step,
    ranked_alerts,
    status_notice,
)
from .plot import PlotPane
from .profile import ProfileScreen
from .screens import AlertsScreen, Jump
from .search import SearchScreen
from .statstack import StatStack
from .stepbar import StepBar
from .timetree import TimeTreeScreen
from .tree import ONLY_B, ModuleTree


class ReplayScreen(Screen[None]):
    BINDINGS = [
        Binding("left", "step(-1)", "step", priority=True, key_display="←→"),
        Binding("right", "step(1)", "step →", priority=True, show=False),
        Binding("home", "edge(0)", "first step", show=False, priority=True),
        # across the tensor table's columns from anywhere, the tree's focus too (the
        # Tree's own shift+arrows move its selection)
        Binding("shift+left", "column(-1)", "column ←", show=False, priority=True),
        Binding("shift+right", "column(1)", "column →", show=False, priority=True),
        Binding("end", "edge(-1)", "last step", show=False, priority=True),
        Binding("question_mark", "help", "help"),
        Binding("q", "app.quit", "quit"),
        # the footer shows what fits, in this order: NaN hunting first
        Binding("a", "alerts", "alerts"),
        Binding("slash", "search", "search"),
        Binding("f", "first", "first"),
        Binding("p", "profile", "profile"),
        Binding("t", "time_tree", "time tree"),
        Binding("s", "next_stat(1)", "plot"),
        Binding("S", "next_stat(-1)", "previous plot", show=False),
        Binding("L", "loss", "loss", show=False),
        Binding("m", "stack", "stats", show=False),
        Binding("g,colon", "goto", "go to step"),
        Binding("o", "source", "source"),
        # steps ten and a hundred at a time: PgUp/PgDn page the focused tree or table,
        # as in lazygit, k9s and htop
        Binding("left_square_bracket", "step(-10)", "10 steps", key_display="[ ]"),
        Binding("right_square_bracket", "step(10)", "10 steps on", show=False),
        Binding("left_curly_bracket", "step(-100)", "100 steps back", show=False),
        Binding("right_curly_bracket", "step(100)", "100 steps on", show=False),
        Binding("n", "hit(1)", "next match", show=False),
        Binding("N", "hit(-1)", "previous match", show=False),
        Binding("F", "toggle_follow", "follow", show=False),
        Binding("r", "next_rank", "rank", show=False),
        Binding("G", "toggle_global", "global", show=False),
        Binding("R", "record_next", "record next steps", show=False),
        Binding("y", "copy", "copy", show=False),
        Binding("e", "toggle_evals", "eval batches", show=False),
        Binding("z", "zoom", "zoom", show=False),
        Binding("greater_than_sign", "tree_width(4)", "wider tree", show=False),
        Binding("less_than_sign", "tree_width(-4)", "narrower tree", show=False),
    ]
    # a zoomed pane keeps the step bar and the keys in view
    ALLOW_IN_MAXIMIZED_VIEW = "KeyBar, StepBar"

    step: reactive[int | None] = reactive(None, init=False)
    module: reactive[int | None] = reactive(None, init=False)
    stat: reactive[int] = reactive(0, init=False)
    following: reactive[bool] = reactive(False, init=False)
    rank: reactive[int] = reactive(0, init=False)  # index into ranks
    # a distributed run's DTensor rows as their global tensors, merged from the shards
    merged: reactive[bool] = reactive(False, init=False)
    evals: reactive[bool] = reactive(False, init=False)  # eval batches instead of steps
    loss_site: reactive[int] = reactive(0, init=False)  # which loss site the plot shows

    def __init__(
        self,
        run: RunView,
        other: RunView | None = None,
        follow: bool = False,
        ranks: list[RunView] | None = None,
    ) -> None:
        super().__init__()
        self.ranks = ranks or [run]  # a distributed run: one view per rank, r switches
        self.other = other
        self.diff: DiffView | None = None
        self.steps: list[int] = []
        self.hits: tuple[tuple[int, int], ...] = ()
        self.hit = -1
        self.query_text = ""
        self.search_history: list[str] = []  # the queries searched, oldest first (↑ in /)
        self.known_alerts = 0
        self.known_answers = 0  # the recorder's answers to steering commands, seen
        self._start_following = follow
        self._moved = False  # the user went somewhere before the comparison was ready
        self._stat_picked = False  # the user chose what the plot shows
        self._diff_notes: list[str] = []  # what comparing the runs left out
        self._tree_width: int | None = None  # cells, once > or < set it
        self._opening = ""  # what the screen opened on, said until the user moves

    @property
    def run(self) -> RunView:
        return self.ranks[self.rank]

    # -- layout ----------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="notice", classes="hidden")
        with Horizontal(id="main"):
            yield ModuleTree(self.run.rec.modules, id="tree")
            with Vertical(id="right"):
                yield DetailPane(id="detail")
                yield PlotPane(id="plot")
                yield StatStack(id="stats", classes="hidden")
        yield StepBar(id="stepbar")
        yield KeyBar(id="keys")

    def _steps_of(self, view: RunView) -> list[int]:
        return view.eval_steps if self.evals else view.steps

    def _shown_steps(self) -> list[int]:
        """The steps to move through: comparing two runs, those of either (a step one
        run lacks shows the other's rows alone)."""
        steps = self._steps_of(self.run)
        if self.other is None or self.evals:
            return steps
        return sorted(set(steps) | set(self.other.steps))

    def on_mount(self) -> None:
        self._title()
        # the plot opens on the loss over the run; a recording without one, on outputs
        self.set_reactive(ReplayScreen.stat, 0 if len(self.run.rec.losses) else 1)
        self.steps = self._shown_steps()
        self.known_alerts = len(self.run.rec.alerts)
        self.known_answers = len(self.run.rec.answers)
        self._show_steps()
        tree = self.query_one(ModuleTree)
        tree.focus()
        self.following = self._start_following
        if self.steps:  # following a live run starts at its newest step, like tail -f
            self.step = self.steps[-1] if self.following else self.steps[0]
        self.module = tree.first_module
        self._notice()
        if self.other is None and not self.following:
            self._open_on_origin()  # as a comparison opens on the first divergence
        else:
            self._announce_alerts()
        if self.other is not None:
            self.load_diff()
        self._refresh_keys()
        self.set_interval(1.0, self._poll_tick)

    def on_resize(self, event: Resize) -> None:
        self.set_class(event.size.width < 120, "narrow")  # hookdbg.tcss: less chrome
        # a short screen's notice is one line: three took the tensor table's rows away
        self.set_class(event.size.height < 30, "short")
        self._notice()

    def _title(self) -> None:
        title = self.run.name if self.other is None else f"{self.run.name}  vs  {self.other.name}"
        if len(self.ranks) > 1:
            title += f"  (rank {self.run.rec.info.rank} of {len(self.ranks)}: r switches)"
        self.app.title = f"hookdbg  {printable(title)}"

    def _notice(self) -> None:
        """The notice line: where the screen opened and why (until the user moves),
        what is odd about the recording, and what comparing two left out (steps or
        modules one run lacks). A line at the top, rather than a toast over the plot
        and the step bar."""
        lines = [self._opening, status_notice(self.run, self.following), *self._diff_notes]
        text = ("; " if self.has_class("short") else "\n").join(line for line in lines if line)
        notice = self.query_one("#notice", Static)
        notice.set_class(not text, "hidden")
        notice.update(Text(text))

    def _say_opening(self, text: str) -> None:
        """What the screen opened on, said in the notice line until the user moves."""
        self._opening = text
        self._notice()

    def _announce_alerts(self, opened_on: str = "") -> None:
        text = alerts_notice(self.ranks)
        if text:
            self._say_opening(text + opened_on)

    def _open_on_origin(self) -> None:
        """A run where a NaN/inf was born opens where the first one was, and says so."""
        if first_origin(self.ranks) is None:
            self._announce_alerts()
            return
        self.action_first()
        if self.module is None or self.step is None:  # no step recorded yet
            self._announce_alerts()
            return
        name = printable(self.run.rec.modules.name(self.module))
        unit = "eval batch" if self.evals else "step"
        # as the tree's origin mark says it: a NaN/inf that came in (the data's, another
        # rank's) was not born in the module
        origin = self.run.step_table(self.step, self.evals).get(self.module)
        came = origin.origin_from if origin is not None else ""
        where = f"came in from {came}" if came else "was born"
        self._announce_alerts(f"; opened where the first {where}: {name}, {unit} {self.step}")

    def _show_steps(self) -> None:
        bar = self.query_one(StepBar)
        bar.unit = "eval batch" if self.evals else "step"
        bar.steps = tuple(self.steps)
        alerts = self.run.rec.alerts
        if self.evals:
            marked = np.flatnonzero(np.isin(self.run.rec.evals["segment"], alerts["segment"]))
        else:
            marked = alerts["step"][~self.run.rec.is_eval(alerts["segment"])]
        bar.alert_steps = frozenset(int(s) for s in marked)
        bar.skipped_steps = frozenset() if self.evals else self.run.skipped_steps()
        bar.other_unit = (
            plural(len(self.run.rec.evals), "eval batch", "eval batches") + " (e)"
            if len(self.run.rec.evals) and not self.evals
            else ("training steps (e)" if self.evals else "")
        )

    # -- state: each change starts the reads it needs ---------------------------------

    def watch_step(self, step: int | None) -> None:
        self.query_one(StepBar).current = step
        self.query_one(PlotPane).current = step
        self.query_one(StatStack).current = step
        self._load_step()
        self._load_detail()

    def watch_module(self, module: int | None) -> None:
        if module is not None:
            self.query_one(ModuleTree).select_module(module)
        self._load_detail()
        self._load_series()

    def watch_stat(self) -> None:
        self._load_series()

    def watch_loss_site(self) -> None:
        self._load_series()

    def watch_following(self, following: bool) -> None:
        if following:
            self.query_one(StepBar).live = "● following"
        elif "follow" in self.query_one(StepBar).live:
            self.query_one(StepBar).live = ""
        if following and self.steps:
            self.step = self.steps[-1]
        self._notice()
        self._refresh_keys()

    def watch_evals(self, evals: bool) -> None:
        self.steps = self._shown_steps()
        self._show_steps()
        self.step = self.steps[0] if self.steps else None
        self.query_one(StepBar).current = self.step
        self._load_step()  # also when the number did not change: it is another batch
        self._load_detail()
        self._load_series()
        self._refresh_keys()

    def validate_rank(self, rank: int) -> int:
        """A rank is shown once its file is checked whole (``hookdbg tui`` checked the
        first; the views read every table): a damaged one is refused with its reason,
        and the rank shown stays."""
        if rank != self.rank and not self._checked(rank):
            return self.rank
        return rank

    def _checked(self, *ranks: int) -> bool:
        """Check these ranks' files whole (once each); say why if one is damaged."""
        for rank in ranks:
            try:
                self.ranks[rank].rec.check()
            except RecordingError as exc:
                self.notify(str(exc), severity="error", markup=False)  # thread-safe
                return False
        return True

    def watch_rank(self, old: int, new: int) -> None:
        self._title()
        self._refresh_keys()
        self.steps = self._shown_steps()
        self._show_steps()
        self._notice()
        if self.step not in self.steps:
            self.step = self.steps[0] if self.steps else None
        if self.module is not None and self.module < ONLY_B:  # the same module, by name
            twin = self.run.rec.modules.by_name(self.ranks[old].rec.modules.name(self.module))
            self.module = twin.id if twin is not None else None
        self._load_step()
        self._load_detail()
        self._load_series()

    def _compared(self) -> bool:
        return self.diff is not None

    def _load_step(self) -> None:
        if self.step is not None:
            self.load_step(self.rank, self.step, self.evals, self._compared())

    def _load_detail(self) -> None:
        if self.step is not None and self.module is not None:
            self.load_detail(
                self.rank, self.step, self.evals, self.module, self._compared(), self.merged
            )

    def _load_series(self) -> None:
        if self.module is not None:
            self.load_series(self.rank, self.module, self.evals, self.stat, self.loss_site)
            if self.query_one(StatStack).display:
                view, module = self.run, self.module
                if module >= ONLY_B and self.other is not None:  # only run b has it
                    view, module = self.other, module - ONLY_B
                self.query_one(StatStack).load(view, module, self.evals)

    # -- workers: all file reads -----------------------------------------------------

    @work(thread=True, exclusive=True, group="step")
    def load_step(self, rank: int, step: int, evals: bool, compared: bool) -> None:
        table = self.ranks[rank].step_table(step, evals)
        divergence = self.diff.divergence(step) if self.diff and compared and not evals else None
        self.post_message(StepLoaded((rank, step, evals, compared), table, divergence))

    def on_step_loaded(self, message: StepLoaded) -> None:
        if message.key == (self.rank, self.step, self.evals, self._compared()):
            skipped = self.step in self.query_one(StepBar).skipped_steps
            self.query_one(ModuleTree).badge(message.table, message.divergence, skipped)
            self._explain()

    def _explain(self) -> None:
        """Say in the detail pane what the tree's marks on the module mean (for a loss
        site, which the tree does not show, what its alerts say)."""
        if self.module is not None:
            said = self.query_one(ModuleTree).explain(self.module)
            self.query_one(DetailPane).explain(said or self._alerts_of(self.module))

    def _alerts_of(self, module: int) -> Text | None:
        """What the alerts raised at ``module`` in the current step say."""
        alerts = self.run.rec.alerts
        if self.evals or not len(alerts):
            return None
        here = alerts[(alerts["module"] == module) & (alerts["step"] == self.step)]
        if not len(here):
            return None
        return Text("\n").join(Text(f"◆ {printable(utf8(a['message']))}") for a in here)

    @work(thread=True, exclusive=True, group="detail")
    def load_detail(
        self, rank: int, step: int, evals: bool, module: int, compared: bool, merged: bool
    ) -> None:
        run = self.ranks[rank]
        key = (rank, step, evals, module, compared, merged)
        if module >= ONLY_B and self.other is not None:  # a module only run b has
            b = self.other.detail(module - ONLY_B, step, evals)
            self.post_message(DetailLoaded(key, b, None, None, run="b"))
            return
        detail = run.detail(module, step, evals, self._rank_set() if merged else None)
        other = pairs = None
        if self.other is not None:
            twin = self.other.rec.modules.by_name(detail.module.name)
            if twin is not None and step in self._steps_of(self.other):
                other = self.other.detail(twin.id, step, evals)
            if other is not None and self.diff is not None and compared and not evals:
                pairs = self.diff.pair_rows(detail, other)
        self.post_message(DetailLoaded(key, detail, other, pairs))

    def on_detail_loaded(self, message: DetailLoaded) -> None:
        now = (self.rank, self.step, self.evals, self.module, self._compared(), self.merged)
        if message.key == now:
            pane = self.query_one(DetailPane)
            pane.show(message.detail, message.other, message.pairs, message.run)
            self._explain()

    @work(thread=True, exclusive=True, group="series")
    def load_series(self, rank: int, module: int, evals: bool, stat_index: int, site: int) -> None:
        run, stat = self.ranks[rank], PLOT_STATS[stat_index]
        key = (rank, module, evals, stat_index, site)
        if module >= ONLY_B and self.other is not None:  # only run b has it: b's alone
            b, path = module - ONLY_B, self.other.plotted_path(module - ONLY_B, stat)
            name = run.loss_label(site) if stat.of_run else self.other.rec.modules.name(b)
            mine = self.other.curve(b, stat, evals, path, site)
            none = Curve(mine.steps[:0], mine.values[:0], mine.bad[:0])
            self.post_message(SeriesLoaded(key, stat, name, none, mine))
            return
        path = None if stat.of_run else run.plotted_path(module, stat)
        curve = run.curve(module, stat, evals, path, site)
        name = run.loss_label(site) if stat.of_run else run.rec.modules.name(module)
        other = None
        if self.other is not None:
            twin = self.other.rec.modules.by_name(name)
            if stat.of_run:
                other = self.other.curve(module, stat, evals, site=site)
            elif twin is not None:  # the same tensor of the same module
                other = self.other.curve(twin.id, stat, evals, path)
        # say which tensor, where the module returned several (a parameter's statistic
        # names its tensor in its own label)
        tensor = ""
        if stat.slot is not None and stat.path is None and path:
            tensor = slot_label(stat.slot, path)
        self.post_message(SeriesLoaded(key, stat, name, curve, other, tensor))

    def on_series_loaded(self, message: SeriesLoaded) -> None:
        if message.key == (self.rank, self.module, self.evals, self.stat, self.loss_site):
            self.query_one(PlotPane).show(
                message.stat, message.module, message.curve, message.other, message.tensor
            )

    @work(thread=True, group="diff")
    def load_diff(self) -> None:
        assert self.other is not None
        self.app.call_from_thread(self._say_opening, "comparing the two recordings...")
        self.post_message(DiffReady(DiffView.compute(self.run, self.other)))

    def on_diff_ready(self, message: DiffReady) -> None:
        self.diff = message.diff
        first = self.diff.first()
        tree = self.query_one(ModuleTree)
        tree.mark_first_divergence(*(first or (None, None)))
        if self.other is not None:  # what only b has can be browsed too
            found = (self.other.rec.modules.by_name(n) for n in self.diff.result.only_b)
            tree.add_only_in_b([m for m in found if m is not None and m.is_model_part])
        self._diff_notes = self.diff.notes()
        if first is not None and not self._moved:  # at once, unless the user moved on
            self.action_first()
            self._moved = False
        if first is None:
            said = self.diff.verdict()
        else:
            said = (
                f"first divergence: {printable(first[0])} at step {first[1]} "
                "(★ in the tree; f jumps there)"
            )
        self._say_opening(said)
        self._refresh_keys()
        self._load_step()
        self._load_detail()

    @work(thread=True, exclusive=True, group="poll")
    def poll(self) -> None:
        grew = [view.refresh() for view in self.ranks]
        if any(grew) or self.run.status is not Status.LIVE:
            self.post_message(NewData(self.rank))

    def _poll_tick(self) -> None:
        if self.following:
            self.poll()

    def on_new_data(self, message: NewData) -> None:
        if not self.following or message.rank != self.rank:
            return
        at_end = not self.steps or self.step == self.steps[-1]
        self.steps = self._shown_steps()
        self._show_steps()
        alerts = self.run.rec.alerts
        for row in alerts[self.known_alerts :]:
            self.notify(
                printable(row["message"]),
                title="new NaN/inf alert",
                severity="error",
                timeout=8,
                markup=False,
            )
        self.known_alerts = len(alerts)
        for _, seq, answer in self.run.rec.answers[self.known_answers :]:
            self.notify(answer, title=f"the recorder, to command {seq}", markup=False)
        self.known_answers = len(self.run.rec.answers)
        self._new_modules()
        self._refresh_keys()
        ended = self.run.ended()
        if ended is not None or self.run.status is Status.CUT_SHORT:
            self.following = False
            self.query_one(StepBar).live = ended or "recording cut short"
            self.notify(ended or "the recording process ended without closing it")
        if at_end and self.steps and self.step != self.steps[-1]:
            self.step = self.steps[-1]  # like tail -f: stay on the newest step
        else:  # the current step may have grown
            self._load_step()
            self._load_detail()
        self._load_series()

    def _new_modules(self) -> None:
        """Modules recorded since the tree was built: show them, and the first one if
        none was shown yet; the loss once there is one, unless the user picked a plot."""
        tree = self.query_one(ModuleTree)
        if not tree.update_modules(self.run.rec.modules):
            return
        if self.module is None:
            self.module = tree.first_module
        else:
            tree.select_module(self.module)
        if not self._stat_picked and self.stat != 0 and len(self.run.rec.losses):
            self.stat = 0

    # -- reacting to the user --------------------------------------------------------

    def on_module_tree_picked(self, message: ModuleTree.Picked) -> None:
        if message.module != self.module:
            self._moved = True
            if self._opening != "comparing the two recordings...":
                self._say_opening("")
            self.module = message.module
            if not self._stat_picked and PLOT_STATS[self.stat].of_run:
                self.plot_stat(1)  # the plot opens on the loss, then follows the tree

    def on_goto(self, message: Goto) -> None:
        self.go_to(message.step, message.module)

    def go_to(self, step: int | None = None, module: int | None = None) -> None:
        """Go to a step (the nearest recorded one) and/or a module."""
        self._moved = True
        if self._opening and self._opening != "comparing the two recordings...":
            self._say_opening("")  # the user has moved on from where the screen opened
        if step is not None and self.steps:
            self.step = nearest_step(self.steps, step)
            if self.step != step:
                self.notify(_not_there(step, self.step, self.steps, self._unit()))
            elif self.other is not None and not self.evals:
                self._say_if_one_run_only(self.step)
            if self.following and self.step != self.steps[-1]:
                self.following = False  # End or F goes back to the newest step
                self.notify("stopped following: End or F follows again", timeout=3)
        if module is not None:
            self.module = module

    def _unit(self) -> str:
        return "eval batch" if self.evals else "step"

    def _say_if_one_run_only(self, step: int) -> None:
        """Comparing two runs, a step only one of them recorded shows that one's rows."""
        assert self.other is not None
        in_a = step in self.run.rec.recorded_steps
        in_b = step in self.other.rec.recorded_steps
        if in_a != in_b:
            self.notify(f"step {step} was recorded in {'a' if in_a else 'b'} only", timeout=3)

    def action_step(self, delta: int) -> None:
        if self.step is None or not self.steps:
            return
        i = self.steps.index(self.step) if self.step in self.steps else 0
        self.go_to(self.steps[max(0, min(len(self.steps) - 1, i + delta))])

    def action_edge(self, index: int) -> None:
        if index == -1 and not self.following and self.run.status is Status.LIVE:
            self.following = True  # the newest step of a live run: follow it on
        elif self.steps:
            self.go_to(self.steps[index])

    def action_goto(self) -> None:
        if self.steps:
            self.app.push_screen(GotoStepScreen(self.steps[0], self.steps[-1]), self._goto_step)

    def _goto_step(self, step: int | None) -> None:
        if step is not None:
            self.go_to(step)

    def action_next_stat(self, delta: int) -> None:
        self.plot_stat((self.stat + delta) % len(PLOT_STATS))

    def action_loss(self) -> None:
        """The loss in the plot; pressed again, the next loss site's."""
        sites = self.run.loss_sites
        if PLOT_STATS[self.stat].of_run:
            if sites < 2:
                self.notify("one loss site: the script calls backward() in one place")
            self.loss_site = (self.loss_site + 1) % max(sites, 1)
        self.plot_stat(0)

    def action_stack(self) -> None:
        """The module's statistics stacked as sparklines in the plot's place, and back."""
        stack = self.query_one(StatStack)
        stack.set_class(stack.display, "hidden")
        self.query_one(PlotPane).set_class(stack.display, "hidden")
        self._load_series()

    def plot_stat(self, index: int) -> None:
        """Plot ``PLOT_STATS[index]`` (``s``, the command palette)."""
        self._stat_picked = True
        self.stat = index

    def action_profile(self) -> None:
        self._open_profile(self.step)

    @work(thread=True, exclusive=True, group="screens")
    def _open_profile(self, step: int | None) -> None:
        prof = self.run.profile(step)
        self._open_over(ProfileScreen(self._named_runs(), prof, step))

    def _named_runs(self) -> list[tuple[str, RunView]]:
        """The run shown, and the one compared with it, as the profile names them."""
        if self.other is not None:
            return [
                (f"run a ({self.run.name})", self.run),
                (f"run b ({self.other.name})", self.other),
            ]
        if len(self.ranks) > 1:
            return [(f"rank {self.run.rec.info.rank}", self.run)]
        return [("", self.run)]

    def _open_over(self, screen: Screen[Jump | None]) -> None:
        """Open a screen a worker made, from its thread: the last one asked for (``p``
        twice, or ``p`` then ``a``, opens one), and only over the replay (not over a
        screen the user opened meanwhile)."""
        if not get_current_worker().is_cancelled:
            self.app.call_from_thread(self._push_if_on_top, screen)

    def _push_if_on_top(self, screen: Screen[Jump | None]) -> None:
        if self.is_active:
            self.app.push_screen(screen, self._jump)

    def action_time_tree(self) -> None:
        if self.step is not None:
            self._open_time_tree(self.step, self.evals)

    @work(thread=True, exclusive=True, group="screens")
    def _open_time_tree(self, step: int, evals: bool) -> None:
        self._open_over(TimeTreeScreen(self.run.time_tree(step, evals)))

    def action_alerts(self) -> None:
        self._open_alerts()

    @work(thread=True, exclusive=True, group="screens")
    def _open_alerts(self) -> None:
        if not self._checked(*range(len(self.ranks))):  # the list reads every rank
            return
        self._open_over(
            AlertsScreen(
                ranked_alerts(self.ranks),
                [v.rec.info.rank for v in self.ranks],
                [v.rec for v in self.ranks],
            )
        )

    def action_search(self) -> None:
        screen = SearchScreen(self.run, self.query_text, self.search_history)
        self.app.push_screen(screen, self._found)

    def _found(self, jump: Jump | None) -> None:
        if jump is not None and jump.hits:  # n / N walk through them from here
            self.hits = jump.hits
            self.hit = self.hits.index((jump.module, jump.step))
            self._refresh_keys()
        self._jump(jump)

    def action_hit(self, delta: int) -> None:
        if not self.hits:
            self.notify("no search matches: / searches", severity="warning")
            return
        self.hit = (self.hit + delta) % len(self.hits)
        module, step = self.hits[self.hit]
        self.go_to(step, module)
        self.notify(f"match {self.hit + 1} of {len(self.hits)}", timeout=2)

    def action_first(self) -> None:
        if self.other is not None:
            self._first_divergence()
            return
        first = first_origin(self.ranks)
        if first is None:
            self.notify("no NaN/inf alerts in this recording")
            return
        rank, step, module = first
        if rank != self.rank:
            self.rank = rank
            if self.rank != rank:  # its file is damaged (said): its module ids are not these
                return
            self.notify(f"the first NaN/inf origin is on rank {self.run.rec.info.rank}")
        alert = self.run.first_alert()
        batch = self.run.eval_number(alert[0], alert[1]) if alert else None
        if (batch is not None) != self.evals:
            self.evals = batch is not None
            self.notify(
                f"the first NaN/inf origin is in eval batch {batch}"
                if batch is not None
                else "the first NaN/inf origin is in a training step"
            )
        self.go_to(step if batch is None else batch, module)

    def _first_divergence(self) -> None:
        if self.diff is None:
            self.notify("still comparing the recordings...")
            return
        first = self.diff.first()
        if first is None:
            self.notify(self.diff.verdict())
            return
        module = self.run.rec.modules.by_name(first[0])
        self.go_to(first[1], module.id if module else None)

    def action_toggle_follow(self) -> None:
        if not self.following and self.run.status is Status.COMPLETE:
            self.notify(f"nothing to follow: {self.run.ended() or 'recording finished'}")
            return
        self.following = not self.following
        self.notify(
            "following: new steps appear as they are written"
            if self.following
            else "stopped following"
        )

    def action_record_next(self) -> None:
        self._record_next_if_live()

    @work(thread=True, exclusive=True, group="steer")
    def _record_next_if_live(self) -> None:
        """A run not followed was last read when it opened: its last progress row looks
        old (silent, cut short) while the recorder writes on. Its tail read again first
        (following, the poll keeps it read)."""
        if not self.following:
            for view in self.ranks:
                view.refresh()
        self.app.call_from_thread(self._ask_steps)

    def _ask_steps(self) -> None:
        if self.run.status is not Status.LIVE:
            self.notify(
                f"this recording is not being written ({self.run.status.value}): "
                "R steers a live run"
            )
            return
        self.app.push_screen(RecordStepsScreen(), self._record_next)

    def _record_next(self, count: int | None) -> None:
        if count is None:
            return
        try:
            command = steer([view.rec for view in self.ranks], op="record", steps=count)
        except SteerError as exc:
            self.notify(str(exc), severity="error", markup=False)
            return
        self.notify(f"sent: {command.describe()}; the steps appear as they are written")
        self.following = True  # to show them, and the recorder's answer

    def _rank_set(self) -> RankSet:
        """The distributed run the ranks make up (their shards merge across it)."""
        recordings = {view.rec.info.rank: view.rec for view in self.ranks}
        return RankSet(self.ranks[0].rec.path, recordings)

    def action_toggle_global(self) -> None:
        if len(self.ranks) < 2:
            self.notify(
                "G merges the DTensor shards of a distributed run's ranks into global "
                "statistics; this recording is one rank"
            )
            return
        if not self.merged and not self._checked(*range(len(self.ranks))):
            return  # merging reads every rank's tensors
        self.merged = not self.merged
        self.notify(
            "global statistics: DTensor shards merged across the ranks"
            if self.merged
            else "each rank's own shard statistics"
        )

    def watch_merged(self) -> None:
        self._load_detail()
        self._refresh_keys()

    def action_next_rank(self) -> None:
        if len(self.ranks) < 2:
            self.notify("one rank only: r switches ranks of a distributed run")
            return
        self.rank = (self.rank + 1) % len(self.ranks)

    def action_copy(self) -> None:
        """Copy the table cell under the cursor, or the module's name (OSC 52: the
        terminal puts it on the clipboard if it allows programs to)."""
        text = None
        if isinstance(self.focused, DetailTable):
            text = self.query_one(DetailPane).selected_value()
        if text is None and self.module is not None:
            text = self.query_one(ModuleTree).module_of(self.module).name
        if text:
            self.app.copy_to_clipboard(text)
            self.notify(f"copied {printable(text)}", timeout=3, markup=False)

    def action_toggle_evals(self) -> None:
        if not self.evals and not len(self.run.rec.evals):
            self.notify("no eval batches in this recording: every batch was a training step")
            return
        self.evals = not self.evals
        self.notify(
            "eval batches: forward-only batches (validation, test), apart from the "
            "steps; e goes back"
            if self.evals
            else "training steps"
        )

    def action_source(self) -> None:
        """Open the module's forward in $EDITOR (``o``)."""
        if self.module is None:
            self.notify("no module selected", severity="warning")
            return
        modules, key = self.run.rec.modules, self.module
        if key >= ONLY_B and self.other is not None:  # a module only run b has
            modules, key = self.other.rec.modules, key - ONLY_B
        module = modules[key]
        problem = source_problem(module, modules)
        if problem is None:
            file, line = module.source or ("", 0)
            problem = edit(self.app, file, line)
            if problem is None:
                self.notify(f"{printable(file)}:{line}", title="opened", timeout=3, markup=False)
                return
        self.notify(problem, severity="warning", markup=False)

    def _refresh_keys(self) -> None:
        self.query_one(KeyBar).keys = replay_keys(self)

    def action_column(self, delta: int) -> None:
        """shift+←/→: the tensor table's cursor one column left or right."""
        table = self.query_one(DetailTable)
        if delta < 0:
            table.action_cursor_left()
        else:
            table.action_cursor_right()

    def action_zoom(self) -> None:
        """``z``: the focused pane (the tree, the tensor table, the plot) fills the
        screen; ``z`` or Esc gives it back its place."""
        if self.maximized is not None:
            self.minimize()
        elif self.focused is not None:
            self.maximize(self.focused)

    def action_tree_width(self, cells: int) -> None:
        """``>`` / ``<``: the tree pane wider or narrower, for long names and deep models."""
        tree = self.query_one(ModuleTree)
        most = max(self.size.width - 30, 16)
        self._tree_width = max(16, min(most, tree.outer_size.width + cells))
        tree.styles.width = self._tree_width
        tree.styles.min_width = 16

    def watch_maximized(self, maximized: Widget | None) -> None:
        """A zoomed tree fills the screen, whatever width ``>`` and ``<`` gave it; given
        its place back, it has that width again."""
        tree = self.query_one(ModuleTree)
        tree.styles.width = None if maximized is tree else self._tree_width
        self._refresh_keys()

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen())

    def _jump(self, jump: Jump | None) -> None:
        if jump is None:
            return
        if jump.rank is not None and jump.rank != self.rank:
            self.rank = jump.rank  # before the module: its id is that rank's
            if self.rank != jump.rank:  # its file is damaged (said)
                return
        self.go_to(jump.step, jump.module)


def _not_there(asked: int, shown: int, steps: list[int], unit: str) -> str:
    """Why a step asked for is not the one shown: past either end of the run, or not
    recorded between its steps."""
    if asked > steps[-1]:
        return f"the last recorded {unit} is {shown}: {asked} is past the end"
    if asked < steps[0]:
        return f"the first recorded {unit} is {shown}: {asked} is before it"
    return f"{unit} {asked} was not recorded: showing {unit} {shown}, the nearest"
