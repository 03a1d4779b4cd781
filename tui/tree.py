"""The module tree: the model hierarchy, with each module's badges in the current step."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from hookdbg.read.modules import Module, ModuleTable
from hookdbg.text import printable

from .model import Gap, ModuleStep


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


class ModuleTree(Tree[int]):
    """The model hierarchy; each module's badge shows its time share, NaN/inf and calls
    in the current step (and, comparing two runs, how far it diverges)."""

    COMPONENT_CLASSES = {
        "module-tree--share",
        "module-tree--calls",
        "module-tree--origin",
        "module-tree--nonfinite",
        "module-tree--diverges",
        "module-tree--spill",
        "module-tree--first",
    }

    # vim's keys, as lazygit, k9s and htop users expect; PgUp/PgDn page (the Tree's own)
    BINDINGS = [
        Binding("j", "cursor_down", "down", show=False),
        Binding("k", "cursor_up", "up", show=False),
        Binding("h", "fold", "fold, or to the parent", show=False),
        Binding("l", "unfold", "unfold, or to the first child", show=False),
        Binding("pagedown", "page_down", "page", key_display="pgup pgdn"),
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
        self.first_divergence: str | None = None
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
                    self._label(module, None, None),
                    data=module.id,
                    expand=module.depth < 2,
                    allow_expand=bool(children),
                )
                self._node_of[module.id] = node
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
        self.badge(*self._badges)
        return True

    @property
    def first_module(self) -> int | None:
        """The module on the tree's first line."""
        children = self.root.children
        return children[0].data if children else None

    def _style(self, name: str) -> str:
        return str(self.get_component_rich_style(f"module-tree--{name}", partial=True))

    def _label(self, module: Module, step: ModuleStep | None, diverges: Gap | None) -> Text:
        name = module.name.rpartition(".")[2] if module.depth else module.name
        label = Text(printable(name), style="bold" if module.depth == 0 else "")
        label.append(f" {printable(module.type)}", style="dim")
        if step is not None:
            if step.share >= 0.005:
                label.append(f" {step.share:.0%}", style=self._style("share"))
            if step.calls > 1:
                label.append(f" ×{step.calls}", style=self._style("calls"))
            if step.origin:
                label.append(" ◆ NaN/inf born here", style=self._style("origin"))
            elif step.nonfinite:
                label.append(f" ⚠ {step.nonfinite} non-finite", style=self._style("nonfinite"))
        if diverges is not None:  # forward first: backward gaps may be spill-over
            if diverges.fwd is not None:
                label.append(f" ≠ {_gap(diverges.fwd)}", style=self._style("diverges"))
            elif diverges.bwd is not None:
                label.append(f" ≠ bwd only {_gap(diverges.bwd)}", style=self._style("spill"))
            elif diverges.opt is not None:
                label.append(f" ≠ weights {_gap(diverges.opt)}", style=self._style("diverges"))
        if module.name == self.first_divergence:
            label.append(" ★ first divergence", style=self._style("first"))
        return label

    def badge(self, steps: dict[int, ModuleStep], divergence: dict[str, Gap] | None) -> None:
        self._badges = (steps, divergence)
        for module_id, node in self._node_of.items():
            module = self._module_table[module_id]
            diverges = divergence.get(module.name) if divergence else None
            node.set_label(self._label(module, steps.get(module_id), diverges))

    def mark_first_divergence(self, name: str | None) -> None:
        self.first_divergence = name
        self.badge(*self._badges)

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


def _gap(rel: float) -> str:
    return "changed" if math.isinf(rel) else f"{rel:.1e}"
