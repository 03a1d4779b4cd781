"""``hookdbg alerts``: every NaN/inf origin, the first one marked, with its context."""

from __future__ import annotations

import click

from hookdbg.analysis.alerts import AlertReport, alert_reports
from hookdbg.analysis.overview import scaler_view
from hookdbg.cells import slot_label
from hookdbg.cli.output import (
    console,
    emit_json,
    json_option,
    literal,
    open_or_fail,
    open_run_or_fail,
    rank_option,
    tensor_json,
    tensor_table,
)
from hookdbg.read import RankSet, Recording, Status
from hookdbg.store.schema import Phase
from hookdbg.text import plural, utf8


@click.command()
@click.argument("recording")
@rank_option
@click.option(
    "--exit-code",
    is_flag=True,
    help="Exit with status 1 when there is any alert, or when the recording failed (what "
    "ran after that was not checked), for CI; else 0.",
)
@json_option
def alerts(recording: str, rank: int | None, exit_code: bool, as_json: bool) -> None:
    """NaN/inf alerts in RECORDING, in the order they fired. Each names where a
    non-finite value was born (module, phase, step, tensor), shows that tensor's
    summary and the tensors feeding it, which were still finite. For a distributed run,
    every rank's alerts in the order they happened, so the first shows which rank saw
    the NaN first."""
    if rank is None:
        run = open_run_or_fail(recording, quiet=as_json)
    else:
        run = open_or_fail(recording, quiet=as_json, rank=rank)
    ranked = _reports(run)
    if as_json:
        emit_json(
            {
                "recording": str(run.path),
                "alerts": [
                    {
                        "rank": r,
                        "step": int(a.alert["step"]),
                        "module": a.module.name,
                        "type": a.module.type,
                        "phase": Phase(int(a.alert["phase"])).label,
                        "slot": slot_label(int(a.alert["slot"]), utf8(a.alert["path"])),
                        "first": i == 0,
                        "message": utf8(a.alert["message"]),
                        "tensor": tensor_json(a.tensor, rec) if a.tensor is not None else None,
                        "context": [tensor_json(c, rec) for c in a.context],
                    }
                    for i, (r, rec, a) in enumerate(ranked)
                ],
            }
        )
    else:
        _print(run, ranked)
    recordings = run.recordings.values() if isinstance(run, RankSet) else [run]
    failed = [rec for rec in recordings if rec.status is Status.FAILED]
    if failed and not as_json:
        console().print(literal(f"\n{failed[0].path}: recording failed: {failed[0].failure}"))
    if exit_code and (ranked or failed):
        raise SystemExit(1)


def _reports(run: Recording | RankSet) -> list[tuple[int | None, Recording, AlertReport]]:
    """(rank, recording, report) in the order the alerts happened."""
    if isinstance(run, Recording):
        return [(None, run, a) for a in alert_reports(run)]
    ranked = [(rank, rec, a) for rank, rec in run.recordings.items() for a in alert_reports(rec)]
    return sorted(ranked, key=lambda t: (int(t[2].alert["step"]), float(t[2].alert["time"])))


def _print(run: Recording | RankSet, ranked: list) -> None:
    out = console()
    if not ranked:
        recs = run.recordings.values() if isinstance(run, RankSet) else [run]
        unchecked = any(rec.info.options.get("level") != "stats" for rec in recs)
        skipped = sum(v.skipped for v in map(scaler_view, recs) if v is not None)
        out.print(
            literal(
                f"{run.path}: no NaN/inf alerts"
                + (
                    " (recorded without --level stats: values were not checked)"
                    if unchecked
                    else ""
                )
                + (
                    f"; AMP's GradScaler skipped {plural(skipped, 'step')} whose scaled "
                    "gradients overflowed, which is no alert"
                    if skipped
                    else ""
                )
            )
        )
    for n, (rank, rec, r) in enumerate(ranked, 1):
        mark = "[bold red]FIRST[/] " if n == 1 else ""
        where = "" if rank is None else f" on rank {rank}"
        message = literal(utf8(r.alert["message"]))
        out.print(f"\n{mark}[bold]alert {n}{where}[/bold]: {message}")
        if r.tensor is not None:
            out.print(tensor_table(None, [r.tensor], rec))
        if len(r.context):
            out.print(tensor_table(f"  {r.context_label}", r.context, rec))
