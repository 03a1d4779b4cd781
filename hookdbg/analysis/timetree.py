"""Where one step's time went, call by call: the tree a flame (icicle) view draws.

Each recorded call of the step is a node, under the call that enclosed it (the calls
table's ``parent``), with its total (inclusive) and self time on the host and, where
the recording has them (``device_times``), on the device. A backward pass's module
rows sit under its loss site's row, whose total is the pass. The step's root holds a
section per phase, so forward, backward and optimizer lie side by side; what the
sections leave of the step is time outside recorded modules (the root's self time).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from hookdbg.analysis.stepview import segment_row, segment_rows
from hookdbg.read.modules import Module
from hookdbg.read.recording import Recording
from hookdbg.store.schema import Phase

NAN = float("nan")


@dataclass(eq=False)
class TimeNode:
    """One call in one phase (or a section, or the step, where ``module`` is None):
    seconds, inclusive (``total``) and without its recorded children (``self_time``).
    Nodes compare by identity: comparing field by field would walk a deep model's
    whole subtree."""

    label: str
    module: Module | None
    phase: int | None
    total: float
    self_time: float
    device_total: float = NAN
    device_self: float = NAN
    start: float = 0.0
    children: list[TimeNode] = field(default_factory=list)

    def time(self, device: bool) -> float:
        """The total the view sizes the node by: the device's, or the host's."""
        value = self.device_total if device else self.total
        return 0.0 if math.isnan(value) else value

    def own(self, device: bool) -> float:
        value = self.device_self if device else self.self_time
        return 0.0 if math.isnan(value) else value


@dataclass(frozen=True)
class TimeTree:
    """A step's calls as a tree; ``on_device`` where the calls were timed on a device."""

    label: str  # "step 3", "eval batch 1"
    step: int
    root: TimeNode
    on_device: bool

    def nodes(self) -> Iterator[tuple[TimeNode, int]]:
        """Every node with its depth, parents before children, in call order."""
        todo = [(self.root, 0)]
        while todo:
            node, depth = todo.pop()
            yield node, depth
            todo.extend((child, depth + 1) for child in reversed(node.children))


SECTIONS = ((Phase.FWD, "forward"), (Phase.BWD, "backward"), (Phase.OPT, "optimizer"))


def time_tree(rec: Recording, step: int, evals: bool = False) -> TimeTree:
    """The calls of training step ``step`` (or eval batch number ``step``) as a tree."""
    calls = segment_rows(rec, "calls", step, evals, None)
    label = f"eval batch {step}" if evals else f"step {step}"
    row = segment_row(rec, step, evals)
    wall = float(row["end"] - row["start"]) if row is not None else 0.0
    device = _device_times(rec, calls)
    nodes: dict[tuple[int, int], TimeNode] = {}
    for i, r in enumerate(calls):
        module = rec.modules.get(int(r["module"]))
        if module is None:
            continue
        nodes[int(r["call"]), int(r["phase"])] = TimeNode(
            label=module.name,
            module=module,
            phase=int(r["phase"]),
            total=float(r["total"]),
            self_time=float(r["self"]),
            device_total=float(device[0][i]),
            device_self=float(device[1][i]),
            start=float(r["start"]),
        )
    parent_of = {int(r["call"]): int(r["parent"]) for r in calls}
    sections: dict[int, TimeNode] = {
        phase: TimeNode(name, None, phase, 0.0, 0.0) for phase, name in SECTIONS
    }
    passes = sorted(
        (n for (_, p), n in nodes.items() if p == Phase.BWD and n.module and n.module.is_loss),
        key=lambda n: n.start,
    )
    for (call, phase), node in nodes.items():
        _parent(node, call, phase, nodes, parent_of, passes, sections).children.append(node)
    root = TimeNode(label, None, None, wall, 0.0)
    for phase, _ in SECTIONS:
        section = sections[phase]
        if section.children:
            section.total = sum(c.total for c in section.children)
            section.device_total = _sum_device(section.children)
            section.device_self = 0.0 if not math.isnan(section.device_total) else NAN
            section.start = min(c.start for c in section.children)
            root.children.append(section)
    for node, _ in TimeTree(label, step, root, False).nodes():
        node.children.sort(key=lambda n: n.start)
    covered = sum(s.total for s in root.children)
    root.total = max(wall, covered)
    root.self_time = root.total - covered
    root.device_total = _sum_device(root.children)
    root.device_self = 0.0 if not math.isnan(root.device_total) else NAN
    return TimeTree(label, step, root, not math.isnan(root.device_total))


def _parent(
    node: TimeNode,
    call: int,
    phase: int,
    nodes: dict[tuple[int, int], TimeNode],
    parent_of: dict[int, int],
    passes: list[TimeNode],
    sections: dict[int, TimeNode],
) -> TimeNode:
    """The node a call hangs under: its nearest enclosing call with a row in the same
    phase; a backward call without one, the backward pass whose span holds its start;
    else its phase's section."""
    seen = {call}
    up = parent_of.get(call, -1)
    while up >= 0 and up not in seen:
        if (up, phase) in nodes:
            return nodes[up, phase]
        seen.add(up)
        up = parent_of.get(up, -1)
    if phase == Phase.BWD and not (node.module and node.module.is_loss):
        for p in passes:
            if p.start <= node.start <= p.start + p.total:
                return p
    return sections.get(phase, sections[Phase.FWD])


def _sum_device(nodes: list[TimeNode]) -> float:
    """The device time of these nodes, NaN if none of them was timed on the device."""
    timed = [n.device_total for n in nodes if not math.isnan(n.device_total)]
    return sum(timed) if timed else NAN


def _device_times(rec: Recording, calls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each call row's device total and self time (NaN where it was not timed there)."""
    nan = np.full(len(calls), np.nan)
    if not len(calls):
        return nan, nan
    steps = calls["step"]
    timed = rec.device_times(int(steps.min()), int(steps.max()), kind=None)
    timed = timed[np.isin(timed["segment"], calls["segment"])]
    if not len(timed):
        return nan, nan
    keys = zip(timed["call"].tolist(), timed["phase"].tolist(), strict=True)
    index = {key: i for i, key in enumerate(keys)}
    wanted = zip(calls["call"].tolist(), calls["phase"].tolist(), strict=True)
    at = np.array([index.get(key, -1) for key in wanted], dtype=np.int64)
    found = at >= 0
    total, own = nan.copy(), nan.copy()
    total[found] = timed["total"][at[found]]
    own[found] = timed["self"][at[found]]
    return total, own
