"""What a report command asks of its input before any work: the recording opened (or
one clean line and exit status 2), the steps, eval batches and module it names checked,
and the options that pick them (--rank, --step/--steps)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import click

from hookdbg.analysis.stepview import eval_range
from hookdbg.cli.common import BadInput
from hookdbg.cli.terminal import note
from hookdbg.options import OptionError, StepRange
from hookdbg.read import (
    Module,
    RankSet,
    Recording,
    RecordingError,
    Status,
    open_recording,
    open_run,
    rank_files,
)
from hookdbg.text import plural

rank_option = click.option(
    "--rank",
    type=click.IntRange(min=0),
    metavar="N",
    help="For a distributed run (run.h5 = run.rankN.h5): which rank.",
)


def open_or_fail(path: str, *, quiet: bool = False, rank: int | None = None) -> Recording:
    """Open a recording, or exit 2 with the reader's one-line reason. ``path`` may name a
    distributed run (run.h5 for run.rank0.h5, run.rank1.h5, ...): ``rank`` picks one."""
    files = {} if Path(path).exists() else rank_files(path)
    if files:
        chosen = 0 if rank is None else rank
        if chosen not in files:
            raise BadInput(f"{path} has no rank {chosen} (ranks {', '.join(map(str, files))})")
        if rank is None and not quiet:
            note(
                f"note: {path} is a {len(files)}-rank run; showing rank "
                f"{chosen} (--rank N for another)"
            )
        path = str(files[chosen])
    elif rank is not None and not quiet:
        note(f"note: {path} is one file; --rank {rank} is ignored")
    try:
        recording = open_recording(path)
    except RecordingError as exc:
        raise BadInput(str(exc)) from None
    if not quiet:
        notice = status_notice(recording)
        if notice:
            note(notice)
    return recording


def open_run_or_fail(path: str, *, quiet: bool = False) -> Recording | RankSet:
    """A recording, or all ranks of a distributed run; exit 2 on bad input."""
    try:
        run = open_run(path)
    except RecordingError as exc:
        raise BadInput(str(exc)) from None
    if not quiet:
        recordings = run.recordings.values() if isinstance(run, RankSet) else [run]
        for rec in recordings:
            notice = status_notice(rec)
            if notice:
                note(notice)
        if isinstance(run, RankSet) and run.missing:
            note(
                f"note: ranks {', '.join(map(str, run.missing))} of "
                f"{run.world_size} have no recording"
            )
    return run


def status_notice(recording: Recording) -> str | None:
    """The line that says a recording is not whole: cut short, still written, failed."""
    status = recording.status
    if status is Status.CUT_SHORT:
        return (
            f"note: {recording.path} was cut short (the recording process ended without "
            "closing it); showing everything that was flushed"
        )
    if status is Status.LIVE:
        return f"note: {recording.path} is still being written; showing what is there so far"
    if status is Status.FAILED:
        return f"note: recording {recording.path} failed ({recording.failure})"
    return None


def require_calls(recording: Recording) -> None:
    """Exit 2 for a recording without module calls: a report of them would be empty."""
    if len(recording.calls_table) == 0:
        raise BadInput(
            f"{recording.path} holds no module calls (did the script call a model while "
            "recording? was every step left out by --steps/--every?)"
        )


def step_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--step N / --steps A:B, handed to the command as ``steps=(first, last)``."""

    @click.option("--step", "one_step", type=int, metavar="N", help="Only step N.")
    @click.option("--steps", "step_range", metavar="A:B", help="Steps A to B-1 (A:, :B work too).")
    @wraps(func)
    def wrapper(*args: Any, one_step: int | None, step_range: str | None, **kwargs: Any) -> Any:
        if one_step is not None and step_range is not None:
            raise BadInput("give --step or --steps, not both")
        first = last = None
        if one_step is not None:
            first = last = one_step
        elif step_range is not None:
            try:
                r = StepRange.parse(step_range)
            except OptionError as exc:
                raise BadInput(str(exc)) from None
            first, last = r.start, None if r.stop is None else r.stop - 1
        return func(*args, steps=(first, last), **kwargs)

    return wrapper


def check_steps(recording: Recording, steps: tuple[int | None, int | None]) -> tuple[int, int]:
    """The recorded steps inside the requested range, or exit 2 saying what exists."""
    first, last = recording.step_range(*steps)
    if first > last:
        recorded = recording.recorded_steps
        have = f"steps {recorded[0]}..{recorded[-1]}" if len(recorded) else "no steps"
        if recording.dropped:
            have += (
                f" (--keep-last kept the detail of the last recorded steps only: "
                f"{plural(recording.dropped, 'earlier step')} kept their step row, loss "
                "and alerts)"
            )
        raise BadInput(f"no recorded step in the range asked for; {recording.path} has {have}")
    return first, last


def check_evals(
    recording: Recording, steps: tuple[int | None, int | None], name: str
) -> tuple[int, int]:
    """The eval batches numbered inside the requested range (--eval --step/--steps), or
    exit 2 saying which exist; ``name`` is the recording as the user named it."""
    first, last = eval_range(recording, *steps)
    if first > last:
        count = len(recording.evals)
        have = f"has eval batches 0..{count - 1}" if count else "has no eval batches"
        raise BadInput(f"no such eval batch; {name} {have}")
    return first, last


def resolve_or_fail(recording: Recording, module: str, name: str) -> Module:
    """The one module ``module`` names (a name, a path or a unique glob), or exit 2 with
    close names and where to list them; ``name`` is the recording as the user named it."""
    try:
        return recording.modules.resolve(module)
    except LookupError as exc:
        raise BadInput(f"{exc} (`hookdbg summary {name}` lists them)") from None


def check_tolerances(rtol: float, atol: float) -> None:
    """NaN would make every value differ and inf every value agree: both are typos."""
    for name, value in (("--rtol", rtol), ("--atol", atol)):
        if not (math.isfinite(value) and value >= 0):
            raise BadInput(f"{name} must be a finite number, 0 or more, not {value}")
