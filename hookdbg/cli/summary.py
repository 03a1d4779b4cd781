"""``hookdbg summary``: the run at a glance, and its modules in one step."""

from __future__ import annotations

import time
from dataclasses import dataclass

import click
from rich.table import Table

from hookdbg.analysis.losses import describe
from hookdbg.analysis.overview import Overview, after_training_text, ending, overview
from hookdbg.cli.common import BadInput, human_bytes, plural, steered
from hookdbg.cli.inputs import open_or_fail, open_run_or_fail, rank_option
from hookdbg.cli.ranksummary import RanksSummary, clean
from hookdbg.cli.report import Report, emit, exit_code_option, json_option
from hookdbg.cli.tables import ms, table
from hookdbg.cli.terminal import Output, literal
from hookdbg.read import RankSet, Recording
from hookdbg.read.modules import Module
from hookdbg.text import utf8


@click.command()
@click.argument("recording")
@rank_option
@click.option("--step", type=int, metavar="N", help="Module table for step N [default: first].")
@exit_code_option(
    "Exit with status 1 unless the recording is whole and clean (for CI): it failed, "
    "was cut short or lost data, or holds a NaN/inf alert, on any rank."
)
@json_option
def summary(
    recording: str, rank: int | None, step: int | None, exit_code: bool, as_json: bool
) -> None:
    """What RECORDING holds: the command, steps, modules, alerts, data lost, and a
    torchinfo-like table of the modules in one step. For a distributed run (run.h5 for
    run.rank0.h5, run.rank1.h5, ...): every rank, stragglers and who saw a NaN first."""
    report: Report
    if rank is None:
        run = open_run_or_fail(recording, quiet=as_json)
        report = RanksSummary.of(run) if isinstance(run, RankSet) else Summary.of(run, step)
    else:
        report = Summary.of(open_or_fail(recording, quiet=as_json, rank=rank), step)
    emit(report, as_json=as_json, exit_code=exit_code)


@dataclass
class Summary(Report):
    """One recording: how it was made and ended, and its modules in one step."""

    rec: Recording
    view: Overview

    @classmethod
    def of(cls, rec: Recording, step: int | None) -> Summary:
        """The summary with the module table of ``step``; exit 2 if it was not recorded."""
        if step is not None and step not in set(rec.recorded_steps.tolist()):
            raise BadInput(
                f"step {step} was not recorded in {rec.path} "
                f"({plural(len(rec.recorded_steps), 'recorded step')})"
            )
        return cls(rec, overview(rec, step))

    def exit_status(self) -> int:
        return 0 if clean(self.rec) else 1

    def to_json(self) -> dict[str, object]:
        rec, view = self.rec, self.view
        info = rec.info
        return {
            "recording": str(rec.path),
            "status": rec.status.value,
            "failure": rec.failure,
            "ended": utf8(rec.end["status"]) if rec.end is not None else None,
            "exit_code": int(rec.end["exit_code"]) if rec.end is not None else None,
            "end_message": utf8(rec.end["message"]) if rec.end is not None else None,
            "bytes": rec.size,
            "command": info.argv,
            "cut_attributes": info.cut,
            "created": info.created,
            "host": info.host,
            "torch": info.torch_version,
            "hookdbg": info.hookdbg_version,
            "options": info.options,
            "rank": info.rank,
            "world_size": info.world_size,
            "steps": view.steps,
            "recorded_steps": view.recorded_steps,
            "detail_dropped_steps": rec.dropped,
            "eval_batches": view.eval_batches,
            "module_calls": view.module_calls,
            "step_seconds_median": view.step_median,
            "after_training_seconds": view.after_training,
            "modules": view.modules,
            "parameters": view.params,
            "optimizers": view.optimizers,
            "compiled": view.compiled,
            "gradscaler": (
                {
                    "skipped_steps": view.scaler.skipped,
                    "first_scale": view.scaler.first_scale,
                    "last_scale": view.scaler.last_scale,
                }
                if view.scaler
                else None
            ),
            "unrecorded": view.unrecorded,
            "losses": [series.to_json() for series in view.losses],
            "alerts": len(rec.alerts),
            "first_alert": _first_alert(rec),
            "headroom_warnings": len(rec.headroom),
            "first_headroom_warning": rec.headroom[0]["text"] if rec.headroom else None,
            "recorded_after_nan": [rec.zoom_text(zoom) for zoom in rec.zooms],
            "dropped_rows": rec.dropped_rows,
            "write_error": rec.write_error,
            "write_failed_at": rec.write_failed_at,
            "module_table_step": view.step,
            "module_table": [
                {
                    "name": line.module.name,
                    "type": line.module.type,
                    "depth": line.module.depth,
                    "calls": line.calls,
                    "output_shape": line.output_shape,
                    "params": line.params,
                    "fwd_seconds": line.fwd,
                    "bwd_seconds": line.bwd,
                }
                for line in view.lines
            ],
        }

    def render(self, out: Output) -> None:
        rec, view = self.rec, self.view
        info = rec.info
        rank = f", rank {info.rank} of {info.world_size}" if info.world_size > 1 else ""
        rank += f" ({rec.backend})" if rec.backend and info.world_size > 1 else ""
        ended = ending(rec)
        out.print(
            f"[bold]{literal(rec.path)}[/bold]  "
            + literal(
                f"{rec.status.value}{f' ({ended})' if ended else ''}, {human_bytes(rec.size)}{rank}"
            )
        )
        for key, value in _facts(rec, view):
            out.print(f"  [dim]{key:<10}[/dim] {literal(value)}")
        if not view.lines:
            if view.recorded_steps == 0 and view.eval_batches:
                out.print(
                    "\n  no training step was recorded, only eval batches: "
                    + literal(f"`hookdbg show {rec.path} MODULE --eval` shows their calls")
                )
            elif own := [m.name for m in rec.modules if m.is_optimizer and m.params]:
                out.print(
                    "\n  no module calls were recorded: the steps trained tensors of no "
                    + literal(
                        f"nn.Module; `hookdbg show {rec.path} {own[0]}` shows their "
                        "gradients and norms"
                    )
                )
            else:
                out.print("\n  no module calls were recorded")
            return
        out.print(_module_table(view))


def _first_alert(rec: Recording) -> str | None:
    """The first origin named, else (the sentinel's findings only) the first alert."""
    alerts = rec.alerts
    first = next((a for a in alerts if a["first"]), alerts[0] if len(alerts) else None)
    return None if first is None else utf8(first["message"])


def _facts(rec: Recording, view: Overview) -> list[tuple[str, str]]:
    """The lines under the title: what was run, how, and what came of it."""
    facts = [
        *_how_run(rec),
        (
            "steps",
            f"{view.steps} ({view.recorded_steps} recorded), "
            f"{plural(view.module_calls, 'module call')}, "
            f"{ms(view.step_median)} ms per step (median)",
        ),
    ]
    if view.eval_batches:
        batches = plural(view.eval_batches, "eval batch", "eval batches")
        facts.append(
            (
                "eval",
                f"{batches} (forward only: validation, test or inference), kept apart from "
                "the steps",
            )
        )
    optimizers = f"; optimizers: {', '.join(view.optimizers)}" if view.optimizers else ""
    facts.append(("modules", f"{view.modules}, {view.params:,} parameters{optimizers}"))
    if view.compiled:
        facts.append(
            (
                "compiled",
                f"{', '.join(view.compiled)} ran under torch.compile: each is one call, with "
                "nothing recorded inside it (record without compiling to see inside)",
            )
        )
    if view.scaler:
        facts.append(("amp", view.scaler.text()))
    facts.extend(("loss", f"{series.label}: {describe(series)}") for series in view.losses)
    facts.extend(("unrecorded", text) for text in view.unrecorded)
    if view.after_training is not None:
        facts.append(("after", after_training_text(view.after_training)))
    first_alert = _first_alert(rec)
    alerts = f"{len(rec.alerts)}" + (f": {first_alert}" if first_alert else "")
    failed = [("failed", rec.failure)] if rec.failure and rec.write_error is None else []
    if rec.headroom:  # said before the alerts: they come first
        first = rec.headroom[0]["text"].removeprefix("headroom: ")
        facts.append(("headroom", f"{plural(len(rec.headroom), 'warning')}, the first: {first}"))
    zooms = [("after NaN", rec.zoom_text(zoom)) for zoom in rec.zooms]
    return [*facts, *failed, ("alerts", alerts), *zooms, ("data lost", lost_text(rec))]


