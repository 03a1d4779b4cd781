"""``export --format tensorboard``: a recording as TensorBoard event files.

The series come from hookdbg/analysis/scalars.py; this module only writes them, with
``torch.utils.tensorboard.SummaryWriter`` (TensorBoard's own event file writer
underneath), so that TensorBoard reads them like any training run's logs. Training
steps go to the ``train`` run and eval batches to the ``eval`` run under the log
directory, with the same tags: TensorBoard draws a module's training and validation
values on one chart, on the same global step axis. A recording made with
``--histograms`` also gives TensorBoard histograms (``MODULE/SLOT/histogram``) from
the recorded bins (hookdbg/analysis/histograms.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hookdbg.analysis.histograms import HistogramSeries, histogram_series
from hookdbg.analysis.scalars import (
    StatSelection,
    loss_scalars,
    module_series,
    notes,
    step_series,
    wall_times,
)
from hookdbg.options import ModuleFilter
from hookdbg.read.recording import Recording
from hookdbg.store.schema import StepKind

RUNS = {StepKind.TRAIN: "train", StepKind.EVAL: "eval"}
EVENT_FILES = "events.out.tfevents.*"


class TensorBoardMissing(ImportError):
    """The optional tensorboard package is not installed."""


@dataclass
class RunWritten:
    """What went into one run (``train`` or ``eval``)."""

    path: Path
    scalars: int = 0
    texts: int = 0
    histograms: int = 0
    tags: set[str] = field(default_factory=set)

    @property
    def events(self) -> int:
        return self.scalars + self.texts + self.histograms


@dataclass
class TensorBoardExport:
    """What an export wrote, for the status line and ``--json``."""

    logdir: Path
    runs: dict[str, RunWritten]

    @property
    def events(self) -> int:
        return sum(r.events for r in self.runs.values())


def existing_event_files(logdir: Path) -> list[Path]:
    """Event files an earlier export left in the runs this one writes (TensorBoard would
    show both as one run)."""
    return [f for run in RUNS.values() for f in sorted((logdir / run).glob(EVENT_FILES))]


def write_tensorboard(
    recording: Recording,
    logdir: str | os.PathLike[str],
    modules: tuple[str, ...] | list[str] = (),
    stats: StatSelection | None = None,
    first: int | None = None,
    last: int | None = None,
) -> TensorBoardExport:
    """Write the selected modules' statistics, times, the step times, the loss and the
    alerts of steps ``first``..``last`` under ``logdir`` (runs ``train`` and ``eval``)."""
    writer_class = summary_writer()
    series = [
        *module_series(recording, modules, stats, first, last),
        *step_series(recording, first, last),
        *loss_scalars(recording, first, last),
    ]
    histograms = module_histograms(recording, modules, stats, first, last)
    when = wall_times(recording)
    logdir = Path(logdir)
    result = TensorBoardExport(logdir, {})
    for kind, run in RUNS.items():
        mine = [s for s in series if s.kind == kind and len(s.steps)]
        texts = [n for n in notes(recording, first, last) if n.kind == kind]
        bins = [h for h in histograms if h.kind == kind]
        if not mine and not texts and not bins:
            continue
        written = result.runs[run] = RunWritten(logdir / run)
        writer = writer_class(log_dir=str(written.path), max_queue=1000, flush_secs=3600)
        try:
            for note in texts:
                wall = when.get((kind, note.step))
                writer.add_text(note.tag, note.text, note.step, walltime=wall)
                written.texts += 1
                written.tags.add(note.tag)
            _write_scalars(writer, mine, kind, when, written)
            write_histograms(writer, bins, kind, when, written)
        finally:
            writer.close()
    return result


def _write_scalars(
    writer: Any,
    series: list,
    kind: StepKind,
    when: dict[tuple[StepKind, int], float],
    written: RunWritten,
) -> None:
    """Every point of ``series``, step by step (as a training run logs them)."""
    if not series:
        return
    steps = np.concatenate([s.steps for s in series])
    values = np.concatenate([s.values for s in series])
    which = np.concatenate([np.full(len(s.steps), i) for i, s in enumerate(series)])
    order = np.argsort(steps, kind="stable")
    tags = [s.tag for s in series]
    add = writer.add_scalar
    for step, value, i in zip(
        steps[order].tolist(), values[order].tolist(), which[order].tolist(), strict=True
    ):
        add(tags[i], value, step, walltime=when.get((kind, step)))
    written.scalars += len(order)
    written.tags.update(tags)


def module_histograms(
    recording: Recording,
    modules: tuple[str, ...] | list[str],
    stats: StatSelection | None,
    first: int | None,
    last: int | None,
) -> list[HistogramSeries]:
    """The selected modules' histograms (``SLOT/histogram`` statistics), if recorded."""
    chosen = ModuleFilter.parse(list(modules))
    ids = np.array(
        [m.id for m in recording.modules if m.is_model_part and chosen.selects(m.name, m.path)],
        dtype=np.int64,
    )
    return histogram_series(recording, ids, stats or StatSelection(), first, last)


def write_histograms(
    writer: Any,
    series: list[HistogramSeries],
    kind: StepKind,
    when: dict[tuple[StepKind, int], float],
    written: RunWritten,
) -> None:
    """TensorBoard histograms from the recorded counts (``add_histogram_raw``: the bins
    are the recording's, nothing is binned again). Each bucket ends at its right edge;
    the mean and spread TensorBoard shows are the recorded ones where there are, else
    from the bins' centres."""
    for s in series:
        for i, step in enumerate(s.steps.tolist()):
            counts, edges = s.counts[i].astype(np.float64), s.edges[i]
            num = counts.sum()
            mean, std = float(s.means[i]), float(s.stds[i])
            if not (np.isfinite(mean) and np.isfinite(std)):
                centres = (edges[:-1] + edges[1:]) / 2
                mean = float((counts * centres).sum() / num)
                std = float(np.sqrt(max((counts * (centres - mean) ** 2).sum() / num, 0.0)))
            writer.add_histogram_raw(
                s.tag,
                min=float(edges[0]),
                max=float(edges[-1]),
                num=int(num),
                sum=mean * num,
                sum_squares=(std * std + mean * mean) * num,
                bucket_limits=edges[1:].tolist(),
                bucket_counts=counts.tolist(),
                global_step=step,
                walltime=when.get((kind, step)),
            )
            written.histograms += 1
        written.tags.add(s.tag)


def summary_writer() -> Any:
    """``torch.utils.tensorboard.SummaryWriter``, or TensorBoardMissing with the one
    line that says what to install."""
    try:
        import tensorboard  # type: ignore[import-untyped]  # noqa: F401  (torch's writer needs it)
    except ImportError:
        raise TensorBoardMissing(
            "--format tensorboard needs the tensorboard package, which is not installed: "
            "pip install 'hookdbg[tensorboard]'"
        ) from None
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter
