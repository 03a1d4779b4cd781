"""``hookdbg record``: run a training script unchanged, with every module call recorded."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hookdbg.cli.common import BadInput, human_bytes, plural
from hookdbg.options import ON_NAN_ACTIONS, OptionError, RecordOptions
from hookdbg.ranks import placement, rank_path

if TYPE_CHECKING:  # the recorder imports torch: only when a recording starts
    from hookdbg.recorder import Recorder


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    epilog="""\b
Examples:
  hookdbg record -o run.h5 train.py --epochs 1
  hookdbg record -o run.h5 -m mypkg.train -- --lr 0.1
  hookdbg record --modules 'layer3.*' --modules '!*.bn*' --steps 10:20 train.py
  hookdbg record --histograms 32 -o run.h5 train.py
  torchrun --nproc-per-node 2 -m hookdbg record -o run.h5 train_ddp.py""",
)
@click.option(
    "-o",
    "--output",
    metavar="FILE",
    help="Recording to write [default: hookdbg-SCRIPT.PID.h5]. Under torchrun "
    "each rank writes FILE with .rankN before the suffix.",
)
@click.option("-m", "as_module", is_flag=True, help="Run TARGET as a module, like python -m.")
@click.option(
    "--level",
    type=click.Choice(["timing", "shapes", "stats"]),
    default="stats",
    show_default=True,
    help="timing: forward/backward times; shapes: + tensor shapes and dtypes; "
    "stats: + min/max/mean/std/norm/NaN/inf and NaN alerts.",
)
@click.option(
    "--modules",
    multiple=True,
    metavar="GLOB",
    help="Record only modules matching GLOB (repeatable); !GLOB excludes. Globs "
    "match 'model.layer3.0.conv1' or 'layer3.0.conv1'.",
)
@click.option(
    "--every", type=int, default=1, show_default=True, metavar="N", help="Record every Nth step."
)
@click.option(
    "--steps",
    metavar="A:B",
    help="Record steps A to B-1 only (A:, :B and N work too).",
)
@click.option(
    "--on-nan",
    type=click.Choice(ON_NAN_ACTIONS),
    default="warn",
    show_default=True,
    help="What the origin of a NaN or +/-inf does: warn and go on; break into pdb there "
    "(falls back to stop without a terminal); raise hookdbg.NonFiniteError in the script; "
    "or stop the run (exit status 3).",
)
@click.option(
    "--nan-check/--no-nan-check",
    default=None,
    help="Check every summarised tensor for NaN/inf [default: on at --level stats]; "
    "at timing/shapes, --nan-check adds a cheap min/max check, and the weights' norms "
    "after each optimizer step.",
)
@click.option(
    "--capture",
    multiple=True,
    metavar="GLOB",
    help="Store the full input, output and gradient tensors of matching modules "
    "(repeatable; !GLOB excludes).",
)
@click.option("--capture-steps", metavar="A:B", help="Steps whose tensors --capture stores.")
@click.option(
    "--capture-budget",
    "capture_budget_mb",
    type=float,
    default=512,
    show_default=True,
    metavar="MB",
    help="Stop --capture after this many MB (with a message).",
)
@click.option(
    "--flight-recorder",
    "flight_recorder_mb",
    type=float,
    default=256,
    show_default=True,
    metavar="MB",
    help="Memory for the last two steps' tensors; when a NaN/inf origin fires, those "
    "of the origin and its neighbours are written to the file. 0 turns it off.",
)
@click.option(
    "--max-backlog",
    "max_backlog_mb",
    type=float,
    default=256,
    show_default=True,
    metavar="MB",
    help="Memory for rows and captured tensors waiting to be written; past it (the disk "
    "cannot keep up) they are dropped and counted in the file.",
)
@click.option(
    "--histograms",
    metavar="N",
    help="Also keep a histogram of each summarised tensor's finite values: N bins (1 to "
    "1024) from its min to its max, shown by `show` and the TUI and exported to "
    "TensorBoard. Off by default.",
)
@click.option("-f", "--force", is_flag=True, help="Overwrite FILE if it exists.")
@click.option("-q", "--quiet", is_flag=True, help="No status lines from hookdbg.")
@click.option(
    "--flush-interval",
    type=float,
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="Longest time recorded rows wait before they are on disk.",
)
@click.argument("target")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def record(
    output: str | None,
    as_module: bool,
    force: bool,
    target: str,
    args: tuple[str, ...],
    **options: Any,
) -> None:
    """Run TARGET (a script, or a module with -m) with every module call recorded.

    ARGS go to the script untouched; a `--` right after TARGET is dropped, so
    `hookdbg record train.py -- --help` shows the script's help. The script's output
    and exit status come through unchanged; hookdbg's status lines go to stderr.
    """
    from hookdbg.recorder import Recorder, RecordError
    from hookdbg.recorder.runner import Target, run

    script_args = list(args[1:] if args[:1] == ("--",) else args)
    try:
        opts = RecordOptions.build(**options)  # the other options carry its argument names
        goal = Target(target, as_module)
        goal.check()
        path = rank_path(Path(output) if output else Path(f"hookdbg-{goal.stem}.{os.getpid()}.h5"))
        recorder = Recorder(path, opts, force=force, argv=[target, *script_args]).start()
    except (OptionError, RecordError) as exc:
        raise BadInput(str(exc)) from None
    prefix = placement().prefix
    say = _status_printer(prefix, opts.quiet)
    say(f"recording {target} -> {path} (level {options['level']})")
    code = run(goal, script_args, recorder)
    say(_status_line(recorder, path))
    if code == 2 and recorder.calls_recorded == 0:
        _misplaced_hint(prefix, target, script_args, path if output is None else None)
    unmatched = opts.modules.unmatched([(i.name, i.path) for i in recorder.modules])
    for glob in (g for g in unmatched if g not in recorder.unmatched_globs):  # not said yet
        say(f"--modules {glob!r} matched no module (names look like {_example_name(recorder)})")
    sys.stdout.flush()
    sys.exit(code)


def _status_printer(prefix: str, quiet: bool) -> Callable[[str], None]:
    """hookdbg's status lines, on stderr with this rank's prefix; none with -q."""
    if quiet:
        return lambda _msg: None
    return lambda msg: click.echo(f"{prefix}{msg}", err=True)


def _misplaced_hint(prefix: str, target: str, script_args: list[str], empty: Path | None) -> None:
    """The script exited 2 (a usage error) before any module call: if hookdbg's own
    options were among its arguments, say where they go, and remove ``empty``, a file
    named for this run that holds nothing."""
    misplaced, rest = _misplaced_options(script_args)
    if not misplaced:
        return
    fixed = shlex.join(["hookdbg", "record", *misplaced, target, *rest])
    click.echo(
        f"{prefix}the script exited with status 2 before any module call, and hookdbg "
        f"options were given after it: they go before the script, as in `{fixed}`",
        err=True,
    )
    if empty is not None:
        empty.unlink(missing_ok=True)
        click.echo(f"{prefix}removed {empty}: nothing was recorded in it", err=True)


def _misplaced_options(script_args: list[str]) -> tuple[list[str], list[str]]:
    """hookdbg record's own options (with their values) found among the script's
    arguments, and the script's arguments without them."""
    takes_value = {}
    for param in record.params:
        if isinstance(param, click.Option):
            for opt in (*param.opts, *param.secondary_opts):
                takes_value[opt] = not param.is_flag
    ours: list[str] = []
    rest: list[str] = []
    args = iter(script_args)
    for arg in args:
        name = arg.split("=", 1)[0]
        if name not in takes_value:
            rest.append(arg)
            continue
        ours.append(arg)
        if takes_value[name] and "=" not in arg:
            ours.append(next(args, ""))
    return ours, rest


