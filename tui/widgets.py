"""The replay screen's widgets. Each only displays what it is given (data comes from
tui/model.py via the app's workers) and reports what the user picks with a message."""

from __future__ import annotations

import math

import numpy as np
from rich.text import Text
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Sparkline, Static, Tree
from textual.widgets.tree import TreeNode

from hookdbg.analysis.overview import shape_text
from hookdbg.read.modules import Module, ModuleTable
from hookdbg.store.schema import Phase, nonfinite_count, slot_label
from hookdbg.text import num, printable, utf8
from hookdbg.tui.model import Detail, ModuleStep, PlotStat


class ModuleTree(Tree[int]):
    """The model hierarchy; each module's badge shows its time share, NaN/inf and calls
    in the current step (and, comparing two runs, how far it diverges)."""

    class Picked(Message):
        def __init__(self, module: int) -> None:
            super().__init__()
            self.module = module

    def __init__(self, modules: ModuleTable, **kwargs: object) -> None:
        super().__init__("modules", **kwargs)  # type: ignore[arg-type]
        self.show_root = False
        self.guide_depth = 2
        self._module_table = modules
        self._node_of: dict[int, TreeNode[int]] = {}
        self._add_modules()

    def _add_modules(self) -> None:
        def add(parent: TreeNode[int], module: Module) -> None:
            children = [c for c in self._module_table.children(module.id) if c.id != module.id]
            node = parent.add(
                self._label(module, None, None),
                data=module.id,
                expand=module.depth < 2,
                allow_expand=bool(children),
            )
            self._node_of[module.id] = node
            for child in children:
                add(node, child)

        for root in self._module_table.roots():
            add(self.root, root)

    def _label(self, module: Module, step: ModuleStep | None, diverges: float | None) -> Text:
        name = module.name.rpartition(".")[2] if module.depth else module.name
        label = Text(printable(name), style="bold" if module.depth == 0 else "")
        label.append(f" {printable(module.type)}", style="dim")
        if step is not None:
            if step.share >= 0.005:
                label.append(f" {step.share:.0%}", style="cyan")
            if step.calls > 1:
                label.append(f" ×{step.calls}", style="dim")
            if step.origin:
                label.append(" ◆ NaN/inf born here", style="bold red")
            elif step.nonfinite:
                label.append(f" ⚠ {step.nonfinite} non-finite", style="red")
        if diverges is not None:
            label.append(
                " ≠ " + ("changed" if math.isinf(diverges) else f"{diverges:.1e}"),
                style="bold magenta",
            )
        return label

    def badge(self, steps: dict[int, ModuleStep], divergence: dict[str, float] | None) -> None:
        for module_id, node in self._node_of.items():
            module = self._module_table[module_id]
            diverges = divergence.get(module.name) if divergence else None
            node.set_label(self._label(module, steps.get(module_id), diverges))

    def select_module(self, module: int) -> None:
        node = self._node_of.get(module)
        if node is None:
            return
        parent = node.parent
        while parent is not None:
            parent.expand()
            parent = parent.parent
        self.move_cursor(node)

    def label_of(self, module: int) -> str:
        return str(self._node_of[module].label)

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[int]) -> None:
        if event.node.data is not None:
            self.post_message(self.Picked(event.node.data))


