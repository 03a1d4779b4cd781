"""The layers import in one direction: no module imports another that imports it back.

The graph is read from the source with ``ast``: every import a module can run, at load
time or later inside a function (a lazy import still closes a loop: a command module
that imports the group inside a function makes a cycle all the same), but not those under
``if TYPE_CHECKING:``, which never run.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"hookdbg": ROOT / "hookdbg", "hookdbg.tui": ROOT / "tui"}


def _modules() -> dict[str, Path]:
    """Every module of the package by its import name (tui/ installs as hookdbg.tui)."""
    found = {}
    for prefix, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if prefix == "hookdbg" and parts[0] == "tui":
                continue  # a link to tui/ in a source checkout
            name = ".".join([prefix, *(p for p in parts if p != "__init__")])
            found[name] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Imports(ast.NodeVisitor):
    """The import statements of a module that can run."""

    def __init__(self) -> None:
        self.found: list[ast.Import | ast.ImportFrom] = []

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            for child in node.body:
                self.visit(child)
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.append(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.found.append(node)


def _imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    visitor = _Imports()
    visitor.visit(tree)
    return visitor.found


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports. ``from pkg import name`` counts as
    importing ``pkg.name`` when that is a module, else ``pkg``."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# The recorder's subpackages, lowest first: each imports only those before it (an import
# under TYPE_CHECKING may point back, for a type). Its top modules (core, runner,
# accelerated, signals) wire them together and come after all of them.
RECORDER_ROOMS = ["summaries", "calls", "alerts", "hooks", "steps"]


def _room(module: str) -> int:
    """A recorder module's place in RECORDER_ROOMS (its top modules: after the last)."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[2] in RECORDER_ROOMS:
        return RECORDER_ROOMS.index(parts[2])
    return len(RECORDER_ROOMS)


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from one recorder module to another in a later room (or its top)."""
    recorder = "hookdbg.recorder."
    return sorted(
        (a, b)
        for a, targets in graph.items()
        if a.startswith(recorder)
        for b in targets
        if (b.startswith(recorder) or b == "hookdbg.recorder") and _room(b) > _room(a)
    )


def test_the_graph_sees_the_imports():
    graph = import_graph()
    assert "hookdbg.cli.summary" in graph["hookdbg.cli.app"]
    assert "hookdbg.tui.model" in graph["hookdbg.tui.replay"]
    assert "hookdbg.read.recording" in graph["hookdbg.analysis.overview"]


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_commands_do_not_import_the_group():
    graph = import_graph()
    commands = [m for m in graph if m.startswith("hookdbg.cli.")]
    assert [m for m in commands if "hookdbg.cli.app" in graph[m]] == []


@pytest.mark.parametrize(
    "module", sorted(m for m in _modules() if m.startswith(("hookdbg.cli", "hookdbg.analysis")))
)
def test_each_module_imports_first(module):
    """Imported first in a fresh interpreter, each module loads (a cycle would show as a
    partially initialised module) and leaves torch out."""
    code = f"import sys, {module}; assert 'torch' not in sys.modules, 'torch was imported'"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr


def test_upward_imports_are_found():
    graph = {
        "hookdbg.recorder.calls.calls": {"hookdbg.recorder.hooks.observe"},
        "hookdbg.recorder.hooks.observe": {"hookdbg.recorder.calls.calls"},
        "hookdbg.recorder.steps.meta": {"hookdbg.recorder.core", "hookdbg.recorder"},
    }
    assert upward_imports(graph) == [
        ("hookdbg.recorder.calls.calls", "hookdbg.recorder.hooks.observe"),
        ("hookdbg.recorder.steps.meta", "hookdbg.recorder"),
        ("hookdbg.recorder.steps.meta", "hookdbg.recorder.core"),
    ]


def test_recorder_rooms_import_downward():
    graph = import_graph()
    rooms = {
        m.split(".")[2] for m in graph if m.count(".") >= 3 and m.startswith("hookdbg.recorder.")
    }
    assert rooms == set(RECORDER_ROOMS), "a new recorder subpackage needs its place"
    assert upward_imports(graph) == []
