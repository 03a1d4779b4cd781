"""The time tree (``t``): one step's calls as an icicle, as a flame graph draws them.

Each call is a bar as wide as its total (inclusive) time, under the call it ran in;
the step on top, then its forward, backward and optimizer sections. Bars are laid out
from the time alone (``layout``), so a bar's width is its share of its parent's, and
a label never shows a number cut short: it drops parts, then the number, until it
fits. The line under the bars says everything of the selected call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Static

from hookdbg.analysis.timetree import TimeNode, TimeTree
from hookdbg.store.schema import Phase
from hookdbg.text import printable

from .dialogs import Closing, leave
from .keybar import KeyBar
from .screens import Jump


@dataclass(frozen=True, eq=False)
class Bar:
    """Where a node is drawn: row ``depth``, cells ``x0`` to ``x1`` (not included)."""

    node: TimeNode
    depth: int
    x0: int
    x1: int
    parent: Bar | None
    nth: int  # among its parent's children: neighbours get two shades

    @property
    def width(self) -> int:
        return self.x1 - self.x0


def layout(tree: TimeTree, width: int, device: bool) -> list[list[Bar]]:
    """Rows of bars: the root spans ``width`` cells, and each node's children are packed
    left to right from their parent's start, each ``width * time / root time`` cells
    wide (edges rounded from the running sum, so that widths add up and children stay
    within their parent)."""
    whole = tree.root.time(device)
    scale = width / whole if whole > 0 else 0.0
    rows: list[list[Bar]] = []
    todo: list[tuple[TimeNode, int, float, Bar | None, int]] = [(tree.root, 0, 0.0, None, 0)]
    while todo:
        node, depth, start, parent, nth = todo.pop()
        end = start + node.time(device)
        x0, x1 = round(start * scale), round(end * scale)
        if parent is not None:
            x0, x1 = max(x0, parent.x0), min(max(x1, x0), parent.x1)
            x0 = min(x0, x1)
        bar = Bar(node, depth, x0, x1, parent, nth)
        while len(rows) <= depth:
            rows.append([])
        rows[depth].append(bar)
        offset, children = start, []
        for i, child in enumerate(node.children):
            children.append((child, depth + 1, offset, bar, i))
            offset += child.time(device)
        todo.extend(reversed(children))
    for row in rows:
        row.sort(key=lambda b: (b.x0, b.x1))
    return rows


def duration(seconds: float) -> str:
    """``23.4ms``, ``87µs``, ``1.25s``: three digits at most, so labels stay short."""
    if math.isnan(seconds):
        return "-"
    if seconds >= 1:
        return f"{seconds:.3g}s"
    if seconds >= 1e-3:
        ms = seconds * 1e3
        return f"{ms:.0f}ms" if ms >= 99.95 else f"{ms:.3g}ms"
    return f"{seconds * 1e6:.0f}µs"


def short_name(node: TimeNode) -> str:
    """The last part of a module's name (``body.1`` for a Sequential's child)."""
    if node.module is None:
        return node.label
    parts = node.module.name.split(".")
    last = ".".join(parts[-2:]) if parts[-1].isdigit() and len(parts) > 1 else parts[-1]
    return printable(last)


def label_options(node: TimeNode, device: bool, root: bool = False) -> list[str]:
    """What a bar can say, longest first: name, total and self time; name and total;
    the total alone."""
    name, total, own = short_name(node), duration(node.time(device)), node.own(device)
    options = []
    if root:
        options.append(f"{name} {total} (outside modules {duration(own)})")
    elif node.module is not None and node.children:
        options.append(f"{name} {total} (self {duration(own)})")
    return [*options, f"{name} {total}", total]


def bar_label(node: TimeNode, width: int, device: bool, root: bool = False) -> str:
    """The longest label that fits ``width`` cells; else the name cut with ``…``
    (never a number cut short), or nothing."""
    for option in label_options(node, device, root):
        if cell_len(option) <= width:
            return option
    name = short_name(node)
    return name[: width - 1] + "…" if width >= 3 else ""


class TimeTreeView(Widget, can_focus=True):
    """The bars, a row per depth; the arrows move the selection, Enter goes to it."""

    COMPONENT_CLASSES = {
        "time-tree--step",
        "time-tree--fwd",
        "time-tree--fwd-alt",
        "time-tree--bwd",
        "time-tree--bwd-alt",
        "time-tree--opt",
        "time-tree--opt-alt",
        "time-tree--selected",
    }
    BINDINGS = [
        Binding("left,h", "move(-1)", "along the row", key_display="←→"),
        Binding("right,l", "move(1)", "along the row", show=False),
        Binding("up,k", "up", "caller / first call", key_display="↑↓"),
        Binding("down,j", "down", "first call", show=False),
    ]

    class Selected(Message):
        """The selection moved: the screen describes the new one."""

    selected: reactive[TimeNode | None] = reactive(None)
    device: reactive[bool] = reactive(False, layout=True)

    def __init__(self, tree: TimeTree, id: str | None = None) -> None:
        super().__init__(id=id)
        self.steptree = tree
        self.rows: list[list[Bar]] = []  # as last drawn
        self.set_reactive(TimeTreeView.device, tree.on_device)
        self.set_reactive(TimeTreeView.selected, tree.root)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return 1 + max((depth for _, depth in self.steptree.nodes()), default=0)

    def _style(self, name: str) -> str:
        return str(self.get_component_rich_style(f"time-tree--{name}", partial=True))

    def bars(self, width: int | None = None) -> list[list[Bar]]:
        return layout(self.steptree, width or max(self.size.width, 1), self.device)

    def render(self) -> Text:
        self.rows = self.bars()
        width = max(self.size.width, 1)
        lines = []
        for depth, row in enumerate(self.rows):
            line, at = Text(), 0
            for bar in row:
                chosen = bar.node is self.selected
                if bar.width <= 0 and not chosen:
                    continue
                x0 = min(bar.x0, width - 1) if bar.width <= 0 else bar.x0
                line.append(" " * max(x0 - at, 0))
                style = self._bar_style(bar, chosen)
                if bar.width <= 0:  # too short to draw: a mark where it would be
                    line.append("│", style)
                    at = x0 + 1
                    continue
                label = bar_label(bar.node, bar.width - 1, self.device, depth == 0)
                cells = (" " + label).ljust(bar.width)[: bar.width]
                line.append(cells, style)
                at = bar.x1
            lines.append(line)
        return Text("\n").join(lines)

    def _bar_style(self, bar: Bar, chosen: bool) -> str:
        if chosen:
            return self._style("selected")
        if bar.node.phase is None:
            return self._style("step")
        name = Phase(bar.node.phase).label
        return self._style(f"{name}-alt" if bar.nth % 2 else name)

    def _find(self, node: TimeNode | None) -> Bar | None:
        rows = self.rows or self.bars()
        return next((b for row in rows for b in row if b.node is node), None)

    def action_move(self, delta: int) -> None:
        bar = self._find(self.selected)
        if bar is None:
            return
        row = self.rows[bar.depth]
        i = row.index(bar) + delta
        if 0 <= i < len(row):
            self.selected = row[i].node

    def action_up(self) -> None:
        bar = self._find(self.selected)
        if bar is not None and bar.parent is not None:
            self.selected = bar.parent.node

    def action_down(self) -> None:
        if self.selected is not None and self.selected.children:
            self.selected = self.selected.children[0]

    def watch_selected(self) -> None:
        bar = self._find(self.selected)
        if bar is not None:
            self.scroll_visible()
            region = Region(0, bar.depth, 1, 1)
            self.call_after_refresh(self._show_row, region)
        self.refresh()
        self.post_message(self.Selected())

    def _show_row(self, region: Region) -> None:
        parent = self.parent
        if isinstance(parent, VerticalScroll):
            parent.scroll_to_region(region, animate=False)


def describe(tree: TimeTree, node: TimeNode) -> Text:
    """Everything of one bar, on two lines: a bar too narrow for its numbers has them here."""
    share = node.total / tree.root.total if tree.root.total > 0 else 0.0
    if node.module is not None:
        phase = ("forward", "backward", "optimizer step")[node.phase or 0]
        what = f"{printable(node.module.type)}, {phase}"
        if node.module.is_loss:
            what = f"the backward pass started at {printable(node.module.type)}"
        head = Text(f"{printable(node.module.name)}", style="bold")
        head.append(f"  {what}", style="dim")
    else:
        head = Text(node.label, style="bold")
    host = f"host: total {duration(node.total)}"
    if node.module is not None or node.phase is None:
        rest = "outside modules" if node.module is None else "self"
        host += f", {rest} {duration(node.self_time)}"
    host += f", {share:.1%} of {tree.label}"
    lines = Text("\n").join([head, Text(host)])
    if tree.on_device:
        if math.isnan(node.device_total):
            lines.append("\ndevice: not timed there", style="dim")
        else:
            lines.append(
                f"\ndevice: total {duration(node.device_total)}, self {duration(node.device_self)}"
            )
    return lines


class TimeTreeScreen(Closing, Screen[Jump | None]):
    """A step's time as an icicle; Enter goes to the selected module in the replay."""

    BINDINGS = [
        Binding("escape,t", "dismiss(None)", "back"),
        Binding("enter", "jump", "go to the module"),
        Binding("d", "toggle_device", "device / host", show=False),
    ]

    def __init__(self, tree: TimeTree) -> None:
        super().__init__()
        self.steptree = tree

    def compose(self) -> ComposeResult:
        yield Static(id="screen-title")
        with VerticalScroll(id="time-tree-scroll"):
            yield TimeTreeView(self.steptree, id="time-tree")
        yield Static(id="time-tree-info")
        yield KeyBar()

    def on_mount(self) -> None:
        self._title()
        self._info()
        self.query_one(TimeTreeView).focus()

    def _title(self) -> None:
        view = self.query_one(TimeTreeView)
        clock = "device" if view.device else "host"
        other = "host" if view.device else "device"
        title = Text(f"time tree of {self.steptree.label}", style="bold")
        title.append(f": width = total time on the {clock}, children under their caller")
        toggle = f", d: {other} time" if self.steptree.on_device else ""
        title.append(f"   ←→ ↑↓ move, enter: go to the module{toggle}, esc: back", style="dim")
        self.query_one("#screen-title", Static).update(title)

    def _info(self) -> None:
        node = self.query_one(TimeTreeView).selected
        if node is not None:
            self.query_one("#time-tree-info", Static).update(describe(self.steptree, node))

    def on_time_tree_view_selected(self) -> None:
        self._info()

    def action_toggle_device(self) -> None:
        if not self.steptree.on_device:
            self.notify("this recording has no device times: its model ran on the CPU")
            return
        view = self.query_one(TimeTreeView)
        view.device = not view.device
        self._title()

    def action_jump(self) -> None:
        node = self.query_one(TimeTreeView).selected
        if node is None or node.module is None:
            self.notify("choose a module's bar (↓) to go to it")
        elif not node.module.is_model_part:
            what = "a loss site" if node.module.is_loss else "the optimizer"
            self.notify(f"{printable(node.module.name)} is {what}, not in the module tree")
        else:
            leave(self, Jump(node.module.id, self.steptree.step))
