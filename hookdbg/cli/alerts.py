"""``hookdbg alerts``: every NaN/inf origin, the first one marked, with its context."""

from __future__ import annotations

import click
from rich.markup import escape

from hookdbg.analysis.alerts import alert_reports
from hookdbg.cli.app import cli
from hookdbg.cli.output import (
    console,
    emit_json,
    json_option,
    open_or_fail,
    tensor_json,
    tensor_table,
)
from hookdbg.store.schema import Phase, slot_label


@cli.command()
@click.argument("recording")
@click.option(
    "--exit-code", is_flag=True, help="Exit with status 1 when there is any alert (for CI), else 0."
)
@json_option
def alerts(recording: str, exit_code: bool, as_json: bool) -> None:
    """NaN/inf alerts in RECORDING, in the order they fired. Each names where a
    non-finite value was born (module, phase, step, tensor), shows that tensor's
    summary and the tensors feeding it, which were still finite."""
    rec = open_or_fail(recording, quiet=as_json)
    reports = alert_reports(rec)
    if as_json:
        emit_json(
            {
                "recording": str(rec.path),
                "alerts": [
                    {
                        "step": int(r.alert["step"]),
                        "module": r.module.name,
                        "type": r.module.type,
                        "phase": Phase(int(r.alert["phase"])).label,
                        "slot": slot_label(int(r.alert["slot"]), r.alert["path"].decode()),
                        "first": bool(r.alert["first"]),
                        "message": r.alert["message"].decode(),
                        "tensor": tensor_json(r.tensor, rec.modules)
                        if r.tensor is not None
                        else None,
                        "context": [tensor_json(c, rec.modules) for c in r.context],
                    }
                    for r in reports
                ],
            }
        )
    else:
        out = console()
        if not reports:
            out.print(
                escape(f"{rec.path}: no NaN/inf alerts")
                + (
                    ""
                    if rec.info.options.get("level") == "stats"
                    else " (recorded without --level stats: values were not checked)"
                )
            )
        for n, r in enumerate(reports, 1):
            mark = "[bold red]FIRST[/] " if r.alert["first"] else ""
            message = escape(r.alert["message"].decode())
            out.print(f"\n{mark}[bold]alert {n}[/bold]: {message}")
            if r.tensor is not None:
                out.print(tensor_table(None, [r.tensor], rec.modules))
            if len(r.context):
                out.print(tensor_table(f"  its {r.context_label}", r.context, rec.modules))
    if exit_code and reports:
        raise SystemExit(1)
