"""``hookdbg record``: run a training script unchanged, with every module call recorded."""

from __future__ import annotations

import atexit
import contextlib
import errno
import importlib.util
import os
import shlex
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hookdbg.cli.common import BadInput, human_bytes, plural
from hookdbg.options import ON_HEADROOM_ACTIONS, ZOOM_STEPS, OptionError, RecordOptions
from hookdbg.ranks import placement, rank_path
from hookdbg.store import owner
from hookdbg.text import printable_lines

if TYPE_CHECKING:  # the recorder imports torch: only once the arguments are known good
    from hookdbg.recorder import Recorder


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    epilog="""\b
Examples:
  hookdbg record -o run.h5 train.py --epochs 1
  hookdbg record -o run.h5 -m mypkg.train -- --lr 0.1
  hookdbg record --modules 'layer3.*' --modules '!*.bn*' --steps 10:20 train.py
  hookdbg record --histograms 32 -o run.h5 train.py
  hookdbg record --idle -o run.h5 train.py     (then: hookdbg ctl run.h5 record --steps 5)
  torchrun --nproc-per-node 2 -m hookdbg record -o run.h5 train_ddp.py""",
)
@click.option(
    "-o",
    "--output",
    metavar="FILE",
    help="Recording to write [default: hookdbg-SCRIPT.PID.h5, removed again if the run "
    "recorded nothing]. Under torchrun each rank writes FILE with .rankN before the suffix.",
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
    "--idle",
    is_flag=True,
    help="Record no step until `hookdbg ctl FILE record --steps N` (from another "
    "terminal) asks; the loss is still watched for NaN/inf. For long runs.",
)
@click.option(
    "--keep-last",
    type=int,
    default=0,
    metavar="N",
    help="Keep the full detail (module calls, tensors, captures) of the last N recorded "
    "steps only; every step's row, loss and alert and every flight-recorder dump stay. "
    "Bounds a long run's file (about twice what it keeps). 0: keep all.",
)
@click.option(
    "--on-nan",
    default="record",
    show_default=True,
    metavar="ACTION",
    help="What the origin of a NaN or +/-inf does: record[=N] warns, and where the step's "
    "module calls were not checked (below --level stats, a step --every or --idle leaves "
    f"out) records the next N steps (default {ZOOM_STEPS}) at stats to find where it was "
    "born; warn only warns; break drops into pdb there (stop without a terminal); raise "
    "raises hookdbg.NonFiniteError in the script; stop ends the run (exit status 3).",
)
@click.option(
    "--headroom",
    type=float,
    default=0.5,
    show_default=True,
    metavar="SHARE",
    help="Warn, before it overflows, when a module output in float16, bfloat16 or an "
    "fp8 format reaches this share of its dtype's largest finite value, or climbs "
    "fast enough to cross it within 2 steps (at --level stats).",
)
@click.option(
    "--on-headroom",
    type=click.Choice(ON_HEADROOM_ACTIONS),
    default="warn",
    show_default=True,
    help="What a headroom warning does: as --on-nan (warn, break, raise, stop).",
)
@click.option(
    "--nan-check/--no-nan-check",
    default=None,
    help="Check every summarised tensor for NaN/inf [default: at --level stats]. Where "
    "tensors are not checked (timing, shapes, steps not recorded) a sentinel still reads "
    "the model's outputs, the loss and the gradients once a step; --nan-check at "
    "timing/shapes checks every tensor by min/max, --no-nan-check checks nothing.",
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
    "cannot keep up) captured tensors are dropped first, the statistics last, and "
    "counted in the file.",
)
@click.option(
    "--histograms",
    metavar="N",
    help="Also keep a histogram of each summarised tensor's finite values: N bins (1 to "
    "1024) from its min to its max, shown by `show` and the TUI and exported to "
    "TensorBoard. Off by default.",
)
@click.option("-f", "--force", is_flag=True, help="Overwrite FILE if it exists.")
@click.option(
    "-q",
    "--quiet",
    is_flag=True,
    help="No status lines from hookdbg; NaN/inf alerts are still printed.",
)
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
    and exit status come through unchanged (after Ctrl-C hookdbg ends by SIGINT, as
    python does); hookdbg's status lines go to stderr.
    """
    exit_signal = _SignalAtExit()  # first: the script's exit handlers, registered later, run before
    atexit.register(exit_signal)
    script_args = list(args[1:] if args[:1] == ("--",) else args)
    try:  # everything that can be refused is, before torch loads
        opts = RecordOptions.build(**options)  # the other options carry its argument names
    except OptionError as exc:
        raise BadInput(str(exc)) from None
    script = Target(target, as_module)
    script.check()
    path = rank_path(Path(output) if output else Path(f"hookdbg-{script.stem}.{os.getpid()}.h5"))
    existed = _check_output(path, force)

    from hookdbg.recorder import Recorder, RecordError
    from hookdbg.recorder.runner import run

    try:
        recorder = Recorder(path, opts, force=force, argv=[target, *script_args]).start()
    except RecordError as exc:
        raise BadInput(str(exc)) from None
    prefix = placement().prefix
    say = _status_printer(prefix, opts.quiet)
    level = "idle: `hookdbg ctl` starts it" if opts.idle else f"level {options['level']}"
    say(f"recording {target} -> {path} ({level})")
    ended = run(target, as_module, script_args, recorder)
    if output is None and not existed and _recorded_nothing(recorder):  # a name of ours
        path.unlink(missing_ok=True)
        say(f"nothing recorded (no module call, step or alert): removed {path}")
    elif recorder.failure is not None:  # never hidden by -q
        click.echo(f"{prefix}{printable_lines(_status_line(recorder, path))}", err=True)
    else:
        say(_status_line(recorder, path))
    if ended.code == 2 and recorder.calls_recorded == 0:
        _misplaced_hint(prefix, target, script_args)
    unmatched = opts.modules.unmatched([(i.name, i.path) for i in recorder.modules])
    for glob in (g for g in unmatched if g not in recorder.unmatched_globs):  # not said yet
        say(f"--modules {glob!r} matched no module (names look like {_example_name(recorder)})")
    sys.stdout.flush()
    if ended.status == "interrupted":
        exit_signal.signum = signal.SIGINT
    sys.exit(ended.code)


@dataclass(frozen=True)
class Target:
    """What to run: a script path as typed, or a module name (``-m``)."""

    name: str
    as_module: bool = False

    def check(self) -> None:
        """Refuse a target that cannot be found, before torch loads and before any
        file is created."""
        if self.as_module:
            sys.path.insert(0, os.getcwd())  # where python -m looks first
            try:
                spec = importlib.util.find_spec(self.name)
            except (ImportError, ValueError) as exc:
                raise BadInput(f"cannot find module {self.name!r}: {exc}") from None
            finally:
                sys.path.remove(os.getcwd())
            if spec is None:
                raise BadInput(f"no module named {self.name!r} (from {os.getcwd()})")
        elif not Path(self.name).is_file():
            what = "is a directory, not a script" if Path(self.name).is_dir() else "not found"
            raise BadInput(f"script {self.name!r} {what}")

    @property
    def stem(self) -> str:
        return self.name.rpartition(".")[2] if self.as_module else Path(self.name).stem


def _check_output(path: Path, force: bool) -> bool:
    """Refuse, before torch loads, an output the recorder would refuse or could not
    create; whether ``path`` exists already (to be replaced: --force)."""
    refused = owner.not_writable(path, force)
    if refused is not None:
        raise BadInput(refused)
    folder = path.parent
    if not folder.is_dir():
        reason = errno.ENOTDIR if folder.exists() else errno.ENOENT
        raise BadInput(f"cannot create {path}: {os.strerror(reason)}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise BadInput(f"cannot create {path}: {os.strerror(errno.EACCES)}")
    return path.exists()


def _recorded_nothing(recorder: Recorder) -> bool:
    """The script made no module call and no optimizer step, and no alert: the file
    holds the run's metadata and nothing else. Removed where hookdbg chose the name;
    one the user named (-o) is what they asked for, and `hookdbg summary` reads it."""
    return not (
        recorder.modules
        or recorder.steps_recorded
        or recorder.evals_recorded
        or recorder.calls_recorded
        or recorder.detector.alerts
        or recorder.write_error
        or recorder.failure
    )


class _SignalAtExit:
    """Ends the process by ``signum`` (once set) at exit, as python ends itself by
    SIGINT after an uncaught KeyboardInterrupt, so that the parent sees the signal
    (-2; a shell shows 130). At exit, not at once: the exit handlers registered after
    this one (the script's, torch's) run first, as they would under python."""

    signum: int | None = None

    def __call__(self) -> None:
        if self.signum is None:
            return
        logging = sys.modules.get("logging")
        if logging is not None:  # its exit handler was registered before this one
            logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # closed or broken by the script
                stream.flush()
        signal.signal(self.signum, signal.SIG_DFL)
        os.kill(os.getpid(), self.signum)


def _status_printer(prefix: str, quiet: bool) -> Callable[[str], None]:
    """hookdbg's status lines, on stderr with this rank's prefix; none with -q."""
    if quiet:
        return lambda _msg: None
    return lambda msg: click.echo(f"{prefix}{printable_lines(msg)}", err=True)


def _misplaced_hint(prefix: str, target: str, script_args: list[str]) -> None:
    """The script exited 2 (a usage error) before any module call: if hookdbg's own
    options were among its arguments, say where they go."""
    misplaced, rest = _misplaced_options(script_args)
    if not misplaced:
        return
    fixed = shlex.join(["hookdbg", "record", *misplaced, target, *rest])
    click.echo(
        f"{prefix}the script exited with status 2 before any module call, and hookdbg "
        f"options were given after it: they go before the script, as in `{fixed}`",
        err=True,
    )


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
    if recorder.failure is not None:
        return (
            f"recording FAILED: {recorder.failure}; the file holds the "
            f"{', '.join(parts)} before it -> {path} ({size}, status failed)"
        )
    if error is None and recorder.dropped_rows:  # what the file holds, of what was seen
        held = _held(path)
        holds = f"recorded {held}" if held is not None else "recorded"
        if held is None or held != ", ".join(parts[:-1]):
            holds += f" of the {', '.join(parts[:-1])} seen"
        return (
            f"{holds}, {parts[-1]} -> {path} ({size}); {recorder.dropped_rows:,} rows DROPPED "
            "(the disk could not keep up; counted in the file)"
        )
    if error is None:
        return f"recorded {', '.join(parts)} -> {path} ({size})"
    held = plural(recorder.steps_written, "step or eval batch", "steps and eval batches")
    return (
        f"writing {path} stopped early ({error}): it holds {held} of the {', '.join(parts)} "
        f"seen, and {recorder.dropped_rows:,} rows were lost ({size}; `hookdbg summary "
        f"{path}` says when writing stopped)"
    )


def _held(path: Path) -> str | None:
    """The steps, eval batches and module calls the closed file holds, as the end line
    says them; None where it cannot be read back."""
    from hookdbg.read import RecordingError, open_recording
    from hookdbg.store.schema import Phase

    try:
        with open_recording(path) as rec:
            evals = len(rec.evals)
            calls = int((rec.calls_table.column("phase") == Phase.FWD).sum())
            return ", ".join(
                [
                    plural(len(rec.recorded_steps), "step"),
                    *([plural(evals, "eval batch", "eval batches")] if evals else []),
                    plural(calls, "module call"),
                ]
            )
    except RecordingError:
        return None


def _example_name(recorder: Recorder) -> str:
    names = [i.name for i in recorder.modules if i.depth > 0][:2]
    return ", ".join(repr(n) for n in names) or "none were recorded"
