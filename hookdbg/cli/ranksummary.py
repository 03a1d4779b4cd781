"""``hookdbg summary`` of a distributed run: every rank, stragglers and who saw a NaN first."""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table

from hookdbg.analysis.losses import LossSeries
from hookdbg.analysis.overview import ending
from hookdbg.analysis.ranks import RanksOverview, ranks_overview
from hookdbg.cli.common import steered
from hookdbg.cli.report import Report
from hookdbg.cli.tables import ms, table
from hookdbg.cli.terminal import Output, literal
from hookdbg.read import RankSet, Recording, Status
from hookdbg.text import plural, utf8


def clean(rec: Recording) -> bool:
    """Whole and clean: closed normally, nothing lost, no alert."""
    return rec.status is Status.COMPLETE and not rec.dropped_rows and not len(rec.alerts)


@dataclass
class RanksSummary(Report):
    """The ranks of one run side by side."""

    run: RankSet
    view: RanksOverview

    @classmethod
    def of(cls, run: RankSet) -> RanksSummary:
        return cls(run, ranks_overview(run))

    def exit_status(self) -> int:
        """1 unless every rank's recording is whole and clean (no alert, nothing lost)."""
        return 0 if all(map(clean, self.run.recordings.values())) else 1

    def to_json(self) -> dict[str, object]:
        run, view = self.run, self.view
        rank0, worst, first = run[run.ranks[0]], view.worst, view.first_alert
        return {
            "recording": str(run.path),
            "world_size": run.world_size,
            "ranks": run.ranks,
            "missing_ranks": run.missing,
            "backend": rank0.backend,
            "command": rank0.info.argv,
            "per_rank": [
                {
                    "rank": r.rank,
                    "status": r.status.value,
                    "ended": r.ended or None,
                    "steps": r.steps,
                    "step_seconds_median": r.step_median,
                    "alerts": r.alerts,
                    "dropped_rows": r.dropped,
                    "loss": None if r.loss is None else r.loss.to_json(),
                }
                for r in view.rows
            ],
            "slowest_rank_counts": view.slowest,
            "largest_lag": None
            if worst is None
            else {
                "step": worst.step,
                "slowest_rank": worst.slowest,
                "seconds": worst.lag,
                "step_seconds": worst.seconds,
            },
            "first_alert": None
            if first is None
            else {
                "rank": first[0],
                "step": int(first[1]["step"]),
                "module": run[first[0]].modules.name(int(first[1]["module"])),
                "message": utf8(first[1]["message"]),
            },
        }

    def render(self, out: Output) -> None:
        run, view = self.run, self.view
        rank0, first = run[run.ranks[0]], view.first_alert
        backend = f" ({rank0.backend})" if rank0.backend else ""
        out.print(
            f"[bold]{literal(run.path)}[/bold]  "
            + literal(f"{len(run.ranks)} of {run.world_size} ranks{backend}")
        )
        out.print(f"  [dim]{'command':<10}[/dim] {literal(rank0.info.command)}")
        ended = rank_endings(run)
        if ended:
            out.print(f"  [dim]{'ended':<10}[/dim] {literal(ended)}")
        if text := steered(rank0):
            out.print(f"  [dim]{'steered':<10}[/dim] {literal(text)}")
        out.print(_ranks_table(view))
        for line in _stragglers(view):
            out.print(literal(line))
        if first is not None:
            rank, row = first
            out.print(
                f"  [bold red]first NaN/inf[/] on rank {rank}: {literal(utf8(row['message']))}"
            )
        else:
            out.print("  no NaN/inf alerts on any rank")
        out.print(
            f"  [dim]`hookdbg summary {literal(run.path)} --rank N` shows one rank's "
            f"modules; `hookdbg diff --ranks {literal(run.path)}` checks that the "
            "replicas agree[/dim]"
        )


def rank_endings(run: RankSet) -> str:
    """How each rank ended, ranks alike said once: 'exit status 0 (every rank)', or
    'stopped at the first NaN/inf origin (exit status 3) (rank 1); RuntimeError: ...
    (rank 0)'. A rank whose recording was cut short died without closing it (killed:
    SIGKILL, the out-of-memory killer, a crash in native code); one still live has
    not ended. '' while every rank is live."""
    by_ending: dict[str, list[int]] = {}
    for rank in run.ranks:
        rec = run[rank]
        said = " ".join(ending(rec).split())  # an exception's message may take lines
        if not said and rec.status is Status.CUT_SHORT:
            said = "cut short: the process died without closing its recording (killed)"
        if said:
            by_ending.setdefault(said, []).append(rank)
    if len(by_ending) == 1 and len(next(iter(by_ending.values()))) == len(run.ranks):
        return f"{next(iter(by_ending))} (every rank)"
    return "; ".join(
        f"{said} ({'rank' if len(ranks) == 1 else 'ranks'} {', '.join(map(str, ranks))})"
        for said, ranks in sorted(by_ending.items(), key=lambda item: item[1])
    )


def _ranks_table(view: RanksOverview) -> Table:
    """One line per rank: how its recording ended, its steps, alerts and losses."""
    t = table(
        None,
        [
            ("rank", "right"),
            "status",
            ("steps", "right"),
            ("ms per step", "right"),
            ("alerts", "right"),
            "data lost",
            "loss",
        ],
    )
    for r in view.rows:
        # a recording closed normally says how its script ended, where not as planned
        ended = r.status is Status.COMPLETE and r.ended not in ("", "complete")
        t.add_row(
            str(r.rank),
            f"{r.status.value}: {r.ended}" if ended else r.status.value,
            str(r.steps),
            ms(r.step_median),
            str(r.alerts),
            f"{r.dropped:,} rows" if r.dropped else "none",
            _loss_cell(r.loss),
        )
    return t


def _loss_cell(series: LossSeries | None) -> str:
    """``0.6782 -> 0.4127``, and where it first went non-finite: a rank's own loss."""
    if series is None:
        return "-"
    first, last = series.first(), series.last()
    if first is None or last is None:
        text = "-"
    else:
        text = f"{first[1]:.4g}" + (f" -> {last[1]:.4g}" if last[0] != first[0] else "")
    if series.nonfinite_step is not None:
        text += f", {series.nonfinite_kind} at step {series.nonfinite_step}"
    return text


def _stragglers(view: RanksOverview) -> list[str]:
    """Which ranks were slowest how often, and the step where one lagged most."""
    if not view.spreads:
        return []
    counts = ", ".join(f"rank {r} in {plural(n, 'step')}" for r, n in sorted(view.slowest.items()))
    lines = [f"  stragglers: slowest was {counts} of {len(view.spreads)}"]
    worst = view.worst
    if worst is not None and worst.lag > 0:
        lines.append(
            f"  largest lag: step {worst.step}, rank {worst.slowest} took "
            f"{ms(worst.lag)} ms ({worst.lag_share:.0%}) longer than the fastest rank"
        )
    return lines