def _cut_attributes(cut: dict[str, str]) -> str:
    """What the reader left out of the file's attributes (hookdbg/read/runinfo.py)."""
    return "; ".join(f"attribute {name}: {what}" for name, what in cut.items())


def _how_run(rec: Recording) -> list[tuple[str, str]]:
    """The command, where and with what it was recorded, and the recording options."""
    info, opts = rec.info, rec.info.options
    return [
        ("command", info.command),
        (
            "recorded",
            f"{info.created} on {info.host}, torch {info.torch_version}, "
            f"hookdbg {info.hookdbg_version}"
            + (f" ({info.per_call_path} per-call path)" if info.per_call_path else ""),
        ),
        (
            "options",
            (
                f"idle (steps recorded when steered) at level {opts.get('level')}"
                if opts.get("idle")
                else f"level {opts.get('level')}, every {opts.get('every')}, "
                f"steps {opts.get('steps')}"
            )
            + f", modules {opts.get('modules')}",
        ),
        *([("cut", _cut_attributes(info.cut))] if info.cut else []),
        *([("steered", text)] if (text := steered(rec)) else []),
        *(
            [
                (
                    "kept",
                    f"the detail of the last {opts.get('keep_last')} recorded steps "
                    f"(--keep-last): {plural(rec.dropped, 'earlier recorded step')} kept "
                    "their step row, loss and alerts only",
                )
            ]
            if rec.dropped
            else []
        ),
    ]


# module lines printed (in tree order): a terminal shows no more usefully, and a model
# of 100,000 modules took a minute to lay out; --json lists them all
_SHOWN = 2000


def _module_table(view: Overview) -> Table:
    """The torchinfo-like table: one line per module, indented by depth."""
    lines = view.lines[:_SHOWN]
    left = len(view.lines) - len(lines)
    title = f"\nmodules in step {view.step}"
    if left:
        title += f" (the first {len(lines):,} of {len(view.lines):,}: --json lists them all)"
    t = table(
        title,
        [
            "module",
            "type",
            ("calls", "right"),
            "output shape",
            ("params", "right"),
            ("fwd ms", "right"),
            ("bwd ms", "right"),
        ],
    )
    for line in lines:
        m = line.module
        t.add_row(
            _tree_label(m),
            m.type,
            str(line.calls) if line.calls else "-",
            line.output_shape,
            f"{line.params:,}" if line.params else "-",
            ms(line.fwd) if line.calls else "-",
            ms(line.bwd) if line.bwd else "-",
        )
    return t


_INDENTED = 20  # levels of indentation; a module nested deeper says its depth


def _tree_label(m: Module) -> str:
    """A module's name in the table, indented by its depth: ``    conv1``. Past
    ``_INDENTED`` levels (a chain of hundreds of nested modules) the indentation stops
    and the depth is written, so that the other columns still fit a terminal."""
    name = m.name.rpartition(".")[2] if m.depth else m.name
    if m.depth <= _INDENTED:
        return "  " * m.depth + name
    return "  " * _INDENTED + f"(depth {m.depth}) {name}"


def lost_text(rec: Recording) -> str:
    """'none', or how many rows were dropped and, if writing stopped, when and why."""
    if rec.write_error is not None:
        failed = rec.write_failed_at
        when = "" if failed is None else time.strftime(" at %H:%M:%S", time.localtime(failed))
        return (
            f"writing stopped{when} ({rec.write_error}): {rec.dropped_rows:,} rows lost, "
            "the rest of the run is not in the file"
        )
    if rec.dropped_rows:
        return f"{rec.dropped_rows:,} rows dropped (the disk could not keep up)"
    return "none"
