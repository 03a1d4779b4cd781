"""``hookdbg ctl``: steer a running recording from another terminal.

A command goes into the control file beside the recording (hookdbg/control.py says why
a file); each recorder applies it at a step boundary and answers in its recording,
which this command reads back and prints. Under torchrun one command reaches every
rank, and ``record`` and ``level`` name the step they start at, far enough ahead that
every rank sees the command before it gets there.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import click

from hookdbg.analysis.steer import SteerError, current_step, steer
from hookdbg.cli.common import BadInput, commands_answered, human_bytes, plural
from hookdbg.cli.terminal import note
from hookdbg.control import LEVELS, REFUSED, Command
from hookdbg.ranks import rank_files, run_of
from hookdbg.read import Recording, RecordingError, Status, open_recording
from hookdbg.text import printable

_POLL = 0.2  # seconds between looks for the answers


class _Seconds(click.FloatRange):
    """A number of seconds from 0 (inf: as long as it takes), not NaN."""

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        seconds = super().convert(value, param, ctx)
        if math.isnan(seconds):
            self.fail("nan is no number of seconds", param, ctx)
        return seconds


def _wait_option(f):  # type: ignore[no-untyped-def]
    return click.option(
        "--wait",
        type=_Seconds(min=0),
        default=30.0,
        show_default=True,
        metavar="SECONDS",
        help="How long to wait for every rank's answer (0: send and return). A recorder "
        "answers at its next step boundary, once its writer has flushed.",
    )(f)


@click.group(
    epilog="""\b
Examples:
  hookdbg ctl run.h5 status
  hookdbg ctl run.h5 record --steps 5
  hookdbg ctl run.h5 record --steps 20 --level timing
  hookdbg ctl run.h5 record --steps 2 --modules 'layer4.*' --capture 'layer4.1.conv2'
  hookdbg ctl run.h5 level idle
  hookdbg ctl run.h5 dump
  hookdbg ctl run.h5 stop""",
)
@click.argument("recording", type=click.Path(dir_okay=False))
@click.pass_context
def ctl(ctx: click.Context, recording: str) -> None:
    """Steer RECORDING while it is being recorded: see what it records, record the
    next steps in more (or less) detail, go idle, write the flight recorder's tensors,
    or stop recording while training goes on. RECORDING is the file `hookdbg record`
    writes (run.h5 for every rank of a torchrun run). Start a run idle with `hookdbg
    record --idle` to record nothing until asked."""
    ctx.obj = recording


@ctl.command()
@click.pass_obj
def status(recording: str) -> None:
    """What RECORDING is doing now: each rank's step, what it records, its size and
    the answers to the commands sent so far."""
    for rank, rec in _open(recording).items():
        _print_status(rank, rec)


@ctl.command()
@click.option("--steps", "count", type=int, required=True, metavar="N", help="Steps to record.")
@click.option(
    "--level",
    type=click.Choice(["timing", "shapes", "stats"]),
    help="Detail of those steps [default: the recording's --level].",
)
@click.option("--modules", multiple=True, metavar="GLOB", help="Record only these modules.")
@click.option("--capture", multiple=True, metavar="GLOB", help="Store these modules' full tensors.")
@_wait_option
@click.pass_obj
def record(
    recording: str,
    count: int,
    level: str | None,
    modules: tuple[str, ...],
    capture: tuple[str, ...],
    wait: float,
) -> None:
    """Record the next N steps, from the next step boundary (every rank from the same
    step), then go back to what was recorded before."""
    _steer(
        recording,
        wait,
        op="record",
        steps=count,
        level=level,
        modules=modules,
        capture=capture,
    )


@ctl.command()
@click.argument("level", type=click.Choice(LEVELS))
@_wait_option
@click.pass_obj
def level(recording: str, level: str, wait: float) -> None:
    """Record every step at LEVEL from the next step on; `idle` records none (the
    loss is still watched for NaN/inf)."""
    _steer(recording, wait, op="level", level=level)


@ctl.command()
@_wait_option
@click.pass_obj
def dump(recording: str, wait: float) -> None:
    """Write the tensors the flight recorder holds (the last recorded steps') now."""
    _steer(recording, wait, op="dump")


@ctl.command()
@_wait_option
@click.pass_obj
def stop(recording: str, wait: float) -> None:
    """Close the recording at the next step boundary; training goes on unrecorded."""
    _steer(recording, wait, op="stop")


# -- sending and answers ---------------------------------------------------------------


def _open(recording: str) -> dict[int, Recording]:
    """Every rank's recording (one file: rank 0), or exit 2 with why not."""
    path = Path(recording)
    files = {0: path} if path.exists() else rank_files(path)
    if not files:
        raise BadInput(f"{recording}: no such recording (nor {path.stem}.rankN{path.suffix})")
    out = {}
    for rank, file in files.items():
        try:
            out[rank] = open_recording(file)
        except RecordingError as exc:
            raise BadInput(str(exc)) from None
    return out


def _steer(recording: str, wait: float, **fields: object) -> None:
    deadline = time.monotonic() + wait
    run = run_of(recording)
    if run is not None:  # one control file serves every rank: steer them all alike
        note(f"{recording} is one rank's file of {run}: the command goes to every rank")
        recording = str(run)
    ranks = _open(recording)
    cursors = {rank: rec.info_rows for rank, rec in ranks.items()}
    try:
        command = steer(list(ranks.values()), lock_wait=max(wait, 0.5), **fields)
    except SteerError as exc:
        raise BadInput(str(exc)) from None
    who = "" if len(ranks) == 1 else f" to {len(ranks)} ranks"
    click.echo(printable(f"sent command {command.seq}{who}: {command.describe()}"))
    if wait > 0:
        _await(ranks, cursors, command, wait, deadline)


def _await(
    ranks: dict[int, Recording],
    cursors: dict[int, int],
    command: Command,
    wait: float,
    deadline: float,
) -> None:
    """Print each rank's answer to ``command`` as it comes (``cursors``: the info rows
    each had before it was sent); exit 1 if one does not come by ``deadline`` (``wait``
    seconds from the start) or if the ranks start at different steps, 2 if one
    refused it."""
    pending = dict(ranks)
    answers: dict[int, str] = {}
    others = 0  # answers to other commands meanwhile: those sent before this one
    while pending:
        for rank, rec in list(pending.items()):
            try:
                rec.refresh()
                found, cursors[rank] = rec.answers_from(cursors[rank])
            except RecordingError as exc:
                raise BadInput(str(exc)) from None
            mine = [a[3] for a in found if _answers(command, a[0], a[1], a[2])]
            others += sum(1 for a in found if not _answers(command, a[0], a[1], a[2]))
            if mine:
                answers[rank] = mine[0]
                prefix = "" if len(ranks) == 1 else f"rank {rank}: "
                click.echo(printable(f"{prefix}{mine[0]}"))
                del pending[rank]
            elif rec.status is not Status.LIVE:
                raise BadInput(
                    f"{rec.path} stopped being recorded ({rec.status.value}) before it "
                    f"read command {command.seq}"
                )
        if not pending:
            break
        if time.monotonic() >= deadline:
            missing = ", ".join(map(str, pending))
            why = (
                "a recorder reads commands at step boundaries (is the run between steps, "
                "in a long pause or a hang?)"
            )
            if others:  # lines are read in order: those came before this one
                why = (
                    "the recorder is working through commands sent before this one "
                    f"(it answered {others:,} meanwhile)"
                )
            raise click.ClickException(
                f"no answer from {plural(len(pending), 'rank')} ({missing}) in {wait:g} s: "
                f"{why}. Command {command.seq} stays sent."
            )
        time.sleep(min(_POLL, max(deadline - time.monotonic(), 0.0)))
    if any(text.startswith(REFUSED) for text in answers.values()):
        raise BadInput(f"command {command.seq} was refused (see above)")
    if command.op != "dump" and len({_first_step(text) for text in answers.values()}) > 1:
        raise click.ClickException("the ranks did not start at the same step (see above)")


def _answers(command: Command, when: float, seq: int, sent: float) -> bool:
    """Whether an answer given at ``when`` to command ``seq`` sent at ``sent`` is to
    ``command``: a number is used again in a control file made anew, the time tells
    (an answer without it, from an older recorder: given since ``command`` was sent)."""
    if seq != command.seq:
        return False
    return sent == command.sent if not math.isnan(sent) else when >= command.sent - 1.0


def _first_step(answer: str) -> str:
    """'recording steps 12-16 at stats' -> '12' (the answers ranks must agree on)."""
    words = answer.split()
    return words[2].split("-")[0] if len(words) > 2 and words[1] in ("step", "steps") else answer


def _print_status(rank: int, rec: Recording) -> None:
    info = rec.info
    where = f"rank {rank} of {info.world_size}, " if info.world_size > 1 else ""
    options = info.options
    launched = "idle" if options.get("idle") else str(options.get("level", "?"))
    recorded = rec.recorded_steps
    last = f", last {int(recorded[-1])}" if len(recorded) else ""
    size = human_bytes(os.path.getsize(rec.path))
    click.echo(
        f"{rec.path}: {rec.status.value}, {where}step {current_step(rec)}, pid {info.pid} "
        f"on {info.host}, {size}"
    )
    segments = rec.segments
    if rec.status is not Status.LIVE:
        now = "ended"
    else:
        recording = len(segments) and segments["recorded"][-1]
        now = f"{'recording' if recording else 'not recording'} now"
    alerts = f"; {plural(len(rec.alerts), 'NaN/inf alert')}" if len(rec.alerts) else ""
    click.echo(
        f"  launched {launched}, {now}; {plural(len(recorded), 'step')} recorded{last}"
        f"{alerts}; steering: {commands_answered(rec)} answered"
    )
    for when, seq, text in rec.answers[-5:]:
        stamp = time.strftime("%H:%M:%S", time.localtime(when))
        click.echo(printable(f"    {stamp}  {seq}: {text}"))
    for zoom in rec.zooms[-3:]:
        click.echo(printable(f"  after a NaN: {rec.zoom_text(zoom)}"))
    for when, text in rec.channel_notes[-3:]:
        stamp = time.strftime("%H:%M:%S", time.localtime(when))
        click.echo(printable(f"  control file, {stamp}: {text}"))
