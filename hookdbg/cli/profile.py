"""``hookdbg profile``: which modules take the time, forward and backward."""

from __future__ import annotations

import math
from dataclasses import dataclass

import click
from rich.table import Table

from hookdbg.analysis.overview import after_training, after_training_text
from hookdbg.analysis.profile import SORT_KEYS, Profile, ProfileRow, StepTime, profile
from hookdbg.cli.inputs import check_steps, open_or_fail, rank_option, require_calls, step_options
from hookdbg.cli.report import Report, emit, json_option
from hookdbg.cli.tables import ms, table
from hookdbg.cli.terminal import Output, literal
from hookdbg.read import Recording
from hookdbg.store.schema import Phase

_PHASES = {"fwd": (Phase.FWD,), "bwd": (Phase.BWD,), "opt": (Phase.OPT,), "all": None}


@click.command(name="profile")
@click.argument("recording")
@rank_option
@step_options
@click.option(
    "--sort",
    type=click.Choice(SORT_KEYS),
    default="self",
    show_default=True,
    help="Order rows by self time, total time, calls per step or name.",
)
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    metavar="K",
    help="Show the K first rows.",
)
@click.option(
    "--phase",
    type=click.Choice(list(_PHASES)),
    default="all",
    show_default=True,
    help="Forward, backward, optimizer steps, or all.",
)
@json_option
def profile_command(
    recording: str,
    rank: int | None,
    steps: tuple[int | None, int | None],
    sort: str,
    top: int,
    phase: str,
    as_json: bool,
) -> None:
    """Per-module time in RECORDING: self time (without recorded submodules) and total
    time per step, mean and median over the steps, calls per step, and share of the
    step time; then where each step's time went (forward, backward, optimizer, outside
    modules), parts that add up to the step. Every second is counted once; times
    exclude hookdbg's own, which is given apart. A model on a CUDA device also has each
    call timed on the device (CUDA events): those columns come first and sort the
    rows; the host's times beside them are the time to launch its kernels."""
    rec = open_or_fail(recording, quiet=as_json, rank=rank)
    require_calls(rec)
    first, last = check_steps(rec, steps)
    prof = profile(rec, first, last, _PHASES[phase])
    emit(ProfileReport(rec, prof, prof.sorted(sort, top), sort), as_json=as_json)


@dataclass
class ProfileReport(Report):
    """The profile of a range of steps, with the rows shown (sorted, the top ones)."""

    rec: Recording
    prof: Profile
    rows: list[ProfileRow]
    sort: str

    def to_json(self) -> dict[str, object]:
        rec, prof, rows = self.rec, self.prof, self.rows
        return {
            "recording": str(rec.path),
            "first_step": prof.first,
            "last_step": prof.last,
            "steps": prof.steps,
            "step_seconds_mean": prof.step_mean,
            "step_seconds_median": prof.step_median,
            "after_training_seconds": after_training(rec),
            "seconds_per_step": {
                "step": prof.time.step,
                **{name.replace(" ", "_"): value for name, value in prof.time.parts.items()},
                "hookdbg": None if math.isnan(prof.time.hookdbg) else prof.time.hookdbg,
            },
            "rows": [
                {
                    "module": r.module.name,
                    "type": r.module.type,
                    "phase": Phase(r.phase).label,
                    "steps": r.steps,
                    "calls_per_step": r.calls_per_step,
                    "self_mean": r.self_mean,
                    "self_median": r.self_median,
                    "total_mean": r.total_mean,
                    "total_median": r.total_median,
                    "share": r.share,
                    "device_self_mean": None
                    if math.isnan(r.device_self_mean)
                    else r.device_self_mean,
                    "device_total_mean": (
                        None if math.isnan(r.device_total_mean) else r.device_total_mean
                    ),
                }
                for r in rows
            ],
        }

    def render(self, out: Output) -> None:
        rec, prof, rows = self.rec, self.prof, self.rows
        out.print(_profile_table(rec, prof, rows, self.sort))
        out.print(f"  {literal(_time_line(prof.time))}")
        after = after_training(rec)
        if after is not None and len(rec.steps) and prof.last == int(rec.steps["step"][-1]):
            out.print(f"  {literal(after_training_text(after))}")
        out.print(
            "  [dim]ms per step: all calls of the module in a step (mean and median over the "
            "steps it ran in); self: without its recorded submodules; self share: of the "
            "time of all steps in the range; backward() rows: what a backward pass spent "
            "outside recorded modules (the loss computation's backward, tensor code between "
            "modules, a DDP all-reduce)[/dim]"
        )
        if prof.on_device:
            out.print(
                "  [dim]device: the same times on the GPU (CUDA events on the current stream, "
                "the step's wall time there); host: the time to queue its kernels[/dim]"
            )
        hidden = len(prof.rows) - len(rows)
        if hidden > 0:
            out.print(f"  ... {hidden} more rows (--top {len(prof.rows)} shows all)")


def _time_line(time: StepTime) -> str:
    """'per step (mean): 12.1 ms = forward 4.0 (33%) + backward ... ; hookdbg's own ...'."""
    step = time.step or 1.0
    parts = " + ".join(
        f"{name} {ms(value)} ({value / step:.0%})" for name, value in time.parts.items()
    )
    own = (
        ""
        if math.isnan(time.hookdbg)
        else f"; hookdbg's own {ms(time.hookdbg)} ms per step is left out of every time"
    )
    return f"per step (mean): {ms(time.step)} ms = {parts}{own}"


def _profile_table(rec: Recording, prof: Profile, rows: list[ProfileRow], sort: str) -> Table:
    span = f"step {prof.first}" if prof.first == prof.last else f"steps {prof.first}-{prof.last}"
    title = (
        f"{rec.path}: {span} ({prof.steps} recorded), {ms(prof.step_median)} ms per step "
        f"(median), sorted by {sort}"
    )
    device = prof.on_device
    t = table(
        title,
        [
            "module",
            "type",
            "phase",
            ("calls", "right"),
            *((("device self ms", "right"), ("device total ms", "right")) if device else ()),
            ("host self ms" if device else "self ms mean", "right"),
            ("median", "right"),
            ("host total ms" if device else "total ms mean", "right"),
            ("median", "right"),
            ("self share", "right"),
        ],
    )
    for r in rows:
        t.add_row(
            r.module.name,
            f"backward() at {r.module.type}" if r.module.is_loss else r.module.type,
            Phase(r.phase).label,
            f"{r.calls_per_step:g}",
            *((_or_dash(r.device_self_mean), _or_dash(r.device_total_mean)) if device else ()),
            ms(r.self_mean),
            ms(r.self_median),
            ms(r.total_mean),
            ms(r.total_median),
            f"{r.share:.1%}",
        )
    return t


def _or_dash(seconds: float) -> str:
    return "-" if math.isnan(seconds) else ms(seconds)
