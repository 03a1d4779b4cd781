"""One recording, step by step and module by module: the queries behind the TUI's
tree badges (``step_table``), its detail pane (``module_detail``) and its plot
(``series``), for a training step or an eval batch (numbered among the eval batches),
and behind ``hookdbg show`` (``module_rows``: one module over a range of either).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hookdbg.analysis.losses import loss_series
from hookdbg.cells import TENSOR_COLUMNS
from hookdbg.read import Capture, Recording
from hookdbg.read.modules import Module
from hookdbg.read.table import Table
from hookdbg.store.schema import HISTOGRAM, Phase, Slot
from hookdbg.text import utf8


@dataclass(frozen=True)
class PlotStat:
    """A statistic that can be plotted over steps for one module."""

    label: str
    slot: Slot | None  # None: a timing from the calls table, or the loss
    column: str
    path: str | None = None  # for parameter gradients: which parameter

    @property
    def of_run(self) -> bool:
        """The run's, whichever module is selected (the loss)."""
        return self.column == "loss"


PLOT_STATS = (
    PlotStat("loss", None, "loss"),
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
    nonfinite: int  # tensors with NaN/inf, masks (``mask_rows``) left out
    origin: bool  # a NaN/inf origin was here
    # where the NaN/inf of an origin here came from, when it was not made here: "the
    # data", "tensor code" (a forward input no module produced), "another rank"
    origin_from: str = ""
    masked: int = 0  # -inf values in its inputs that are masks (``mask_rows``)
    # forward + backward time with its children's: a container's self time leaves out
    # the modules inside it, its total is what it costs
    total: float = 0.0
    total_share: float = 0.0


@dataclass(frozen=True)
class Detail:
    module: Module
    step: int
    label: str  # "step 3", or "eval batch 2" (then ``step`` is its number among them)
    rows: np.ndarray  # tensor summaries of the module in the step
    timings: np.ndarray  # its call rows
    captures: list[Capture]
    histogram: tuple[list[float], float, float] | None  # counts, low, high of a capture
    # ``rows`` hold the global tensors merged from the ranks' shards (read/ranks.py's
    # RankSet.global_tensors: with their ``placement`` and ``ranks``)
    merged: bool = False
    histogram_of: Capture | None = None  # the stored tensor ``histogram`` is of


def segment_rows(
    rec: Recording, table: str, step: int, evals: bool, columns: list[str] | None
) -> np.ndarray:
    """Rows of training step ``step``, or of eval batch number ``step``."""
    if not evals:
        return span_rows(rec, table, step, step, evals, columns)
    return _eval_rows(rec, table, rec.evals[[step]], columns)


def span_rows(
    rec: Recording, table: str, first: int, last: int, evals: bool, columns: list[str] | None
) -> np.ndarray:
    """Rows of training steps ``first``..``last``, or of eval batches number
    ``first``..``last`` (as reports number them: eval 0, eval 1...)."""
    if evals:
        return _eval_rows(rec, table, rec.evals[first : last + 1], columns)
    read = rec.tensors if table == "tensors" else rec.calls
    return read(first, last, columns)


def _eval_rows(
    rec: Recording, table: str, batches: np.ndarray, columns: list[str] | None
) -> np.ndarray:
    """Rows of these eval batches (rows of ``rec.evals``), with their segment column."""
    read = rec.tensors if table == "tensors" else rec.calls
    wanted = None if columns is None else list(dict.fromkeys([*columns, "segment"]))
    rows = read(int(batches["step"].min()), int(batches["step"].max()), wanted, None)
    return rows[np.isin(rows["segment"], batches["segment"])]


def segment_row(rec: Recording, step: int, evals: bool) -> np.void | None:
    """The ``steps`` row of training step ``step``, or the ``evals`` row of eval batch
    number ``step``; None when there is none."""
    rows = rec.evals if evals else rec.steps
    if evals:
        return rows[step] if 0 <= step < len(rows) else None
    found = rows[rows["step"] == step]
    return found[0] if len(found) else None


def mask_rows(rows: np.ndarray) -> np.ndarray:
    """Which tensor rows are masks: forward inputs whose only non-finite values are
    -inf (an attention mask, ``masked_fill(-inf)``). The recorder holds an inf a module
    receives for a mask until it is passed on (recorder/alerts/nonfinite.py), and raises an
    alert where it is; NaN and +inf stay alarms."""
    return (
        (rows["phase"] == Phase.FWD)
        & (rows["slot"] == Slot.INPUT)
        & (rows["nan"] == 0)
        & (rows["posinf"] == 0)
        & (rows["neginf"] > 0)
    )


def _origin_from(alert: np.void) -> str:
    """Where an alert's NaN/inf came from when it says it was not made at its module:
    a forward input no module produced, or another rank's gradient (recorder/alerts/alert.py
    words them); '' for one born in the module."""
    if alert["phase"] == Phase.FWD and alert["slot"] == Slot.INPUT:
        return "the data" if b"came from the data" in bytes(alert["message"]) else "tensor code"
    if alert["slot"] == Slot.STEP_GRAD:
        return "another rank"
    return ""


def step_table(rec: Recording, step: int, evals: bool = False) -> dict[int, ModuleStep]:
    """Each module's calls, time shares (self and total) and NaN/inf in one step (the
    tree's badges)."""
    calls = segment_rows(rec, "calls", step, evals, ["module", "phase", "total", "self"])
    tensors = segment_rows(
        rec, "tensors", step, evals, ["module", "phase", "slot", "nan", "posinf", "neginf"]
    )
    row = segment_row(rec, step, evals)
    length = float(row["end"] - row["start"]) if row is not None else 0.0
    masks = mask_rows(tensors)
    bad = ((tensors["nan"] > 0) | (tensors["posinf"] > 0) | (tensors["neginf"] > 0)) & ~masks
    alerts = rec.alerts
    here = alerts["segment"] == row["segment"] if row is not None else alerts["step"] < 0
    came: dict[int, set[str]] = {}
    for alert in alerts[here]:
        came.setdefault(int(alert["module"]), set()).add(_origin_from(alert))
    out = {}
    for module in set(calls["module"].tolist()) | set(tensors["module"].tolist()):
        mine = calls[calls["module"] == module]
        passes = mine["phase"] != Phase.OPT
        seconds = float(mine["self"][passes].sum())
        total = float(mine["total"][passes].sum())
        sources = came.get(module, set())
        of_module = tensors["module"] == module
        out[module] = ModuleStep(
            calls=int(np.count_nonzero(mine["phase"] == Phase.FWD)),
            seconds=seconds,
            share=seconds / length if length > 0 else 0.0,
            nonfinite=int(np.count_nonzero(bad & of_module)),
            origin=bool(sources),
            # one source for all its origins; any made here makes it born here
            origin_from=sources.pop() if len(sources) == 1 else "",
            masked=int(tensors["neginf"][masks & of_module].sum()),
            total=total,
            total_share=total / length if length > 0 else 0.0,
        )
    return out


def tensor_columns(rec: Recording) -> list[str]:
    """What the detail pane reads of a tensor row: its histogram too, if it has one."""
    return [*TENSOR_COLUMNS, *([HISTOGRAM] if rec.histogram_bins else [])]


def module_detail(rec: Recording, module: int, step: int, evals: bool = False) -> Detail:
    """Everything recorded of one module in one step: tensor summaries, call rows, full
    tensors stored, and a histogram of one of them."""
    rows = segment_rows(rec, "tensors", step, evals, tensor_columns(rec))
    calls = segment_rows(rec, "calls", step, evals, None)
    segment = segment_row(rec, step, evals)
    captured = [
        c
        for c in rec.captured(module, int(segment["step"]) if segment else step)
        if segment is None or c.segment == int(segment["segment"])
    ]
    histogram, shown = None, None
    if captured:
        first = shown = next((c for c in captured if c.slot == Slot.OUTPUT), captured[0])
        values = rec.tensor(first).astype(np.float64).ravel()
        finite = values[np.isfinite(values)]
        if finite.size:
            counts, edges = np.histogram(finite, bins=40)
            histogram = (counts.astype(float).tolist(), float(edges[0]), float(edges[-1]))
    return Detail(
        rec.modules[module],
        step,
        f"eval batch {step}" if evals else f"step {step}",
        rows[rows["module"] == module],
        calls[calls["module"] == module],
        captured,
        histogram,
        histogram_of=shown,
    )


@dataclass(frozen=True)
class ModuleRows:
    """One module's tensor summaries over a range of training steps, or of eval
    batches (``first``..``last`` are then their numbers among the eval batches)."""

    module: Module
    evals: bool
    first: int
    last: int
    rows: np.ndarray
    call_index: dict[int, int]  # call id -> nth call of the module in its step

    @property
    def span(self) -> str:
        """'step 3', 'steps 2-5', 'eval batch 1' or 'eval batches 0-3'."""
        one, many = ("eval batch", "eval batches") if self.evals else ("step", "steps")
        if self.first == self.last:
            return f"{one} {self.first}"
        return f"{many} {self.first}-{self.last}"


def eval_range(rec: Recording, first: int | None, last: int | None) -> tuple[int, int]:
    """The eval batch numbers asked for: ``first`` (default 0) to ``last`` (default,
    and at most, the last eval batch); first > last when there is none."""
    count = len(rec.evals)
    return max(first or 0, 0), count - 1 if last is None else min(last, count - 1)


def module_rows(rec: Recording, module: int, first: int, last: int, evals: bool) -> ModuleRows:
    """Every tensor summary of one module in training steps ``first``..``last``, or in
    eval batches number ``first``..``last``, and which of its calls each belongs to."""
    rows = span_rows(rec, "tensors", first, last, evals, tensor_columns(rec))
    calls = span_rows(rec, "calls", first, last, evals, ["call", "module", "index"])
    rows = rows[rows["module"] == module]
    calls = calls[calls["module"] == module]
    return ModuleRows(rec.modules[module], evals, first, last, rows, call_index(calls))


def call_index(calls: np.ndarray) -> dict[int, int]:
    """Call id -> which call of its module in its step it is (the rows' ``index``):
    how `hookdbg show` and the TUI number a module's calls."""
    return dict(zip(calls["call"].tolist(), calls["index"].tolist(), strict=True))


def plotted_path(rec: Recording, module: int, stat: PlotStat) -> str | None:
    """Which tensor of its slot a statistic of a module is plotted of: the plain output
    (""), or, for a module that returns a dict, tuple or list (a Hugging Face model's
    ``output[loss]``, ``output[logits]``; attention's ``output[0]``), the first tensor in
    it whose statistic was recorded. None for a timing or the loss."""
    if stat.slot is None:
        return None
    if stat.path is not None:
        return stat.path
    table = rec.tensors_table
    mask = (table.column("module") == module) & (table.column("slot") == stat.slot)
    paths = table.column("path")[mask]
    if not len(paths) or (paths == b"").any():
        return ""
    found, first = np.unique(paths, return_index=True)
    ordered = found[np.argsort(first)].tolist()  # as the module returned them
    for path in ordered:
        if len(_tensor_values(table, mask & (table.column("path") == path), stat)[0]):
            return utf8(path)
    return utf8(ordered[0])


def _tensor_values(table: Table, mask: np.ndarray, stat: PlotStat) -> tuple[np.ndarray, np.ndarray]:
    """The statistic of the rows in ``mask`` that have it, and their mask."""
    if stat.column == "absmax":
        values = np.maximum(np.abs(table.column("min")[mask]), np.abs(table.column("max")[mask]))
    else:
        values = table.column(stat.column)[mask]
    bad = sum(table.column(c)[mask] for c in ("nan", "posinf", "neginf"))
    # a NaN of a tensor without NaN/inf is a statistic not recorded: leave it out
    kept = (table.column("nan")[mask] >= 0) & ~(np.isnan(values) & (bad == 0))
    mask = mask.copy()
    mask[mask] = kept
    return values[kept], mask


def series(
    rec: Recording, module: int, stat: PlotStat, evals: bool = False, path: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one statistic of one module (its first call per step), over
    the training steps, or over the eval batches (numbered among them); the loss is the
    run's first loss site's (analysis/losses.py), whatever the module. A tensor
    statistic is of the tensor at ``path`` in its slot (default: ``plotted_path``)."""
    if stat.of_run:
        found = loss_series(rec)
        if evals or not found:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        return found[0].steps, found[0].values
    if stat.slot is None:
        table = rec.calls_table
        phase = Phase.FWD if stat.column == "fwd" else Phase.BWD
        mask = (table.column("module") == module) & (table.column("phase") == phase)
        values = table.column("total")[mask] * 1e3
    else:
        table = rec.tensors_table
        if path is None:
            path = plotted_path(rec, module, stat) or ""
        mask = (table.column("module") == module) & (table.column("slot") == stat.slot)
        mask &= table.column("path") == path.encode()
        values, mask = _tensor_values(table, mask, stat)
    segments = table.column("segment")[mask]
    is_eval = rec.is_eval(segments)
    if evals:
        numbers = np.searchsorted(rec.evals["segment"], segments[is_eval])
        steps, values = numbers, values[is_eval]
    else:
        steps, values = table.column("step")[mask][~is_eval], values[~is_eval]
    if not len(steps):
        return steps, values
    first = np.unique(steps, return_index=True)[1]  # the first call of each step
    return steps[first], values[first].astype(float)
