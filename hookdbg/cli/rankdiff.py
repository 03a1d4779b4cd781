"""``hookdbg diff --ranks``: the ranks of one distributed run against each other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from hookdbg.analysis.ranks import Desync, RankDiff, rank_diff
from hookdbg.cells import num, slot_label
from hookdbg.cli.common import BadInput, plural
from hookdbg.cli.inputs import check_tolerances, open_run_or_fail
from hookdbg.cli.report import Report
from hookdbg.cli.tables import table
from hookdbg.cli.terminal import Output, literal
from hookdbg.read import RankSet


@dataclass
class RanksDiff(Report):
    """Whether the replicas of a run agree. Exit status 0 when they are in sync (or
    every parameter is sharded, so no replica can drift), 1 when they are not or when
    the recording holds no norms to compare (as text or JSON: a CI gate must not pass
    on a run that checked nothing)."""

    run: RankSet
    result: RankDiff
    top: int

    @classmethod
    def of(
        cls,
        path: str,
        rtol: float,
        atol: float,
        steps: tuple[int | None, int | None],
        top: int,
        *,
        quiet: bool,
    ) -> RanksDiff:
        """Open the run at ``path`` and compare its ranks; exit 2 if it has but one."""
        check_tolerances(rtol, atol)
        run = open_run_or_fail(path, quiet=quiet)
        if not isinstance(run, RankSet) or len(run.ranks) < 2:
            raise BadInput(
                f"{path} is not a distributed run with several ranks (expected files "
                f"named like {Path(path).stem}.rank0{Path(path).suffix})"
            )
        return cls(run, rank_diff(run, rtol, atol, *steps), top)

    def exit_status(self) -> int:
        return 0 if self.result.in_sync else 1

    def why_nothing(self) -> str:
        """Why no norm was compared: no step recorded on every rank, no optimizer step
        in those (norms are taken after one), or no norms recorded."""
        steps = self.result.compared_steps
        if not steps:
            return "no step was recorded on every rank"
        if not self.result.optimizer_stepped:
            return (
                f"no optimizer step ran in the {plural(len(steps), 'step')} recorded on "
                "every rank (weights and gradients are compared after it)"
            )
        return "record with --level stats under torch.distributed to get parameter norms"

    def to_json(self) -> dict[str, object]:
        run, result, top = self.run, self.result, self.top
        return {
            "recording": str(run.path),
            "ranks": run.ranks,
            "rtol": result.rtol,
            "atol": result.atol,
            "compared_steps": result.compared_steps,
            "compared": result.compared,
            "agree": result.in_sync,
            "sharded_not_compared": result.sharded,
            "nothing_compared": (
                self.why_nothing() if not result.compared and not result.sharded else None
            ),
            "nonfinite_on_every_rank": [
                {"step": s, "module": m, "slot": slot_label(slot, p)}
                for s, m, slot, p in result.nonfinite[:top]
            ],
            "desyncs": [
                {
                    "step": d.step,
                    "module": d.module,
                    "slot": slot_label(d.slot, d.path),
                    "norms": d.norms,
                    "odd_ranks": d.odd_ranks,
                }
                for d in result.desyncs[:top]
            ],
        }

    def render(self, out: Output) -> None:
        run, result, top = self.run, self.result, self.top
        compared = result.compared_steps
        span = f" ({compared[0]}-{compared[-1]})" if compared else ""
        what = (
            "no replicated parameter or step-gradient norms"
            if result.all_sharded
            else f"{result.compared:,} parameter and step-gradient norms"
        )
        out.print(
            literal(
                f"compared ranks {', '.join(map(str, run.ranks))} over "
                f"{plural(len(compared), 'step')}{span}: {what}"
            )
        )
        first = result.first
        if result.sharded:
            kinds = ", ".join(f"{n:,} {p}" for p, n in sorted(result.sharded.items()))
            out.print(
                literal(
                    f"not compared: {kinds} norms of sharded tensors (FSDP2, tensor parallel): "
                    "each rank holds another piece of them, not a replica (`hookdbg show "
                    f"{run.path} MODULE --global` merges them)"
                )
            )
        if result.nonfinite:
            step, module, slot, path = result.nonfinite[0]
            out.print(
                "[bold red]not finite on every rank[/]: "
                + literal(
                    f"{len(result.nonfinite):,} norms, first at step {step}, {module} "
                    f"{slot_label(slot, path)}: the ranks cannot be told in sync or not there"
                )
            )
        if result.all_sharded and not result.nonfinite:
            out.print(
                "[bold green]nothing can drift[/]: every parameter is sharded, each rank "
                "updates only its own piece of it"
            )
        elif not result.compared and not result.sharded:
            out.print(f"[bold yellow]nothing to compare[/]: {literal(self.why_nothing())}")
        elif first is None and not result.nonfinite:
            what = (
                "the replicated weights and gradients agree on every rank"
                if result.sharded
                else "every rank holds the same weights and gradients"
            )
            out.print(
                f"[bold green]in sync[/]: {what} (rtol={result.rtol:g}, atol={result.atol:g})"
            )
        elif first is not None:
            out.print(_first_desync(first, result.last_agreed))
            out.print(_desync_table(result, top))


def _first_desync(first: Desync, last_agreed: int | None) -> str:
    """The line naming the first desync: where, each rank's norm, and who is off."""
    values = ", ".join(f"rank {r} {num(v, 9)}" for r, v in first.norms.items())
    odd = first.odd_ranks
    blame = (
        "no majority to tell which rank is off"
        if len(odd) == len(first.norms)
        else f"rank {', '.join(map(str, odd))} is off"
    )
    since = "" if last_agreed is None else f"; they agreed at step {last_agreed}"
    return (
        f"[bold red]first desync[/]: step {first.step}, {literal(first.module)} "
        f"{literal(slot_label(first.slot, first.path))} norm: {values} ({blame}{since})"
    )


def _desync_table(result: RankDiff, top: int) -> Table:
    t = table(
        f"\n{plural(len(result.desyncs), 'desync')}",
        [("step", "right"), "module", "tensor", "norms by rank"],
    )
    for d in result.desyncs[:top]:
        t.add_row(
            str(d.step),
            d.module,
            slot_label(d.slot, d.path),
            "  ".join(f"{r}: {num(v, 9)}" for r, v in d.norms.items()),
        )
    return t
