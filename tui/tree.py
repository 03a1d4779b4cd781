"""The module tree: the model hierarchy, with each module's badges in the current step.

Marks come first on a line, before the name, as a glyph and a short word (``★first``,
``≠fwd``, ``◆NaN``, ``⚠3``), so that a narrow tree still shows them; a folded branch
shows what is marked inside it (``◆…``). What a mark means, with its numbers, is said
in words under the detail pane's title (``explain``). The numbers stand on the right,
the time share at the pane's edge (a leaf's share of the step, a container's ``Σ``
total share, its children included); treeline.py fits a line to the pane without
cutting one.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Tree
from textual.widgets._tree import TOGGLE_STYLE
from textual.widgets.tree import TreeNode

from hookdbg.read.modules import Module, ModuleTable
from hookdbg.text import printable

from .model import Gap, ModuleStep
from .treeline import Number, TreeLine, fit, whole


def top_modules(modules: ModuleTable) -> list[Module]:
    """The modules the tree starts from: each model's root, and any module whose parent
    is not a module of the table (a recording written without root rows, as
    benchmarks/reader.py writes, would otherwise show nothing)."""
    parts = {m.id for m in modules if m.is_model_part}
    return [m for m in modules if m.is_model_part and (m.parent == m.id or m.parent not in parts)]


_OWN_FRAMES = 1000  # python's default limit: what the app needs besides a tree's depth


def _room_for(depth: int) -> None:
    """Textual walks the expanded branches of a tree recursively (``Tree._build``,
    expand all), a frame per level: room under the recursion limit for a model nested
    ``depth`` deep, as long as the app runs (the limit is only ever raised)."""
    wanted = _OWN_FRAMES + 2 * depth
    if sys.getrecursionlimit() < wanted:
        sys.setrecursionlimit(wanted)


Mark = tuple[str, str, str]  # ("◆NaN", its component class, what it means)
_GLYPHS = "★≠◆⚠"  # the order of a folded node's marks inside it
ONLY_B = 1 << 30  # the tree's ids of modules only run b has: ONLY_B + their id in b
# the origin mark's word where a NaN/inf came into a module (stepview.ModuleStep.origin_from)
_CAME_FROM = {"the data": "data", "tensor code": "code", "another rank": "rank"}


class ModuleTree(Tree[int]):
    """The model hierarchy; each module's badge shows its time share, NaN/inf and calls
    in the current step (and, comparing two runs, how far it diverges)."""

    COMPONENT_CLASSES = {
        "module-tree--share",
        "module-tree--calls",
        "module-tree--origin",
        "module-tree--nonfinite",
        "module-tree--muted",
        "module-tree--diverges",
        "module-tree--spill",
        "module-tree--first",
        "module-tree--only",
    }

    # vim's keys, as lazygit, k9s and htop users expect; PgUp/PgDn page (the Tree's own)
    BINDINGS = [
        Binding("j", "cursor_down", "down", show=False),
        Binding("k", "cursor_up", "up", show=False),
        Binding("h", "fold", "fold, or to the parent", show=False),
        Binding("l", "unfold", "unfold, or to the first child", show=False),
        Binding("pagedown", "page_down", "page", key_display="pgup pgdn", show=False),
        Binding("ctrl+f", "page_down", "page down", show=False),
        Binding("ctrl+b", "page_up", "page up", show=False),
        Binding("ctrl+d", "half_page(1)", "half a page down", show=False),
        Binding("ctrl+u", "half_page(-1)", "half a page up", show=False),
    ]

    @dataclass
    class Picked(Message):
        """The user moved the cursor to a module."""

        module: int

    def __init__(self, modules: ModuleTable, **kwargs: object) -> None:
        super().__init__("modules", **kwargs)  # type: ignore[arg-type]
        self.show_root = False
        self.guide_depth = 2
        self._module_table = modules
        self._node_of: dict[int, TreeNode[int]] = {}
        self._pending: int | None = None  # a module the cursor is on its way to
        self._badges: tuple[dict[int, ModuleStep], dict[str, Gap] | None] = ({}, None)
        self._skipped = False  # the step's optimizer step was skipped by AMP's GradScaler
        self._inside: dict[int, list[tuple[str, str]]] = {}  # marks below a node: its fold
        self._lines: dict[int, TreeLine] = {}  # each module's line, to fit to the pane
        self._only_b: dict[int, Module] = {}  # comparing two runs: b's modules a lacks
        self.first_divergence: str | None = None
        self._first_step: int | None = None  # the step of the first divergence
        self._add_modules()
        _room_for(max((m.depth for m in modules), default=0))

    def _add_modules(self) -> None:
        """Every module under its parent, each before its children. A loop, not
        recursion: a model may nest deeper than Python's recursion limit."""
        seen: set[int] = set()  # a parent cycle must not loop forever

        def add(parent: TreeNode[int], top: Module) -> None:
            todo = [(parent, top)]
            while todo:
                under, module = todo.pop()
                if module.id in seen:
                    continue
                seen.add(module.id)
                children = [
                    c
                    for c in self._module_table.children(module.id)
                    if c.is_model_part and c.id not in seen
                ]
                node = under.add(
                    printable(module.name),
                    data=module.id,
                    expand=module.depth < 2,
                    allow_expand=bool(children),
                )
                self._node_of[module.id] = node
                self._set_line(module.id, module, None, [])
                todo.extend((node, child) for child in reversed(children))

        for top in top_modules(self._module_table):
            add(self.root, top)
        for module in self._module_table:  # left out by a parent cycle: show them anyway
            if module.is_model_part:
                add(self.root, module)

    def update_modules(self, modules: ModuleTable) -> bool:
        """Rebuild the tree when a live recording's module table grew (a file opened
        before its first forward pass has none); True if it did. Tables only grow."""
        if len(modules) == len(self._module_table):
            return False
        self._module_table = modules
        self._node_of = {}
        self.clear()
        self._add_modules()
        only_b, self._only_b = list(self._only_b.values()), {}
        self.add_only_in_b(only_b)
        self.badge(*self._badges)
        return True

    @property
    def first_module(self) -> int | None:
        """The module on the tree's first line."""
        children = self.root.children
        return children[0].data if children else None

    def _style(self, name: str) -> str:
        return str(self.get_component_rich_style(f"module-tree--{name}", partial=True))

    def _marks(
        self, key: int, module: Module, step: ModuleStep | None, diverges: Gap | None
    ) -> list[Mark]:
        """(mark, component, what it means) of a module in the current step."""
        if key >= ONLY_B:
            return [("+b", "only", "only run b has this module: its rows are b's alone")]
        marks: list[Mark] = []
        if module.name == self.first_divergence:
            at = f" (at step {self._first_step})" if self._first_step is not None else ""
            marks.append(("★first", "first", f"the two runs' first divergence{at}"))
        if diverges is not None:  # forward first: backward gaps may be spill-over
            if diverges.fwd is not None:
                marks.append(("≠fwd", "diverges", f"forward differs from b {_by(diverges.fwd)}"))
            elif diverges.bwd is not None:
                why = f"only gradients differ {_by(diverges.bwd)}: spilled back from further on"
                marks.append(("≠bwd", "spill", why))
            elif diverges.opt is not None:
                why = f"only weights after the optimizer step differ {_by(diverges.opt)}"
                marks.append(("≠opt", "diverges", why))
        if step is None:
            return marks
        many = "tensor holds" if step.nonfinite == 1 else "tensors hold"
        if step.origin and step.origin_from:  # as its alert says: arrived, not made here
            word = _CAME_FROM.get(step.origin_from, "in")
            marks.append((f"◆{word}", "origin", f"NaN/inf came in from {step.origin_from}"))
        elif step.origin:
            marks.append(("◆NaN", "origin", "NaN/inf born here, from finite inputs"))
        elif step.nonfinite and self._skipped:  # the GradScaler's overflow: expected
            why = f"{step.nonfinite} {many} NaN/inf at a step AMP's GradScaler skipped"
            marks.append((f"{step.nonfinite} skip", "muted", f"{why} (expected under fp16)"))
        elif step.nonfinite:
            marks.append((f"⚠{step.nonfinite}", "nonfinite", f"{step.nonfinite} {many} NaN/inf"))
        return marks

    def _line(
        self, key: int, module: Module, step: ModuleStep | None, marks: list[Mark]
    ) -> TreeLine:
        """The parts of a module's line, as ``treeline.fit`` fits them to the pane."""
        shown = Text()
        for mark, component, _ in marks:
            shown.append(mark, style=self._style(component))
            shown.append(" ")
        name = module.name.rpartition(".")[2] if module.depth else module.name
        numbers: list[Number] = []

        def number(text: str, component: str, keep: int) -> None:
            numbers.append(Number(Text(text, self._style(component)), keep))

        if step is not None:
            if step.masked:  # an attention mask's -inf: no alarm
                number(f"-inf ×{step.masked}", "muted", 2)
            if step.calls > 1:
                number(f"×{step.calls}", "calls", 3)
            if self._node_of[key].children:  # a container: its children's time too
                if step.share >= 0.005:
                    number(f"self {step.share:.0%}", "calls", 1)
                if step.total_share >= 0.005:
                    number(f"Σ{step.total_share:.0%}", "share", 4)
            elif step.share >= 0.005:
                number(f"{step.share:.0%}", "share", 4)
        return TreeLine(
            shown,
            Text(printable(name), style="bold" if module.depth == 0 else ""),
            Text(printable(module.type), style="dim"),
            tuple(numbers),
        )

    def _set_line(
        self, key: int, module: Module, step: ModuleStep | None, marks: list[Mark]
    ) -> None:
        line = self._lines[key] = self._line(key, module, step, marks)
        self._node_of[key].set_label(whole(line))

    def module_of(self, key: int) -> Module:
        """The module a tree line is of: run a's, or one only run b has (``ONLY_B``)."""
        return self._only_b.get(key) or self._module_table[key]

    def add_only_in_b(self, modules: list[Module]) -> None:
        """Comparing two runs, the modules only run b has, each under its parent by
        name (``+b``), so that they can be browsed too; their ids are ``ONLY_B`` plus
        their id in b."""
        by_name = {m.name: ONLY_B + m.id for m in modules}
        for module in sorted(modules, key=lambda m: m.name.count(".")):
            key = ONLY_B + module.id
            if key in self._node_of:
                continue
            parent_name = module.name.rpartition(".")[0]
            parent = self._module_table.by_name(parent_name) if parent_name else None
            under = self._node_of.get(parent.id if parent else by_name.get(parent_name, -1))
            under = under or self.root
            if under is not self.root:
                under.allow_expand = True
            self._only_b[key] = module
            self._node_of[key] = under.add(printable(module.name), data=key, allow_expand=False)
            self._set_line(key, module, None, self._marks(key, module, None, None))
        self.badge(*self._badges)

    def badge(
        self,
        steps: dict[int, ModuleStep],
        divergence: dict[str, Gap] | None,
        skipped: bool | None = None,
    ) -> None:
        """Each module's badges in a step; ``skipped``: the GradScaler skipped its
        optimizer step, so non-finite gradients are expected there (None: as before)."""
        self._badges = (steps, divergence)
        if skipped is not None:
            self._skipped = skipped
        marks = {
            key: self._marks(
                key,
                self.module_of(key),
                steps.get(key),
                divergence.get(self.module_of(key).name) if divergence else None,
            )
            for key in self._node_of
        }
        # what is marked inside each branch, children before parents (each node was
        # added after its parent): a glyph's forward divergence wins over spill-over;
        # muted marks (a skipped step's counts) are no alarm and stay on their module
        inside: dict[int, dict[str, str]] = {}
        for module_id, node in reversed(self._node_of.items()):
            parent = node.parent
            if parent is None or parent.data is None:
                continue
            found = inside.setdefault(parent.data, {})
            below = [(m[0], c) for m, c, _ in marks[module_id] if m[0] in _GLYPHS]
            for glyph, component in [*below, *inside.get(module_id, {}).items()]:
                if found.get(glyph) in (None, "spill"):
                    found[glyph] = component
        self._inside = {
            module_id: sorted(found.items(), key=lambda kv: _GLYPHS.index(kv[0]))
            for module_id, found in inside.items()
            if found
        }
        for key in self._node_of:
            self._set_line(key, self.module_of(key), steps.get(key), marks[key])

    def mark_first_divergence(self, name: str | None, step: int | None = None) -> None:
        """Mark where two runs first diverge: ``name``'s module, at ``step``."""
        self.first_divergence = name
        self._first_step = step
        self.badge(*self._badges)

    def render_label(self, node: TreeNode[int], base_style: Style, style: Style) -> Text:
        """A module's line fitted to the pane (``treeline.fit``); a folded node's also
        shows what is marked below it, after its own marks: ``◆…``, ``★◆…``."""
        module = node.data
        line = self._lines.get(module) if module is not None else None
        if line is None:
            return super().render_label(node, base_style, style)
        inside = self._inside.get(module) if module is not None else None
        if inside and not node.is_expanded and node.allow_expand:
            folded = line.marks.copy()
            for glyph, component in inside:
                folded.append(glyph, style=self._style(component))
            folded.append("… ", style=self._style(inside[0][1]))
            line = dataclasses.replace(line, marks=folded)
        icon = ""
        if node.allow_expand:
            icon = self.ICON_NODE_EXPANDED if node.is_expanded else self.ICON_NODE
        room = self.scrollable_content_region.width - self._guides(node) - cell_len(icon)
        label = fit(line, room) if self.scrollable_content_region.width else whole(line)
        label.stylize(style)
        return Text.assemble((icon, base_style + TOGGLE_STYLE), label)

    def _guides(self, node: TreeNode[int]) -> int:
        """Cells of the guides left of a node's label (Textual's, without the root)."""
        depth, parent = 0, node.parent
        while parent is not None and parent is not self.root:
            depth, parent = depth + 1, parent.parent
        return depth * self.guide_depth

    def watch_show_vertical_scrollbar(self) -> None:
        """The labels fit the width left beside the scrollbar, or without it."""
        self._invalidate()

    def explain(self, module: int) -> Text | None:
        """The marks of a module in the current step, in words (None without any)."""
        if module not in self._node_of:
            return None
        found = self.module_of(module)
        steps, divergence = self._badges
        diverges = divergence.get(found.name) if divergence else None
        said = Text()
        for mark, component, why in self._marks(module, found, steps.get(module), diverges):
            said.append("   " if said else "")
            said.append(mark, style=self._style(component))
            said.append(f" {why}")
        return said or None

    def select_module(self, module: int) -> None:
        """Unfold the branch down to a module and put the cursor on it.

        The cursor can only move once the unfolded branch has lines, so it moves after
        the next refresh; until then highlight events of other lines (the tree keeps its
        old cursor node while it rebuilds) are not reported as the user's pick."""
        node = self._node_of.get(module)
        if node is None:
            return
        parent = node.parent
        while parent is not None:
            if not parent.is_expanded and parent is not self.root:
                parent.expand()
            parent = parent.parent
        if self.cursor_node is node and self._pending is None:
            self.scroll_to_node(node, animate=False)
            return
        self._pending = module
        self.call_after_refresh(self._land, node)

    def _land(self, node: TreeNode[int]) -> None:
        if self._pending != node.data:
            return  # a newer selection is on its way
        before = self.cursor_line
        _ = self.last_line  # builds the lines of the unfolded branch, if not yet built
        self.move_cursor(node)
        self.scroll_to_node(node, animate=False)
        if self.cursor_line == before:
            self._pending = None  # no highlight event will come

    def action_fold(self) -> None:
        """Fold the branch under the cursor; on a folded one or a leaf, go to its parent."""
        node = self.cursor_node
        if node is None:
            return
        if node.is_expanded and node.children:
            node.collapse()
        elif node.parent is not None and node.parent is not self.root:
            self.move_cursor(node.parent)

    def action_unfold(self) -> None:
        """Unfold the branch under the cursor; on an unfolded one, go to its first child."""
        node = self.cursor_node
        if node is None or not node.allow_expand:
            return
        if not node.is_expanded:
            node.expand()
        elif node.children:
            self.move_cursor(node.children[0])

    def action_half_page(self, direction: int) -> None:
        """Half a page down (1) or up (-1), as ctrl+d / ctrl+u do in vim and less."""
        lines = max(1, self.scrollable_content_region.height // 2)
        self.cursor_line = max(0, min(self.last_line, self.cursor_line + direction * lines))
        self.scroll_to_line(self.cursor_line, animate=False)

    def label_of(self, module: int) -> str:
        return str(self._node_of[module].label)

    def line_of(self, module: int) -> str:
        """A module's line as drawn (a folded node's marks inside it too)."""
        return self.render_label(self._node_of[module], Style(), Style()).plain

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[int]) -> None:
        event.stop()
        module = event.node.data
        if module is None:
            return
        if self._pending is not None:
            if module == self._pending:
                self._pending = None
            return  # the screen chose this module itself
        self.post_message(self.Picked(module))


def _by(rel: float) -> str:
    if math.isinf(rel):
        return "in shape, dtype or NaN/inf count"
    return f"by up to {rel:.1e}"
