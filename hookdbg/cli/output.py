"""How report commands open recordings and print: rich tables on a terminal, plain JSON
for machines, and one clean line for every bad input.

Everything printed for people goes through ``Output``, ``table``/``DataTable``,
``literal`` or ``note``, which show a recording's strings (module names, paths,
messages, the command line) as text: control characters escaped (``\\x1b``), rich markup
(``[bold]``) and emoji codes (``:smile:``) left as they are. ``--json`` output is exact:
JSON escapes control characters itself.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Sequence
from functools import wraps
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from hookdbg.analysis.stepview import eval_range
from hookdbg.cells import CHANGED_NOTE, FRACTIONS, STATS, label, num, shape_text, tensor_text
from hookdbg.cli.common import BadInput
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
from hookdbg.store.schema import CHANGED_IN_PLACE, SUMMARY_COLUMNS, Phase, Slot
from hookdbg.text import plural, printable, utf8


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


def note(message: str) -> None:
    """A status line for people, on stderr (it may name files from a recording)."""
    click.echo(f"hookdbg: {printable(message)}", err=True)


def literal(value: object) -> str:
    """``value`` as plain text inside rich markup: ``[bold]`` in a module name prints as
    ``[bold]``, and control characters print escaped. Use it (not rich's ``escape``)
    for anything a recording or a user supplied."""
    return escape(printable(str(value)))


def _lines(text: str) -> str:
    """``printable`` line by line: a report's own line breaks stay line breaks."""
    return "\n".join(printable(line) for line in text.split("\n"))


def status_notice(recording: Recording) -> str | None:
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


rank_option = click.option(
    "--rank",
    type=click.IntRange(min=0),
    metavar="N",
    help="For a distributed run (run.h5 = run.rankN.h5): which rank.",
)


def require_calls(recording: Recording) -> None:
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


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def emit_json(data: object) -> None:
    click.echo(json.dumps(_plain(data), indent=2))


def _plain(value: object) -> object:
    """JSON has no NaN or infinity: NaN becomes null, infinities the strings "inf"/"-inf"."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):
        return _plain(value.item())  # numpy scalars
    if isinstance(value, bytes):
        return utf8(value)
    return value


class Output:
    """Prints rich markup and tables to stdout, without the trailing spaces rich pads
    lines with (they clutter files and CI logs), and without colour when piped. A
    control character in markup is escaped here too, whatever the caller forgot."""

    def __init__(self) -> None:
        tty = sys.stdout.isatty()
        self._console = Console(
            highlight=False,
            emoji=False,
            soft_wrap=False,
            width=None if tty else 200,
            force_terminal=tty,
            no_color=not tty,
        )

    def print(self, *renderables: Any) -> None:
        renderables = tuple(_lines(r) if isinstance(r, str) else r for r in renderables)
        with self._console.capture() as capture:
            self._console.print(*renderables)
        text = "\n".join(line.rstrip() for line in capture.get().splitlines())
        click.echo(text)


def console() -> Output:
    return Output()


class DataTable(Table):
    """A table whose title and string cells are shown as they are: module names, slots
    (``param_grad[weight]``) and queries are data, not rich markup, and their control
    characters print escaped."""

    def add_row(self, *cells: Any, **kwargs: Any) -> None:  # type: ignore[override]
        super().add_row(*(Text(printable(c)) if isinstance(c, str) else c for c in cells), **kwargs)


def table(title: str | None, columns: Sequence[str | tuple[str, str]]) -> Table:
    """A plain table; a column given as (name, "right") is right-aligned."""
    t = DataTable(
        title=Text(_lines(title)) if title is not None else None,
        box=box.SIMPLE_HEAD,
        title_justify="left",
        pad_edge=False,
    )
    for col in columns:
        name, justify = (col, "left") if isinstance(col, str) else col
        t.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    return t


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def step_text(rec: Recording, row: Any) -> str:
    """The step column of a row: its step number, or 'eval N' for an eval batch."""
    if "segment" in row.dtype.names:
        label = rec.segment_label(int(row["segment"]))
        if label.startswith("eval batch "):
            return "eval " + label.removeprefix("eval batch ")
    return str(int(row["step"]))


def tensor_table(
    title: str | None,
    rows: Any,
    rec: Recording,
    *,
    module_column: bool = True,
    call_index: dict[int, int] | None = None,
) -> Table:
    """Tensor summary rows as a table: where (step, module, phase, slot) and statistics;
    with ``call_index`` (call id -> nth call of its module in the step), which call."""
    cols: list[str | tuple[str, str]] = [("step", "right")]
    if call_index is not None:
        cols.append(("call", "right"))
    if module_column:
        cols.append("module")
    cols += [
        "phase",
        "slot",
        "shape",
        "dtype",
        ("min", "right"),
        ("max", "right"),
        ("mean", "right"),
        ("std", "right"),
        ("norm", "right"),
        ("nan/inf", "right"),
        *((label(name), "right") for name in FRACTIONS),
    ]
    t = table(title, cols)
    for r in rows:
        text = tensor_text(r)
        cells: list[str | Text] = [step_text(rec, r)]
        if call_index is not None:
            index = call_index.get(int(r["call"]))
            cells.append("-" if index is None else str(index))
        if module_column:
            cells.append(rec.modules.name(int(r["module"])))
        cells += [
            text.phase,
            text.slot,
            text.shape,
            text.dtype,
            *(num(text.values[name]) for name in STATS),
            Text(text.count, style="bold red") if text.nonfinite > 0 else text.count,
            *(text.fractions[name] for name in FRACTIONS),
        ]
        if text.nonfinite == CHANGED_IN_PLACE:
            t.caption = CHANGED_NOTE
        t.add_row(*cells)
    return t


def tensor_json(row: Any, rec: Recording) -> dict[str, object]:
    label = rec.segment_label(int(row["segment"])) if "segment" in row.dtype.names else ""
    out: dict[str, object] = {
        "step": int(row["step"]),
        "eval_batch": int(label.removeprefix("eval batch ")) if label.startswith("eval") else None,
        "module": rec.modules.name(int(row["module"])),
        "phase": Phase(int(row["phase"])).label,
        "slot": Slot(int(row["slot"])).label,
        "path": utf8(row["path"]),
    }
    for name in SUMMARY_COLUMNS:
        if name in row.dtype.names and name != "device":
            value = row[name]
            out[name] = shape_text(value) if name == "shape" else value
    if "nan" in row.dtype.names:
        out["changed_in_place"] = bool(row["nan"] == CHANGED_IN_PLACE)
    return out
