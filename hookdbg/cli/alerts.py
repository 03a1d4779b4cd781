"""``hookdbg alerts``: every NaN/inf origin, the first one marked, with its context."""

from __future__ import annotations

import math
from dataclasses import dataclass

import click
from rich.table import Table

from hookdbg.analysis.alerts import AlertReport, alert_reports
from hookdbg.analysis.overview import scaler_view
from hookdbg.analysis.ranks import alert_order
from hookdbg.analysis.runup import TITLE, Climb, run_up
from hookdbg.cells import slot_label
from hookdbg.cli.inputs import open_or_fail, open_run_or_fail, rank_option
from hookdbg.cli.report import Report, emit, exit_code_option, json_option
from hookdbg.cli.tables import table, tensor_json, tensor_table
from hookdbg.cli.terminal import Output, literal
from hookdbg.read import RankSet, Recording, Status
from hookdbg.store.schema import Phase
from hookdbg.text import plural, utf8


@click.command()
@click.argument("recording")
@rank_option
@exit_code_option(
    "Exit with status 1 when there is any alert, or when the recording failed (what "
    "ran after that was not checked), for CI; else 0."
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
    emit(Alerts.of(run), as_json=as_json, exit_code=exit_code)


@dataclass
class Alerts(Report):
    """A run's alerts, with the rank and recording each came from, in the order they
    happened; and the recordings that failed (what ran after that was not checked)."""

    run: Recording | RankSet
    ranked: list[tuple[int | None, Recording, AlertReport]]
    failed: list[Recording]

    @classmethod
    def of(cls, run: Recording | RankSet) -> Alerts:
        ranked: list[tuple[int | None, Recording, AlertReport]]
        if isinstance(run, Recording):
            ranked = [(None, run, a) for a in alert_reports(run)]
            recordings = [run]
        else:
            ranked = [
                (rank, rec, a) for rank, rec in run.recordings.items() for a in alert_reports(rec)
            ]
            ranked.sort(key=lambda t: alert_order(t[2].alert))
            recordings = list(run.recordings.values())
        return cls(run, ranked, [rec for rec in recordings if rec.status is Status.FAILED])

    def exit_status(self) -> int:
        return 1 if self.ranked or self.failed else 0

    def to_json(self) -> dict[str, object]:
        return {
            "recording": str(self.run.path),
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
                    "run_up": [_climb_json(c) for c in run_up(rec, a)],
                    "op": a.op,
                }
                for i, (r, rec, a) in enumerate(self.ranked)
            ],
            "headroom": [
                {
                    "rank": rank,
                    **{k: w[k] for k in _HEADROOM_FIELDS if k in w},
                    "module": _module_name(rec, w.get("module")),
                }
                for rank, rec, w in self._headroom()
            ],
        }

    def _headroom(self) -> list[tuple[int | None, Recording, dict]]:
        """Every rank's headroom warnings (recorder/alerts/headroom.py), by step."""
        run = self.run
        recs = run.recordings.items() if isinstance(run, RankSet) else [(None, run)]
        found = [(rank, rec, w) for rank, rec in recs for w in rec.headroom]
        return sorted(found, key=lambda t: (_step(t[2]), t[0] or 0))

    def render(self, out: Output) -> None:
        warnings = self._headroom()
        if warnings:
            head = plural(len(warnings), "headroom warning")
            out.print(f"[bold]{head}[/bold] (values nearing their dtype's largest):")
            for rank, _, w in warnings:
                where = "" if rank is None else f"rank {rank}: "
                out.print(literal(f"  {where}{w['text']}"))
        if not self.ranked:
            out.print(literal(self._none_line()))
        for n, (rank, rec, r) in enumerate(self.ranked, 1):
            mark = "[bold red]FIRST[/] " if n == 1 else ""
            where = "" if rank is None else f" on rank {rank}"
            message = literal(utf8(r.alert["message"]))
            out.print(f"\n{mark}[bold]alert {n}{where}[/bold]: {message}")
            op = r.op_said_apart
            if op is not None:
                out.print(literal(f"  the op: {op}"))
            if r.tensor is not None:
                out.print(tensor_table(None, [r.tensor], rec))
            if len(r.context):
                out.print(tensor_table(f"  {r.context_label}", r.context, rec))
            climbs = run_up(rec, r)
            if climbs and len(climbs[0].steps) > 1:
                steps = len(climbs[0].steps)
                out.print(f"\n  [bold]run-up, last {steps} recorded steps[/bold]: {TITLE}")
                out.print(_run_up_table(climbs))
        if self.failed:
            first = self.failed[0]
            out.print(literal(f"\n{first.path}: recording failed: {first.failure}"))

    def _none_line(self) -> str:
        """No alert: say whether values were checked, and what GradScaler skipped."""
        run = self.run
        recs = run.recordings.values() if isinstance(run, RankSet) else [run]
        skipped = sum(v.skipped for v in map(scaler_view, recs) if v is not None)
        return (
            f"{run.path}: no NaN/inf alerts"
            + _how_checked([rec.info.options for rec in recs])
            + (
                f"; AMP's GradScaler skipped {plural(skipped, 'step')} whose scaled "
                "gradients overflowed, which is no alert"
                if skipped
                else ""
            )
        )


def _how_checked(options: list[dict]) -> str:
    """What an answer of no alert rests on: every tensor, the sentinel, or nothing."""
    if all(o.get("nan_check") and _every_step(o) for o in options):
        return ""
    if not any(o.get("nan_check") or o.get("sentinel") for o in options):
        return " (recorded with no NaN/inf check: --no-nan-check, or below --level stats)"
    return (
        " (where steps were not recorded at --level stats, the sentinel checked each "
        "step's top-level outputs, loss and gradients, not every tensor)"
    )


def _every_step(options: dict) -> bool:
    """The recording recorded every step as launched (unless steered)."""
    return not options.get("idle") and options.get("every", 1) == 1 and options.get("steps") == "0:"


_HEADROOM_FIELDS = (
    "step",
    "module",
    "path",
    "dtype",
    "abs_max",
    "largest",
    "growth",
    "within",
    "text",
)


def _step(warning: dict) -> int:
    """A headroom warning's step (0 where its row, damaged, has none)."""
    step = warning.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else 0


def _module_name(rec: Recording, module: object) -> str | None:
    """The name of module id ``module`` in ``rec``, if it is one."""
    if isinstance(module, int) and not isinstance(module, bool):
        found = rec.modules.get(module)
        return found.name if found is not None else None
    return None


def _run_up_table(climbs: list[Climb]) -> Table:
    """Per tensor, each recorded step (``Climb.text``)."""
    steps = climbs[0].steps
    t = table(None, ["tensor", "dtype", *((f"step {s}", "right") for s in steps)])
    for climb in climbs:
        t.add_row(climb.label, climb.dtype, *map(climb.text, range(len(steps))))
    return t


def _climb_json(climb: Climb) -> dict[str, object]:
    return {
        "tensor": climb.label,
        "dtype": climb.dtype,
        "largest_finite": climb.largest,
        "steps": [
            {
                "step": s,
                "abs_max": None if math.isnan(climb.absmax[i]) else climb.absmax[i],
                "headroom_used": climb.headroom(i),
                "nan": climb.nan[i],
                "inf": climb.inf[i],
            }
            for i, s in enumerate(climb.steps)
        ],
    }
