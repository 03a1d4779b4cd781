"""Per-module time series of a recording: one value per global step, as dashboards
(TensorBoard) plot them.

A series is named ``MODULE/SLOT/STAT`` (``model.layer1.0.conv1/output/std``,
``model.fc/param_grad[weight]/norm``) or ``MODULE/fwd_ms`` and ``MODULE/bwd_ms``. In a
training step a tensor statistic is that of the module's first call in the step (as
the TUI plots it) and a time is the sum over its calls. Eval batches run at the same
global step (one validation pass) become one point: times and statistics averaged
over the batches, except ``min`` (the smallest), ``max`` (the largest) and NaN/inf
counts (summed). Statistics that were not recorded (NaN where nothing was measured,
counts of ``-1``) are left out rather than plotted as zero.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hookdbg.analysis.losses import loss_series
from hookdbg.options import ModuleFilter
from hookdbg.read.recording import Recording
from hookdbg.read.resolve import row_span
from hookdbg.store import summary as layout
from hookdbg.store.schema import HISTOGRAM, Phase, StepKind, slot_label

STATS = layout.SCALARS  # a summary's fields plotted (hookdbg/store/summary.py)
TIMES = ("fwd_ms", "bwd_ms", "fwd_device_ms", "bwd_device_ms")
DEFAULT_STATS = (
    "output/std",
    "output/norm",
    "grad_output/norm",
    "param_grad*/norm",
    "fwd_ms",
    "bwd_ms",
    "fwd_device_ms",  # on a CUDA device (none elsewhere)
    "bwd_device_ms",
    # TensorBoard histograms, in recordings made with --histograms (analysis/histograms.py)
    "output/histogram",
    "grad_output/histogram",
    "param_grad*/histogram",
    "param[*/histogram",
)
_COUNTS = layout.COUNTED  # not measured: below 0 (the others: NaN)
_EVAL_REDUCE = {"min": np.fmin, "max": np.fmax, "nan": np.add, "posinf": np.add, "neginf": np.add}


@dataclass(frozen=True)
class StatSelection:
    """Which series to keep, as globs over ``SLOT/STAT`` (``output/std``,
    ``param_grad*/norm``, ``*/max``) or ``fwd_ms``/``bwd_ms``. Only ``*`` and ``?`` are
    wildcards: ``param_grad[weight]/norm`` means that parameter, not a character class."""

    globs: tuple[str, ...] = DEFAULT_STATS

    def __post_init__(self) -> None:
        known = [f"SLOT/{s}" for s in (*STATS, HISTOGRAM)] + list(TIMES)
        for glob in self.globs:
            stat = glob.rpartition("/")[2]
            if not any(_glob(stat).fullmatch(s) for s in (*STATS, *TIMES, HISTOGRAM)):
                raise ValueError(f"unknown statistic {glob!r}; use one of {', '.join(known)}")

    def matches(self, name: str) -> bool:
        return any(_glob(g).fullmatch(name) for g in self.globs)


@lru_cache(maxsize=256)
def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(".".join(map(re.escape, p.split("?"))) for p in pattern.split("*")))


@dataclass(frozen=True)
class Series:
    """One plotted line: ``values`` at global ``steps``, in the training or eval run."""

    tag: str
    kind: StepKind
    steps: np.ndarray
    values: np.ndarray


@dataclass(frozen=True)
class Note:
    """A line of text at a step: an alert, or what the run was."""

    tag: str
    kind: StepKind
    step: int
    text: str


def module_series(
    recording: Recording,
    modules: Iterable[str] = (),
    stats: StatSelection | None = None,
    first: int | None = None,
    last: int | None = None,
) -> list[Series]:
    """The selected modules' (globs as ``record --modules``; default: all) selected
    statistics over steps ``first``..``last``, eval batches included."""
    chosen = ModuleFilter.parse(list(modules))
    ids = np.array(
        [m.id for m in recording.modules if m.is_model_part and chosen.selects(m.name, m.path)],
        dtype=np.int64,
    )
    stats = stats or StatSelection()
    return [
        *_tensor_series(recording, ids, stats, first, last),
        *_time_series(recording, ids, stats, first, last),
    ]


def _tensor_series(
    recording: Recording, ids: np.ndarray, stats: StatSelection, first: int | None, last: int | None
) -> list[Series]:
    wanted = [s for s in STATS if _any_slot_wants(stats, s)]
    if not wanted:
        return []
    rows = recording.tensors_table.read(
        ["step", "segment", "module", "slot", "path", *wanted],
        row_span(recording, "tensors", first, last),
    )
    rows = rows[np.isin(rows["module"], ids)]
    out = []
    for mine in _groups(rows, ["module", "slot", "path"]):
        label = slot_label(int(mine["slot"][0]), mine["path"][0].decode("utf-8", "replace"))
        name = recording.modules.name(int(mine["module"][0]))
        for stat in wanted:
            if not stats.matches(f"{label}/{stat}"):
                continue
            values = mine[stat]
            measured = values >= 0 if stat in _COUNTS else ~np.isnan(values)
            tag = f"{name}/{label}/{stat}"
            out += _per_step(recording, tag, stat, mine[measured], values[measured], "first")
    return out


def _any_slot_wants(stats: StatSelection, stat: str) -> bool:
    return any(_glob(g.rpartition("/")[2]).fullmatch(stat) for g in stats.globs)


def group_positions(rows: np.ndarray, keys: list[str]) -> list[np.ndarray]:
    """Positions in ``rows`` split by the values of ``keys``, each group in its recorded
    order (one sort, not a scan of every row per group)."""
    if not len(rows):
        return []
    _, group = np.unique(rows[keys], return_inverse=True)
    group = group.reshape(-1)
    order = np.argsort(group, kind="stable")
    bounds = np.flatnonzero(np.diff(group[order])) + 1
    return np.split(order, bounds)


def _groups(rows: np.ndarray, keys: list[str]) -> list[np.ndarray]:
    return [rows[positions] for positions in group_positions(rows, keys)]


def _time_series(
    recording: Recording, ids: np.ndarray, stats: StatSelection, first: int | None, last: int | None
) -> list[Series]:
    """Each module's forward and backward time per step (``fwd_ms``, ``bwd_ms``), and on
    a CUDA device its device time (``fwd_device_ms``, ``bwd_device_ms``)."""
    times = ((Phase.FWD, "fwd_ms"), (Phase.BWD, "bwd_ms"))
    on_device = ((Phase.FWD, "fwd_device_ms"), (Phase.BWD, "bwd_device_ms"))
    phases = [(p, name) for p, name in times if stats.matches(name)]
    device = [(p, name) for p, name in on_device if stats.matches(name)]
    if not phases and not device:
        return []
    rows = recording.calls_table.read(
        ["call", "step", "segment", "module", "phase", "total"],
        row_span(recording, "calls", first, last),
    )
    rows = rows[np.isin(rows["module"], ids)]
    out = []
    for chosen, table in ((phases, rows), (device, _on_device(recording, rows, first, last))):
        mine_rows = table[np.isin(table["phase"], [p for p, _ in chosen])]
        suffix = dict(chosen)
        for mine in _groups(mine_rows, ["module", "phase"]) if chosen else []:
            name = recording.modules.name(int(mine["module"][0]))
            tag = f"{name}/{suffix[Phase(int(mine['phase'][0]))]}"
            out += _per_step(recording, tag, "time", mine, mine["total"] * 1e3, "sum")
    return out


def _on_device(
    recording: Recording, calls: np.ndarray, first: int | None, last: int | None
) -> np.ndarray:
    """``calls``' rows with their device totals in place of their host ones, for the
    calls timed on a device."""
    timed = recording.device_times(first, last, kind=None)
    if not len(timed) or not len(calls):
        return calls[:0]
    key = calls["call"].astype(np.int64) * 4 + calls["phase"]
    timed_key = timed["call"].astype(np.int64) * 4 + timed["phase"]
    found = np.isin(key, timed_key)
    out = calls[found].copy()
    order = np.argsort(timed_key)
    out["total"] = timed["total"][order][np.searchsorted(timed_key[order], key[found])]
    return out


def _per_step(
    recording: Recording, tag: str, stat: str, rows: np.ndarray, values: np.ndarray, mode: str
) -> list[Series]:
    """One value per global step. ``mode`` first: the first row of each training step
    (rows are in recorded order) and of each eval batch; sum: all rows of a training
    step, or of an eval batch, summed. Eval batches of one step are then reduced to one
    value (see the module docstring)."""
    evals = recording.is_eval(rows["segment"])
    values = values.astype(np.float64)
    out = []
    if not evals.all():
        steps, reduced = _by(rows["step"][~evals], values[~evals], mode)
        out.append(Series(tag, StepKind.TRAIN, steps, reduced))
    if evals.any():
        _, per_batch = _by(rows["segment"][evals], values[evals], mode)
        first = np.unique(rows["segment"][evals], return_index=True)[1]
        steps, where = np.unique(rows["step"][evals][first], return_inverse=True)
        where = where.reshape(-1)
        reduce = _EVAL_REDUCE.get(stat)
        if reduce is None:  # the mean over the validation pass's batches
            reduced = np.zeros(len(steps))
            np.add.at(reduced, where, per_batch)
            reduced /= np.bincount(where, minlength=len(steps))
        else:
            reduced = np.full(len(steps), 0.0 if reduce is np.add else np.nan)
            reduce.at(reduced, where, per_batch)
        out.append(Series(tag, StepKind.EVAL, steps, reduced))
    return out


def _by(keys: np.ndarray, values: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ``keys`` (sorted) and, for each, its first value or the sum of its values."""
    distinct, first, where = np.unique(keys, return_index=True, return_inverse=True)
    if mode == "first":
        return distinct, values[first]
    total = np.zeros(len(distinct))
    np.add.at(total, where.reshape(-1), values)
    return distinct, total


def step_series(recording: Recording, first: int | None, last: int | None) -> list[Series]:
    """Each training step's duration (``step_ms``)."""
    steps = recording.steps
    lo, hi = recording.segment_range(first, last)
    steps = steps[(steps["step"] >= lo) & (steps["step"] <= hi) & (steps["recorded"] == 1)]
    ms = (steps["end"] - steps["start"]) * 1e3
    return [Series("step_ms", StepKind.TRAIN, steps["step"], ms)] if len(steps) else []


def loss_scalars(recording: Recording, first: int | None, last: int | None) -> list[Series]:
    """The loss per training step (analysis/losses.py): tag ``loss``, or ``loss/NAME``
    for each of several loss sites (a GAN's ``loss/errD`` and ``loss/errG``); steps
    whose loss was not finite are left out (the alert says so)."""
    lo, hi = recording.segment_range(first, last)
    every = loss_series(recording)
    out = []
    for series in every:
        keep = (series.steps >= lo) & (series.steps <= hi) & np.isfinite(series.values)
        tag = "loss" if len(every) == 1 else f"loss/{series.site.name}"
        out.append(Series(tag, StepKind.TRAIN, series.steps[keep], series.values[keep]))
    return out


def notes(recording: Recording, first: int | None, last: int | None) -> list[Note]:
    """What the run was (at its first step), and each alert at the step it fired in."""
    lo, hi = recording.segment_range(first, last)
    info = recording.info
    run = (
        f"    {info.command}\n\nrecorded by hookdbg {info.hookdbg_version} "
        f"(torch {info.torch_version}) on {info.host}, {info.created}"
    )
    out = [Note("run", StepKind.TRAIN, max(lo, 0), run)]
    alerts = recording.alerts
    alerts = alerts[(alerts["step"] >= lo) & (alerts["step"] <= hi)]
    evals = recording.is_eval(alerts["segment"])
    for alert, is_eval in zip(alerts, evals, strict=True):
        kind = StepKind.EVAL if is_eval else StepKind.TRAIN
        text = "    " + alert["message"].decode("utf-8", "replace")  # verbatim, not markdown
        out.append(Note("alerts", kind, int(alert["step"]), text))
    return out


def wall_times(recording: Recording) -> dict[tuple[StepKind, int], float]:
    """Seconds since the epoch at which each (run, global step) began: TensorBoard's
    wall time, so that its 'relative' axis is training time."""
    try:
        created = datetime.datetime.fromisoformat(recording.info.created).timestamp()
    except ValueError:
        created = recording.path.stat().st_mtime
    out: dict[tuple[StepKind, int], float] = {}
    for row in recording.segments:
        key = (StepKind(int(row["kind"])), int(row["step"]))
        out.setdefault(key, created + float(row["start"]))
    return out
