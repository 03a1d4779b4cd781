"""The torch side of hookdbg: everything that runs inside the training process."""

from __future__ import annotations

import os

from hookdbg.options import Level, OptionError, RecordOptions, StepRange
from hookdbg.ranks import rank_path
from hookdbg.recorder.alerts.actions import HeadroomError, NonFiniteError, NonFiniteStop
from hookdbg.recorder.core import Recorder, RecordError

__all__ = [
    "HeadroomError",
    "Level",
    "NonFiniteError",
    "NonFiniteStop",
    "RecordError",
    "RecordOptions",
    "Recorder",
    "StepRange",
    "record",
]


def record(
    path: str | os.PathLike[str] = "hookdbg.h5",
    *,
    level: str | Level = "stats",
    modules: str | list[str] | tuple[str, ...] | None = None,
    every: int = 1,
    steps: str | StepRange | None = None,
    on_nan: str = "record",
    headroom: float = 0.5,
    on_headroom: str = "warn",
    nan_check: bool | None = None,
    capture: str | list[str] | tuple[str, ...] | None = None,
    capture_steps: str | StepRange | None = None,
    capture_budget_mb: float = 512,
    flight_recorder_mb: float = 256,
    max_backlog_mb: float = 256,
    force: bool = False,
    quiet: bool = False,
    flush_interval: float = 1.0,
    histograms: int | None = None,
    idle: bool = False,
    keep_last: int = 0,
) -> Recorder:
    """A recorder for ``with hookdbg.record("run.h5"): train()``.

    Same options as ``hookdbg record``: ``level`` timing|shapes|stats, ``modules``
    globs (``!glob`` excludes), ``every`` N steps, ``steps`` "A:B", ``on_nan``
    record[=N]|warn|break|raise|stop, ``headroom`` the share of a reduced-range dtype's range at
    which a module output warns before it overflows, ``on_headroom`` what that warning
    does (as ``on_nan``), ``capture`` globs of modules whose full tensors to store,
    ``histograms`` N bins of each summarised tensor's values (None: none), ``idle``:
    record no step until steered (``rec.record_next(5)``, ``hookdbg ctl``), ``keep_last``
    N: keep the detail of the last N recorded steps only (0: all).
    On one of several ranks (torchrun) it records into that rank's file, as the CLI
    does: ``run.h5`` becomes ``run.rank1.h5`` (the recorder's ``path`` says which).
    """
    try:
        options = RecordOptions.build(
            level=level,
            modules=modules,
            every=every,
            steps=steps,
            on_nan=on_nan,
            headroom=headroom,
            on_headroom=on_headroom,
            nan_check=nan_check,
            capture=capture,
            capture_steps=capture_steps,
            capture_budget_mb=capture_budget_mb,
            flight_recorder_mb=flight_recorder_mb,
            max_backlog_mb=max_backlog_mb,
            quiet=quiet,
            flush_interval=flush_interval,
            histograms=histograms,
            idle=idle,
            keep_last=keep_last,
        )
    except OptionError as exc:
        raise exc.as_keywords() from None
    return Recorder(rank_path(path), options, force=force)