class DetailPane(Vertical):
    """Every tensor summary of the selected module in the current step, its timings,
    and a histogram of a stored full tensor when there is one."""

    COLUMNS = (
        "run",
        "phase",
        "slot",
        "shape",
        "dtype",
        "min",
        "max",
        "mean",
        "std",
        "norm",
        "nan/inf",
        "zeros",
    )

    def compose(self):
        yield Static(id="detail-title")
        yield DataTable(id="detail-table", zebra_stripes=True, cursor_type="row")
        yield Static(id="histogram")

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(*self.COLUMNS)

    def show(
        self,
        detail: Detail,
        other: Detail | None = None,
        divergent: set[tuple[int, int, str]] | None = None,
    ) -> None:
        module = detail.module
        fwd = detail.timings[detail.timings["phase"] == Phase.FWD]
        bwd = detail.timings[detail.timings["phase"] == Phase.BWD]
        title = Text(printable(module.name), style="bold")
        title.append(f"  {printable(module.type)}  step {detail.step}", style="dim")
        if len(fwd):
            title.append(
                f"\nforward {fwd['total'].sum() * 1e3:.3f} ms total, "
                f"{fwd['self'].sum() * 1e3:.3f} ms self"
            )
        if len(bwd):
            title.append(
                f"   backward {bwd['total'].sum() * 1e3:.3f} ms total, "
                f"{bwd['self'].sum() * 1e3:.3f} ms self"
            )
        if len(fwd) > 1:
            title.append(f"   {len(fwd)} calls")
        self.query_one("#detail-title", Static).update(title)
        table = self.query_one(DataTable)
        table.clear()
        runs = [("a" if other else "", detail)] + ([("b", other)] if other else [])
        for run, d in runs:
            for r in d.rows:
                bad = nonfinite_count(r)
                zeros = float(r["zero_frac"])
                key = (int(r["phase"]), int(r["slot"]), utf8(r["path"]))
                style = "bold magenta" if divergent and key in divergent else ""
                table.add_row(
                    Text(run),
                    Text(Phase(int(r["phase"])).label),
                    Text(printable(slot_label(int(r["slot"]), utf8(r["path"]))), style=style),
                    Text(printable(shape_text(r["shape"]))),
                    Text(printable(r["dtype"])),
                    *(
                        Text(num(r[k]), justify="right")
                        for k in ("min", "max", "mean", "std", "norm")
                    ),
                    Text(
                        "-" if bad < 0 else f"{bad:,}",
                        style="bold red" if bad > 0 else "",
                        justify="right",
                    ),
                    Text("-" if math.isnan(zeros) else f"{zeros:.0%}", justify="right"),
                )
        self._histogram(detail)

    def _histogram(self, detail: Detail) -> None:
        box = self.query_one("#histogram", Static)
        if detail.histogram is None:
            stored = "" if not detail.captures else " (stored tensors have no finite values)"
            box.update(Text(f"no stored full tensor for this step{stored}", style="dim"))
            return
        counts, low, high = detail.histogram
        peak = max(counts) or 1.0
        bars = "".join(" ▁▂▃▄▅▆▇█"[min(8, math.ceil(8 * c / peak))] for c in counts)
        source = detail.captures[0].source
        box.update(
            Text.assemble(
                ("values ", "dim"),
                (f"{num(low)} ", ""),
                (bars, "green"),
                (f" {num(high)}", ""),
                (f"  ({source})", "dim"),
            )
        )


class PlotPane(Vertical):
    """One statistic of the selected module over all steps (``s`` picks another)."""

    def compose(self):
        yield Static(id="plot-title")
        yield Sparkline([], id="plot-a")
        yield Sparkline([], id="plot-b", classes="hidden")

    def show(
        self,
        stat: PlotStat,
        module: str,
        series: tuple[np.ndarray, np.ndarray],
        step: int,
        other: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        steps, values = series
        title = Text(f"{stat.label} of {printable(module)}", style="bold")
        if len(values):
            finite = values[np.isfinite(values)]
            here = values[steps == step]
            title.append(f"   steps {int(steps[0])}-{int(steps[-1])}", style="dim")
            if finite.size:
                title.append(f"   min {num(finite.min())}  max {num(finite.max())}")
            if here.size:
                title.append(f"   step {step}: {num(here[0])}", style="cyan")
        else:
            title.append("   not recorded for this module", style="dim")
        if other is not None:
            title.append("\nupper: a, lower: b", style="dim")
        self.query_one("#plot-title", Static).update(title)
        self.query_one("#plot-a", Sparkline).data = _plottable(values)
        second = self.query_one("#plot-b", Sparkline)
        second.set_class(other is None, "hidden")
        second.data = _plottable(other[1]) if other is not None else []


def _plottable(values: np.ndarray) -> list[float]:
    """Sparklines cannot draw NaN/inf: draw them as the lowest value (and the title says)."""
    if not len(values):
        return []
    finite = values[np.isfinite(values)]
    floor = float(finite.min()) if finite.size else 0.0
    return [float(v) if math.isfinite(v) else floor for v in values]


class StepBar(Static):
    """Where we are among the recorded steps; ◆ marks steps with a NaN/inf origin."""

    def show(self, steps: list[int], step: int, alert_steps: set[int], live: bool) -> None:
        if not steps:
            self.update(Text("no recorded steps yet", style="dim"))
            return
        pos = steps.index(step) if step in steps else 0
        text = Text(f" step {step} ", style="bold reverse")
        text.append(f"  {pos + 1} of {len(steps)} recorded  ", style="dim")
        width = max(10, self.size.width - len(text) - 12)
        cells = _timeline(steps, pos, alert_steps, width)
        text.append_text(cells)
        text.append("   ←/→ step", style="dim")
        if live:
            text.append("  ● following", style="green")
        self.update(text)


def _timeline(steps: list[int], pos: int, alert_steps: set[int], width: int) -> Text:
    per = max(1, math.ceil(len(steps) / width))
    out = Text()
    for start in range(0, len(steps), per):
        chunk = steps[start : start + per]
        if start <= pos < start + per:
            out.append("▲", style="bold yellow")
        elif alert_steps.intersection(chunk):
            out.append("◆", style="bold red")
        else:
            out.append("·", style="dim")
    return out
