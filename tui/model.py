"""What the TUI shows, computed from a recording: no Textual, no torch, easy to test.

The queries themselves live in hookdbg/analysis (stepview.py for a step's modules, a
module's detail and a statistic over steps), where the CLI reports use them too;
``RunView`` binds them to one open recording. Every method here reads the file, so the
app calls them from worker threads only; widgets receive the plain results.
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass

import numpy as np

from hookdbg.analysis.alerts import AlertReport, alert_reports
from hookdbg.analysis.diff import DiffResult, diff, gaps, not_compared
from hookdbg.analysis.losses import loss_series
from hookdbg.analysis.profile import Profile, profile
from hookdbg.analysis.query import Query
from hookdbg.analysis.search import SearchResult, search
from hookdbg.analysis.stepview import (
    PLOT_STATS,
    Detail,
    ModuleStep,
    PlotStat,
    module_detail,
    plotted_path,
    series,
    step_table,
)
from hookdbg.analysis.timetree import TimeTree, time_tree
from hookdbg.read import RankSet, Recording, Status
from hookdbg.store.schema import Phase
from hookdbg.text import plural

__all__ = [
    "PLOT_STATS",
    "Curve",
    "Detail",
    "DiffView",
    "Gap",
    "ModuleStep",
    "PlotStat",
    "RowPair",
    "RunView",
    "alerts_notice",
    "first_origin",
    "nearest_step",
    "pair_rows",
    "ranked_alerts",
    "status_notice",
]


@dataclass(frozen=True)
class Curve:
    """A statistic over steps, and the steps at which it is not to be trusted: ``bad``
    where the value is NaN/inf or the tensor it is of holds NaN/inf (the std of a
    tensor's finite values can look normal at the step its first NaN appeared)."""

    steps: np.ndarray
    values: np.ndarray
    bad: np.ndarray  # one bool per step

    @property
    def bad_steps(self) -> np.ndarray:
        return self.steps[self.bad]


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
        if end["status"] == b"detached":  # hookdbg ctl stop: training went on
            return f"recording stopped by hookdbg ctl ({int(end['steps']):,} steps)"
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

    def skipped_steps(self) -> frozenset[int]:
        """The steps whose optimizer step AMP's GradScaler skipped: their scaled
        gradients overflowed, which is how it finds its scale (no alert)."""
        steps = self.rec.steps
        return frozenset(int(s) for s in steps["step"][steps["skipped"] > 0])

    def eval_number(self, step: int, time: float) -> int | None:
        """The eval batch number of the alert at (step, time), or None for a training step."""
        alerts = self.rec.alerts
        found = alerts[(alerts["step"] == step) & (alerts["time"] == time)]
        if not len(found):
            return None
        hits = np.flatnonzero(self.rec.evals["segment"] == found["segment"][0])
        return int(hits[0]) if len(hits) else None

    def step_table(self, step: int, evals: bool = False) -> dict[int, ModuleStep]:
        return step_table(self.rec, step, evals)

    def detail(
        self, module: int, step: int, evals: bool = False, run: RankSet | None = None
    ) -> Detail:
        """The module's rows in the step; with ``run`` (the distributed run this rank
        belongs to), each DTensor shard's row as its global tensor's."""
        detail = module_detail(self.rec, module, step, evals)
        if run is None:
            return detail
        rows = run.global_tensors(self.rec.info.rank, detail.rows)
        return dataclasses.replace(detail, rows=rows, merged=True)

    def series(
        self,
        module: int,
        stat: PlotStat,
        evals: bool = False,
        path: str | None = None,
        site: int = 0,
    ) -> tuple[np.ndarray, np.ndarray]:
        """One statistic of a module over the steps; the loss is loss site ``site``'s
        (counted round: ``L`` cycles through them)."""
        if stat.of_run:
            found = loss_series(self.rec)
            if found and not evals:
                picked = found[site % len(found)]
                return picked.steps, picked.values
        return series(self.rec, module, stat, evals, path)

    def curve(
        self,
        module: int,
        stat: PlotStat,
        evals: bool = False,
        path: str | None = None,
        site: int = 0,
    ) -> Curve:
        """``series``, with the steps at which its tensor holds NaN/inf marked bad, as
        the tensor table's nan/inf column says them."""
        steps, values = self.series(module, stat, evals, path, site)
        bad = ~np.isfinite(values)
        if stat.slot is not None and not stat.of_run and len(steps):
            where = path if path is not None else self.plotted_path(module, stat)
            bad |= np.isin(steps, self.nonfinite_steps(module, stat, evals, where))
        return Curve(steps, values, bad)

    def nonfinite_steps(
        self, module: int, stat: PlotStat, evals: bool = False, path: str | None = None
    ) -> np.ndarray:
        """The steps at which the tensor ``stat`` is of (its first call's, as ``series``
        takes) holds NaN or an infinity."""
        held: np.ndarray | None = None
        for column in ("nan", "posinf", "neginf"):
            count = PlotStat(column, stat.slot, column, stat.path)
            steps, values = series(self.rec, module, count, evals, path)
            held = values if held is None else held + values
        return steps[held > 0] if held is not None else np.zeros(0, dtype=np.int64)

    def plotted_path(self, module: int, stat: PlotStat) -> str | None:
        return plotted_path(self.rec, module, stat)

    @property
    def loss_sites(self) -> int:
        """Places in the script that call backward(), as the loss plot counts them."""
        losses = self.rec.losses
        return len(np.unique(losses["module"][~self.rec.is_eval(losses["segment"])]))

    def loss_label(self, site: int = 0) -> str:
        """What the loss plot is of: ``loss (train.py:42)``; where the script calls
        backward() in several places (a GAN's errD and errG), which one of them."""
        found = loss_series(self.rec)
        if not found:
            return "the loss (no backward pass was recorded)"
        label = found[site % len(found)].label
        if len(found) > 1:
            label += f", loss {site % len(found) + 1} of {len(found)} (L: next)"
        return label

    def profile(self, step: int | None) -> Profile:
        return profile(self.rec, step, step)

    def time_tree(self, step: int, evals: bool = False) -> TimeTree:
        return time_tree(self.rec, step, evals)

    def alerts(self) -> list[AlertReport]:
        return alert_reports(self.rec)

    def search(self, query: Query, limit: int = 500) -> SearchResult:
        return search(self.rec, query, limit)


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


def ranked_alerts(ranks: list[RunView]) -> list[tuple[int, AlertReport]]:
    """(rank index, report) of every rank's alerts, in the order they happened (step,
    then time), as ``hookdbg alerts`` lists a distributed run's."""
    found = [(i, r) for i, view in enumerate(ranks) for r in view.alerts()]
    return sorted(found, key=lambda t: (int(t[1].alert["step"]), float(t[1].alert["time"])))


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
class RowPair:
    """The same tensor summary in run a and run b (row numbers in each ``Detail``,
    None where a run lacks it), and the tensors-table columns in which they differ."""

    a: int | None
    b: int | None
    differ: frozenset[str] = frozenset()


def pair_rows(a: Detail, b: Detail) -> list[RowPair]:
    """Run a's rows in order, each followed by run b's row of the same tensor, then the
    rows b alone has: the pairing ``hookdbg diff`` aligns rows by (nth call of the
    module, phase, slot, path, and the nth such row of the call)."""
    keys_a, keys_b = _row_keys(a), _row_keys(b)
    where_b = {k: i for i, k in enumerate(keys_b)}
    pairs = [RowPair(i, where_b.pop(k, None)) for i, k in enumerate(keys_a)]
    return pairs + [RowPair(None, j) for j in sorted(where_b.values())]


def _row_keys(detail: Detail) -> list[tuple[int, int, int, bytes, int]]:
    calls = detail.timings[detail.timings["phase"] != Phase.BWD]
    index = dict(zip(calls["call"].tolist(), calls["index"].tolist(), strict=True))
    seen: dict[tuple[int, int, int, bytes], int] = {}
    keys = []
    rows = detail.rows
    for call, phase, slot, path in zip(
        rows["call"].tolist(),
        rows["phase"].tolist(),
        rows["slot"].tolist(),
        rows["path"].tolist(),
        strict=True,
    ):
        key = (index.get(call, -1), phase, slot, path)
        seen[key] = seen.get(key, 0) + 1
        keys.append((*key, seen[key] - 1))
    return keys


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

    def pair_rows(self, a: Detail, b: Detail) -> list[RowPair]:
        """Both runs' rows of a module, paired, with the columns that differ by the
        rule and tolerance the comparison used (shapes and dtypes only, and no
        weights after the step, where one run was recorded without statistics)."""
        r = self.result
        exact, stats = r.exact, r.stats
        pairs = pair_rows(a, b)
        both = [
            (i, p.a, p.b)
            for i, p in enumerate(pairs)
            if p.a is not None
            and p.b is not None
            and not (r.values_from and a.rows["phase"][p.a] == Phase.OPT)
        ]
        if not both:
            return pairs
        x = a.rows[[row for _, row, _ in both]]
        y = b.rows[[row for _, _, row in both]]
        differ: dict[int, set[str]] = {}
        for column, bad, _ in gaps(x, y, r.rtol, r.atol, exact, stats):
            for k in np.flatnonzero(bad).tolist():
                differ.setdefault(both[k][0], set()).add(column)
        return [
            dataclasses.replace(p, differ=frozenset(differ[i])) if i in differ else p
            for i, p in enumerate(pairs)
        ]

    def first(self) -> tuple[str, int] | None:
        d = self.result.first
        return (d.module, d.step) if d else None

    def verdict(self) -> str:
        """What a comparison without a first divergence found, as ``hookdbg diff`` says
        it: a match only where both runs had steps and every row lined up."""
        r = self.result
        if not r.compared_steps:
            return "no step was recorded in both runs: nothing was compared"
        if r.equal:
            within = "in the steps both recorded" if r.steps_a != r.steps_b else "within tolerance"
            return f"no divergence: the two recordings match {within}"
        return "the recordings do not line up (the notice at the top says why)"

    def notes(self) -> list[str]:
        """What the comparison leaves out or could not match, for the notice line:
        steps, modules and rows that only one run has."""
        r, notes = self.result, []
        if r.steps_a != r.steps_b or not r.compared_steps:
            notes.append(
                f"recorded steps differ: {r.steps_a:,} in a, {r.steps_b:,} in b; "
                + ("only steps in both were compared" if r.compared_steps else "none in both")
            )
        if r.values_from is not None:
            notes.append(
                f"{r.values_from} was recorded without --level stats: compared shapes and "
                "dtypes only"
            )
        elif r.not_compared:
            notes.append(not_compared(r))
        for side, names in (("a", r.only_a), ("b", r.only_b)):
            if names:
                more = f" and {len(names) - 5:,} more" if len(names) > 5 else ""
                shown = ", ".join(names[:5]) + more
                notes.append(f"{plural(len(names), 'module')} only in {side}: {shown}")
        if r.unmatched_rows:
            notes.append(
                f"{plural(r.unmatched_rows, 'tensor summary', 'tensor summaries')} had no "
                "counterpart in the other recording"
                # those of modules one run lacks are said above
                + (f", as {r.unmatched[0]}" if r.unmatched and not r.only_a + r.only_b else "")
            )
        return notes
