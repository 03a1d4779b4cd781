"""``export --format tensorboard``: a recording as TensorBoard event files.

The series come from hookdbg/analysis/scalars.py; this module only writes them, with
``torch.utils.tensorboard.SummaryWriter`` (TensorBoard's own event file writer
underneath), so that TensorBoard reads them like any training run's logs. Training
steps go to the ``train`` run and eval batches to the ``eval`` run under the log
directory, with the same tags: TensorBoard draws a module's training and validation
values on one chart, on the same global step axis.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hookdbg.analysis.scalars import (
    StatSelection,
    module_series,
    notes,
    step_series,
    wall_times,
)
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
    tags: set[str] = field(default_factory=set)

    @property
    def events(self) -> int:
        return self.scalars + self.texts


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
    """Write the selected modules' statistics, times, the step times and the alerts of
    steps ``first``..``last`` under ``logdir`` (runs ``train`` and ``eval``)."""
    writer_class = summary_writer()
    series = [
        *module_series(recording, modules, stats, first, last),
        *step_series(recording, first, last),
    ]
    when = wall_times(recording)
    logdir = Path(logdir)
    result = TensorBoardExport(logdir, {})
    for kind, run in RUNS.items():
        mine = [s for s in series if s.kind == kind and len(s.steps)]
        texts = [n for n in notes(recording, first, last) if n.kind == kind]
        if not mine and not texts:
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
