"""Value histograms (``record --histograms N``) as reports show them: a sparkline of a
row's counts, the counts as plain numbers, and per-step series for TensorBoard. No
torch, no Textual: the CLI, the TUI and the exporter use it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hookdbg.analysis.scalars import StatSelection, group_positions
from hookdbg.read.histograms import bin_edges
from hookdbg.read.recording import Recording
from hookdbg.read.resolve import row_span
from hookdbg.read.table import Table
from hookdbg.store.schema import HISTOGRAM, StepKind, slot_label

BARS = " ▁▂▃▄▅▆▇█"  # a bin with no values is blank; with any, at least ▁


def sparkline(counts: np.ndarray, width: int = 32) -> str:
    """One character per bin, its height the bin's count against the fullest bin;
    more bins than ``width`` are added together in neighbouring groups first. Empty
    for a histogram without values (no statistics, or no finite values)."""
    counts = np.asarray(counts, dtype=np.float64)
    if not counts.size or counts.sum() <= 0:
        return ""
    if counts.size > width:
        starts = np.linspace(0, counts.size, width + 1).astype(np.int64)[:-1]
        counts = np.add.reduceat(counts, starts)
    peak = counts.max()
    return "".join(BARS[min(8, math.ceil(8 * c / peak))] for c in counts.tolist())


def has_histogram(row: np.void) -> bool:
    """Whether a tensors row read with its histogram holds any counts."""
    return HISTOGRAM in (row.dtype.names or ()) and bool(row[HISTOGRAM].any())


def histogram_json(row: np.void) -> dict[str, object]:
    """``{"histogram": [counts...]}`` for a row read with its histogram, else nothing."""
    if HISTOGRAM not in (row.dtype.names or ()):
        return {}
    return {HISTOGRAM: [int(c) for c in row[HISTOGRAM].tolist()]}


@dataclass(frozen=True)
class HistogramSeries:
    """One module slot's histograms over global steps, as TensorBoard shows them: the
    ``counts`` of step ``steps[i]`` lie between ``edges[i]`` (N + 1 of them)."""

    tag: str  # MODULE/SLOT/histogram
    kind: StepKind
    steps: np.ndarray
    edges: np.ndarray  # [steps, N + 1]
    counts: np.ndarray  # [steps, N]
    means: np.ndarray  # of the finite values (NaN where not recorded)
    stds: np.ndarray


def histogram_series(
    recording: Recording,
    ids: np.ndarray,
    stats: StatSelection,
    first: int | None,
    last: int | None,
) -> list[HistogramSeries]:
    """The histograms of modules ``ids`` whose ``SLOT/histogram`` the selection matches,
    one per global step: the module's first call in a training step (as the scalars),
    and the first eval batch at a step for the eval run."""
    if not recording.histogram_bins:
        return []
    table = recording.tensors_table
    span = row_span(recording, "tensors", first, last)
    where = table.read(["step", "segment", "module", "slot", "path"], span)
    chosen = np.flatnonzero(np.isin(where["module"], ids))
    out = []
    for positions in group_positions(where[chosen], ["module", "slot", "path"]):
        group = chosen[positions]
        row = where[group[0]]
        label = slot_label(int(row["slot"]), row["path"].decode("utf-8", "replace"))
        if not stats.matches(f"{label}/{HISTOGRAM}"):
            continue
        tag = f"{recording.modules.name(int(row['module']))}/{label}/{HISTOGRAM}"
        evals = recording.is_eval(where["segment"][group])
        for kind, mine in ((StepKind.TRAIN, group[~evals]), (StepKind.EVAL, group[evals])):
            steps, first_rows = np.unique(where["step"][mine], return_index=True)
            picked = mine[first_rows] + (span.start or 0)
            series = _series(table, tag, kind, steps, picked)
            if series is not None:
                out.append(series)
    return out


def _series(
    table: Table, tag: str, kind: StepKind, steps: np.ndarray, rows: np.ndarray
) -> HistogramSeries | None:
    """The series of these table rows, those with counts only."""
    data = table.take(rows, ["min", "max", "mean", "std", HISTOGRAM])
    kept = data[HISTOGRAM].sum(axis=1) > 0
    if not kept.any():
        return None
    data, steps = data[kept], steps[kept]
    bins = data[HISTOGRAM].shape[1]
    edges = np.array([bin_edges(float(r["min"]), float(r["max"]), bins) for r in data])
    return HistogramSeries(tag, kind, steps, edges, data[HISTOGRAM], data["mean"], data["std"])
