"""``hookdbg summary``: the run at a glance, and its modules in one step."""

from __future__ import annotations

import click
from rich.markup import escape

from hookdbg.analysis.overview import overview
from hookdbg.cli.app import cli
from hookdbg.cli.common import BadInput, human_bytes, plural
from hookdbg.cli.output import console, emit_json, json_option, ms, open_or_fail, table


@cli.command()
@click.argument("recording")
@click.option("--step", type=int, metavar="N", help="Module table for step N [default: first].")
@json_option
def summary(recording: str, step: int | None, as_json: bool) -> None:
    """What RECORDING holds: the command, steps, modules, alerts, data lost, and a
    torchinfo-like table of the modules in one step."""
    rec = open_or_fail(recording, quiet=as_json)
    if step is not None and step not in set(rec.recorded_steps.tolist()):
        raise BadInput(
            f"step {step} was not recorded in {recording} "
            f"({plural(len(rec.recorded_steps), 'recorded step')})"
        )
    view = overview(rec, step)
    info = rec.info
    first_alert = next((a["message"].decode() for a in rec.alerts if a["first"]), None)
    if as_json:
        emit_json(
            {
                "recording": str(rec.path),
                "status": rec.status.value,
                "bytes": rec.size,
                "command": info.argv,
                "created": info.created,
                "host": info.host,
                "torch": info.torch_version,
                "hookdbg": info.hookdbg_version,
                "options": info.options,
                "rank": info.rank,
                "world_size": info.world_size,
                "steps": view.steps,
                "recorded_steps": view.recorded_steps,
                "module_calls": view.module_calls,
                "step_seconds_median": view.step_median,
                "modules": view.modules,
                "parameters": view.params,
                "optimizers": view.optimizers,
                "alerts": len(rec.alerts),
                "first_alert": first_alert,
                "dropped_rows": rec.dropped_rows,
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
        )
        return
    out = console()
    opts = info.options
    rank = f", rank {info.rank} of {info.world_size}" if info.world_size > 1 else ""
    out.print(
        f"[bold]{escape(str(rec.path))}[/bold]  {rec.status.value}, {human_bytes(rec.size)}{rank}"
    )
    lines = [
        ("command", info.command),
        (
            "recorded",
            f"{info.created} on {info.host}, torch {info.torch_version}, "
            f"hookdbg {info.hookdbg_version}",
        ),
        (
            "options",
            f"level {opts.get('level')}, modules {opts.get('modules')}, every "
            f"{opts.get('every')}, steps {opts.get('steps')}",
        ),
        (
            "steps",
            f"{view.steps} ({view.recorded_steps} recorded), "
            f"{plural(view.module_calls, 'module call')}, "
            f"{ms(view.step_median)} ms per step (median)",
        ),
        (
            "modules",
            f"{view.modules}, {view.params:,} parameters"
            + (f"; optimizers: {', '.join(view.optimizers)}" if view.optimizers else ""),
        ),
        ("alerts", f"{len(rec.alerts)}" + (f": {first_alert}" if first_alert else "")),
        (
            "data lost",
            f"{rec.dropped_rows:,} rows dropped by the writer" if rec.dropped_rows else "none",
        ),
    ]
    for key, value in lines:
        out.print(f"  [dim]{key:<10}[/dim] {escape(value)}")
    if not view.lines:
        out.print("\n  no module calls were recorded")
        return
    t = table(
        f"\nmodules in step {view.step}",
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
    for line in view.lines:
        m = line.module
        label = "  " * m.depth + (m.name.rpartition(".")[2] if m.depth else m.name)
        t.add_row(
            label,
            m.type,
            str(line.calls) if line.calls else "-",
            line.output_shape,
            f"{line.params:,}" if line.params else "-",
            ms(line.fwd) if line.calls else "-",
            ms(line.bwd) if line.bwd else "-",
        )
    out.print(t)
