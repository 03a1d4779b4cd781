"""Small screens: help, go to step, record the next steps, and waiting for a recording
that does not exist yet."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TypeVar

from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Input, Markdown, Static
from textual.worker import get_current_worker

from hookdbg.read import RecordingError, open_run

from .keybar import KeyBar
from .messages import Opened

Result = TypeVar("Result")


def leave(screen: Screen[Result], result: Result | None = None) -> None:
    """Close ``screen`` with ``result``, once. Keys come faster than a screen closes: a
    second Enter (or Esc) queued behind the first finds it closed already, and must
    neither call its callback again nor pop the screen under it."""
    if screen.is_active:
        screen.dismiss(result)


class Closing:
    """A screen's ``dismiss`` action (its Esc binding) that closes it once (``leave``)."""

    async def action_dismiss(self, result: object = None) -> None:
        assert isinstance(self, Screen)
        leave(self, result)


KEYS = (
    ("← →", "previous / next recorded step"),
    ("[ ]  { }", "10 steps back / on; 100"),
    ("home end", "first / last step (end: follow a live recording again)"),
    ("g or :", "go to a step by number"),
    ("↑ ↓ (j k)", "move in the module tree"),
    ("h l", "fold / unfold (folded: to the parent; unfolded: into it); enter toggles"),
    ("pgup pgdn", "page the tree or the table (tree: also ctrl+b ctrl+f; ctrl+u ctrl+d half)"),
    ("tab", "between the tree, the tensor table and the plot"),
    ("z", "zoom the focused pane to the whole screen; z or esc gives it back its place"),
    ("< >", "a narrower / wider tree"),
    ("shift+← →", "across the table's columns"),
    ("s S", "plot the next / previous statistic over steps"),
    ("L", "plot the loss; again: the next loss site (backward() call)"),
    ("m", "the module's statistics as sparklines, and back to the plot"),
    ("t", "time tree of the step; in it: ↑ caller, ↓ first call, enter to a module"),
    ("", "(in the time tree) d: widths by device or host time"),
    ("o", "open the module's forward in $EDITOR (or $VISUAL) at its line"),
    ("p", "profile: the step's parts, then modules; enter goes to one, a all steps, s t c n"),
    ("", "sort; b: the other run's, when comparing two"),
    ("a", "NaN/inf alerts of every rank; enter jumps to one"),
    ("/", "search: its language listed, matches counted as you type, ↑ ↓ earlier queries"),
    ("n N", "next / previous module the search found"),
    ("f", "first divergence (two runs) or first NaN/inf origin (all ranks)"),
    ("e", "eval batches (validation, test) instead of training steps, and back"),
    ("r", "next rank of a distributed run"),
    ("G", "global statistics of sharded tensors (DTensor shards merged across ranks)"),
    ("F", "follow a recording still being written; stepping back stops"),
    ("R", "record the next N steps of a live run in full detail (hookdbg ctl)"),
    ("y", "copy the module's name, or the table cell (OSC 52)"),
    ("ctrl+p", "command palette; type a module's name to go to it"),
    ("?", "this help; q quits"),
)