def _status_line(recorder: Recorder, path: Path) -> str:
    """What the file holds, never more: if writing stopped early, only what reached it."""
    size = human_bytes(path.stat().st_size) if path.exists() else "no file"
    error = recorder.write_error
    evals = recorder.evals_recorded
    parts = [
        plural(recorder.steps_recorded, "step"),
        *([plural(evals, "eval batch", "eval batches")] if evals else []),
        plural(recorder.calls_recorded, "module call"),
        plural(recorder.detector.alerts, "alert"),
    ]
    if error is None:
        line = f"recorded {', '.join(parts)} -> {path} ({size})"
        if recorder.dropped_rows:
            line += (
                f"; {recorder.dropped_rows:,} rows DROPPED (the disk could not keep up; "
                "counted in the file)"
            )
        return line
    held = plural(recorder.steps_written, "step or eval batch", "steps and eval batches")
    return (
        f"writing {path} stopped early ({error}): it holds {held} of the {', '.join(parts)} "
        f"seen, and {recorder.dropped_rows:,} rows were lost ({size}; `hookdbg summary "
        f"{path}` says when writing stopped)"
    )


def _example_name(recorder: Recorder) -> str:
    names = [i.name for i in recorder.modules if i.depth > 0][:2]
    return ", ".join(repr(n) for n in names) or "none were recorded"
