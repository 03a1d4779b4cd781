"""What the TUI shows, computed from a recording: no Textual, no torch, easy to test.

Every method here reads the file, so the app calls them from worker threads only;
widgets receive the plain results.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from hookdbg.analysis.alerts import AlertReport, alert_reports
from hookdbg.analysis.diff import DiffResult, diff
from hookdbg.analysis.profile import Profile, profile
from hookdbg.analysis.query import Query
from hookdbg.analysis.search import TENSOR_COLUMNS, SearchResult, search
from hookdbg.read import Capture, Recording, Status
from hookdbg.read.modules import Module
from hookdbg.store.schema import HISTOGRAM, Phase, Slot
from hookdbg.text import plural


@dataclass(frozen=True)
class PlotStat:
    """A statistic that can be plotted over steps for one module."""

    label: str
    slot: Slot | None  # None: a timing from the calls table
    column: str
    path: str | None = None  # for parameter gradients: which parameter


PLOT_STATS = (
    PlotStat("output std", Slot.OUTPUT, "std"),
    PlotStat("output mean", Slot.OUTPUT, "mean"),
    PlotStat("output max |x|", Slot.OUTPUT, "absmax"),
    PlotStat("grad norm (w.r.t. output)", Slot.GRAD_OUTPUT, "norm"),
    PlotStat("weight grad norm", Slot.PARAM_GRAD, "norm", "weight"),
    PlotStat("weight norm", Slot.PARAM, "norm", "weight"),
    PlotStat("forward ms", None, "fwd"),
    PlotStat("backward ms", None, "bwd"),
)


@dataclass(frozen=True)
class ModuleStep:
    """One module in one step, as its tree badge shows it."""

    calls: int
    seconds: float  # forward + backward self time
    share: float  # of the step's time
    nonfinite: int  # tensors with NaN/inf
    origin: bool  # a NaN/inf origin was here


@dataclass(frozen=True)
class Detail:
    module: Module
    step: int
    label: str  # "step 3", or "eval batch 2" (then ``step`` is its number among them)
    rows: np.ndarray  # tensor summaries of the module in the step
    timings: np.ndarray  # its call rows
    captures: list[Capture]
    histogram: tuple[list[float], float, float] | None  # counts, low, high of a capture


class RunView:
    """One recording, as the TUI sees it."""

    def __init__(self, recording: Recording) -> None:
        self.rec = recording

    @property
    def name(self) -> str:
        return str(self.rec.path)

    @property
    def steps(self) -> list[int]:
        return [int(s) for s in self.rec.recorded_steps]

    @property
    def eval_steps(self) -> list[int]:
        """The recorded eval batches, by their number among all eval batches."""
        return [int(i) for i in np.flatnonzero(self.rec.evals["recorded"] == 1)]

    def _rows(self, table: str, step: int, evals: bool, columns: list[str] | None) -> np.ndarray:
        """Rows of training step ``step``, or of eval batch number ``step``."""
        read = self.rec.tensors if table == "tensors" else self.rec.calls
        if not evals:
            return read(step, step, columns)
        batch = self.rec.evals[step]
        wanted = None if columns is None else list(dict.fromkeys([*columns, "segment"]))
        rows = read(int(batch["step"]), int(batch["step"]), wanted, None)
        return rows[rows["segment"] == batch["segment"]]

    def _segment(self, step: int, evals: bool) -> np.void | None:
        rows = self.rec.evals if evals else self.rec.steps
        if evals:
            return rows[step] if 0 <= step < len(rows) else None
        found = rows[rows["step"] == step]
        return found[0] if len(found) else None

    @property
    def status(self) -> Status:
        return self.rec.status

    def refresh(self) -> bool:
        return self.rec.refresh()

    def ended(self) -> str | None:
        """How the recording ended, once its recorder closed it (None while it runs)."""
        end = self.rec.end
        if end is None:
            return None
        return (
            f"recording finished ({int(end['steps']):,} steps, exit status {int(end['exit_code'])})"
        )

    def first_alert(self) -> tuple[int, float, int] | None:
        """(step, time, module) of the first NaN/inf origin, for ``f``: sorted with
        other ranks' it says which rank saw one first."""
        alerts = self.rec.alerts
        if not len(alerts):
            return None
        first = alerts[np.argmax(alerts["first"])] if alerts["first"].any() else alerts[0]
        return int(first["step"]), float(first["time"]), int(first["module"])

    def eval_number(self, step: int, time: float) -> int | None:
        """The eval batch number of the alert at (step, time), or None for a training step."""
        alerts = self.rec.alerts
        found = alerts[(alerts["step"] == step) & (alerts["time"] == time)]
        if not len(found):
            return None
        hits = np.flatnonzero(self.rec.evals["segment"] == found["segment"][0])
        return int(hits[0]) if len(hits) else None

    def step_table(self, step: int, evals: bool = False) -> dict[int, ModuleStep]:
        calls = self._rows("calls", step, evals, ["module", "phase", "self"])
        tensors = self._rows("tensors", step, evals, ["module", "nan", "posinf", "neginf"])
        row = self._segment(step, evals)
        length = float(row["end"] - row["start"]) if row is not None else 0.0
        bad = (tensors["nan"] > 0) | (tensors["posinf"] > 0) | (tensors["neginf"] > 0)
        alerts = self.rec.alerts
        here = alerts["segment"] == row["segment"] if row is not None else alerts["step"] < 0
        origins = set(alerts["module"][here].tolist())
        out = {}
        for module in set(calls["module"].tolist()) | set(tensors["module"].tolist()):
            mine = calls[calls["module"] == module]
            seconds = float(mine["self"][mine["phase"] != Phase.OPT].sum())
            out[module] = ModuleStep(
                calls=int(np.count_nonzero(mine["phase"] == Phase.FWD)),
                seconds=seconds,
                share=seconds / length if length > 0 else 0.0,
                nonfinite=int(np.count_nonzero(bad & (tensors["module"] == module))),
                origin=module in origins,
            )
        return out

    def detail(self, module: int, step: int, evals: bool = False) -> Detail:
        rows = self._rows("tensors", step, evals, tensor_columns(self.rec))
        calls = self._rows("calls", step, evals, None)
        segment = self._segment(step, evals)
        captured = [
            c
            for c in self.rec.captured(module, int(segment["step"]) if segment else step)
            if segment is None or c.segment == int(segment["segment"])
        ]
        histogram = None
        if captured:
            first = next((c for c in captured if c.slot == Slot.OUTPUT), captured[0])
            values = self.rec.tensor(first).astype(np.float64).ravel()
            finite = values[np.isfinite(values)]
            if finite.size:
                counts, edges = np.histogram(finite, bins=40)
                histogram = (counts.astype(float).tolist(), float(edges[0]), float(edges[-1]))
        return Detail(
            self.rec.modules[module],
            step,
            f"eval batch {step}" if evals else f"step {step}",
            rows[rows["module"] == module],
            calls[calls["module"] == module],
            captured,
            histogram,
        )

    def series(
        self, module: int, stat: PlotStat, evals: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of one statistic of one module (its first call per step), over
        the training steps, or over the eval batches (numbered among them)."""
        if stat.slot is None:
            table = self.rec.calls_table
            phase = Phase.FWD if stat.column == "fwd" else Phase.BWD
            mask = (table.column("module") == module) & (table.column("phase") == phase)
            values = table.column("total")[mask] * 1e3
        else:
            table = self.rec.tensors_table
            mask = (table.column("module") == module) & (table.column("slot") == stat.slot)
            if stat.path is not None:
                mask &= table.column("path") == stat.path.encode()
            else:
                mask &= table.column("path") == b""
            if stat.column == "absmax":
                values = np.maximum(
                    np.abs(table.column("min")[mask]), np.abs(table.column("max")[mask])
                )
            else:
                values = table.column(stat.column)[mask]
            bad = sum(table.column(c)[mask] for c in ("nan", "posinf", "neginf"))
            # a NaN of a tensor without NaN/inf is a statistic not recorded: leave it out
            kept = (table.column("nan")[mask] >= 0) & ~(np.isnan(values) & (bad == 0))
            mask[mask] = kept
            values = values[kept]
        segments = table.column("segment")[mask]
        is_eval = self.rec.is_eval(segments)
        if evals:
            numbers = np.searchsorted(self.rec.evals["segment"], segments[is_eval])
            steps, values = numbers, values[is_eval]
        else:
            steps, values = table.column("step")[mask][~is_eval], values[~is_eval]
        if not len(steps):
            return steps, values
        first = np.unique(steps, return_index=True)[1]  # the first call of each step
        return steps[first], values[first].astype(float)

    def profile(self, step: int | None) -> Profile:
        return profile(self.rec, step, step)

    def alerts(self) -> list[AlertReport]:
        return alert_reports(self.rec)

    def search(self, query: Query, limit: int = 500) -> SearchResult:
        return search(self.rec, query, limit)


def tensor_columns(rec: Recording) -> list[str]:
    """What the detail pane reads of a tensor row: its histogram too, if it has one."""
    return [*TENSOR_COLUMNS, *([HISTOGRAM] if rec.histogram_bins else [])]


def nearest_step(steps: list[int], step: int) -> int:
    """The recorded step closest to ``step`` (``steps`` sorted, not empty)."""
    i = min(bisect.bisect_left(steps, step), len(steps) - 1)
    if i > 0 and step - steps[i - 1] < steps[i] - step:
        i -= 1
    return steps[i]


def first_origin(ranks: list[RunView]) -> tuple[int, int, int] | None:
    """(rank index, step, module) of the first NaN/inf origin of a run, across ranks:
    the earliest step, then the earliest time."""
    found = [(first, i) for i, view in enumerate(ranks) if (first := view.first_alert())]
    if not found:
        return None
    (step, _, module), rank = min(found)
    return rank, step, module


def status_notice(run: RunView, following: bool) -> str | None:
    """What the notice line says about a recording that is not simply complete."""
    status = run.status
    if status is Status.CUT_SHORT:
        return (
            "this recording was cut short (its process ended without closing it): "
            "showing everything that was flushed"
        )
    if status is Status.LIVE and not following:
        return "this recording is still being written: press F to follow it"
    return None


def alerts_notice(ranks: list[RunView]) -> str | None:
    """'3 NaN/inf alerts on 1 of 2 ranks — f jumps to the first', said on open."""
    counts = [len(view.rec.alerts) for view in ranks]
    if not sum(counts):
        return None
    on = sum(1 for c in counts if c)
    where = f" on {on} of {len(ranks)} ranks" if len(ranks) > 1 else ""
    return f"{plural(sum(counts), 'NaN/inf alert')}{where} — f jumps to the first"


@dataclass(frozen=True)
class Gap:
    """A module's worst relative difference between two runs in each phase (None where
    it agrees; inf for shape, dtype or NaN/inf count changes)."""

    fwd: float | None
    bwd: float | None
    opt: float | None


@dataclass(frozen=True)
class DiffView:
    """Two recordings compared: how far each module diverges, and where first."""

    a: RunView
    b: RunView
    result: DiffResult

    @classmethod
    def compute(cls, a: RunView, b: RunView) -> DiffView:
        return cls(a, b, diff(a.rec, b.rec))

    def divergence(self, step: int | None = None) -> dict[str, Gap]:
        """How far each module (by name) diverges, in one step or all, per phase.

        The phases are kept apart because a divergence spills backwards through the
        gradients: modules before the real first divergence differ in their backward
        pass only, and can differ more than it does."""
        worst: dict[str, list[float | None]] = {}
        for d in self.result.divergences:
            if step is None or d.step == step:
                gaps = worst.setdefault(d.module, [None, None, None])
                gaps[d.phase] = max(gaps[d.phase] or 0.0, d.rel_diff)
        return {name: Gap(*gaps) for name, gaps in worst.items()}

    def divergent_slots(self, module: str, step: int) -> set[tuple[int, int, str]]:
        """(phase, slot, path) of the module's tensors that differ in a step."""
        return {
            (d.phase, d.slot, d.path)
            for d in self.result.divergences
            if d.module == module and d.step == step
        }

    def first(self) -> tuple[str, int] | None:
        d = self.result.first
        return (d.module, d.step) if d else None