NOTES = """\
A click on the step bar or a plot goes to that step. A run with a NaN/inf opens where
the first one was born (`f` comes back to it); two runs, on their first divergence.

**Search** uses the language of `hookdbg search`: `nan`, `inf`, `type:Conv2d`,
`layer3.*`, `phase:bwd`, `slot:grad`, `step:3:7`, `max>1e4`, `std<1e-6`, `!type:Dropout`;
the statistics a query names lead its table, and a query about modules only finds calls.

**Marks** in the tree, before a module's name: `◆NaN` a NaN/inf was born here
(`◆data`, `◆code`, `◆rank`: it came in from the data, from tensor code or from
another rank, as its alert says), `⚠3` three of its tensors hold NaN/inf passed on
(`3 skip`, dimmed, at a step AMP's GradScaler skipped: expected there), `≠fwd` it
differs from the other run in the forward pass (`≠bwd`: only its gradients differ,
which a divergence further on causes; `≠opt`: only its weights after the optimizer
step), `★first` the first divergence. A folded module shows what is marked inside it:
`◆…`, `★≠…`. What the selected module's marks mean, with how far it differs, is said
under the detail pane's title. On the right: `-inf ×N` for an attention mask's -inf
in its inputs (no alarm), `×N` calls, and at the edge a module's share of the step's
time, `Σ` for a container (its children's time included; `self` its own). A narrow
pane leaves out the type, then `self`, then cuts the name, never a number.

**Columns** of the tensor table: `zeros` the fraction of values that are 0, `sat` the
fraction at the tensor's min or max (saturated: a ReLU6 or a clamp at its cap; a
one-element tensor is all at both ends, 100%), `call` which call of a module called
more than once in the step (as `hookdbg show` numbers them).

**Two runs**: each tensor's row of run a is followed by run b's; the cells that
differ are highlighted (with the digits that tell them apart), their columns are
never left out of a narrow table, and the cursor starts on the first of them.

**Plots**: the plot opens on the loss and follows the tree once you move in it;
`×` marks the steps at which the tensor holds NaN/inf (as the table's nan/inf column
says), `▲` the current step; two runs are drawn in one plot on one scale, b's bar
beside a's. A module returning a dict or tuple is plotted by its first tensor
output (the title says which).

**Time tree** (`t`): the step on top, then forward, backward and optimizer, each call
under the one it ran in, as wide as its total time (the device's where it was timed
there; `d` switches); labels give total and self time, the line below all of the
selected call. `←→` along a row, `↑` the caller, `↓` its first call.
"""


def key_table() -> Table:
    """One line per key, so the list fits a 24-line terminal with little scrolling."""
    table = Table(box=None, show_header=False, padding=(0, 1), expand=True)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(ratio=1)
    for key, does in KEYS:
        table.add_row(key, does)
    return table


class HelpScreen(Closing, ModalScreen[None]):
    """Every key; scrolls when the terminal is small."""

    BINDINGS = [Binding("escape,question_mark,q", "dismiss(None)", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(Text("hookdbg tui: keys (↑/↓ scroll, esc closes)", style="bold"))
            yield Static(key_table(), id="help-keys")
            yield Markdown(NOTES)

    def on_mount(self) -> None:
        self.query_one("#help", VerticalScroll).focus()


class GotoStepScreen(Closing, ModalScreen[int | None]):
    """Type a step number; Enter goes to it (or to the nearest recorded step)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "cancel")]

    def __init__(self, first: int, last: int) -> None:
        super().__init__()
        self.first, self.last = first, last

    def compose(self) -> ComposeResult:
        with Vertical(id="goto"):
            yield Static(f"go to step ({self.first}-{self.last}), Enter goes, esc cancels")
            yield Input(id="goto-step", type="integer", placeholder=str(self.first))

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        leave(self, int(event.value) if event.value.strip().lstrip("-").isdigit() else None)


class RecordStepsScreen(Closing, ModalScreen[int | None]):
    """How many steps to record in full detail from the next one (``hookdbg ctl record``)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "cancel")]

    def compose(self) -> ComposeResult:
        with Vertical(id="goto"):
            yield Static(
                "record the next N steps at the recording's level (every rank from the "
                "same step); Enter sends, esc cancels"
            )
            yield Input("5", id="record-steps", type="integer")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        leave(self, int(event.value) if event.value.strip().lstrip("-").isdigit() else None)


class WaitScreen(Screen[None]):
    """``--follow`` on a recording that does not exist yet: wait for its recorder to
    create it, then follow it."""

    BINDINGS = [Binding("q", "app.quit", "quit")]

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def compose(self) -> ComposeResult:
        yield Static(Text(f"waiting for {self.path}…", style="bold"), id="waiting")
        yield Static(id="waiting-why")
        yield KeyBar()

    def on_mount(self) -> None:
        self.wait_for_it()

    @work(thread=True, exclusive=True)
    def wait_for_it(self) -> None:
        worker = get_current_worker()
        while not worker.is_cancelled:
            try:
                opened = open_run(self.path)
                try:
                    opened.check()  # every table it will show, before the app shows it
                except RecordingError:
                    opened.close()
                    raise
            except RecordingError as exc:
                if self.path.exists():  # there, but not readable yet: say why
                    self.app.call_from_thread(self._why, str(exc))
                time.sleep(0.5)
                continue
            self.post_message(Opened(opened))  # the app follows it
            return

    def _why(self, reason: str) -> None:
        self.query_one("#waiting-why", Static).update(Text(f"not readable yet: {reason}", "dim"))
