"""``hookdbg diff``: where two runs part ways; exit status 1 when they do (for CI)."""

from __future__ import annotations

from dataclasses import dataclass

import click

from hookdbg.analysis.diff import DiffResult, Divergence, diff, not_compared
from hookdbg.cells import num, slot_label
from hookdbg.cli.common import BadInput, plural
from hookdbg.cli.inputs import check_tolerances, open_or_fail, step_options
from hookdbg.cli.rankdiff import RanksDiff
from hookdbg.cli.report import Report, emit, json_option
from hookdbg.cli.tables import table
from hookdbg.cli.terminal import Output, literal
from hookdbg.read import Recording
from hookdbg.store.schema import Phase


@click.command(name="diff")
@click.argument("a")
@click.argument("b", required=False)
@click.option(
    "--ranks",
    is_flag=True,
    help="Compare the ranks of distributed run A (run.h5 = run.rankN.h5) with each "
    "other: where do replicas that must agree (weights, all-reduced "
    "gradients) part?",
)
@click.option(
    "--rtol",
    type=float,
    default=None,
    help="Relative tolerance: values agree when |a-b| <= atol + rtol*|b| "
    "[default: 1e-5; 0 with --ranks: replicas are computed identically].",
)
@click.option(
    "--atol", type=float, default=None, help="Absolute tolerance [default: 1e-8; 0 with --ranks]."
)
@click.option(
    "--by",
    type=click.Choice(["name", "order"]),
    default="name",
    show_default=True,
    help="Align modules by name, or by call order (for renamed modules).",
)
@step_options
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=15,
    show_default=True,
    help="Rows in the table of largest divergences.",
)
@json_option
def diff_command(
    a: str,
    b: str | None,
    ranks: bool,
    rtol: float | None,
    atol: float | None,
    by: str,
    steps: tuple[int | None, int | None],
    top: int,
    as_json: bool,
) -> None:
    """Compare the tensor summaries of recordings A and B, step by step: the first
    module where they diverge (step, phase, tensor, statistic, by how much), then the
    modules that diverge most. Exit status: 0 when they match within tolerance, 1 when
    they differ, 2 on bad input. Use it to guard a refactor, a dtype change or a
    determinism check."""
    report: Report
    if ranks:
        if b is not None:
            raise BadInput("--ranks compares the ranks of one run: give one recording")
        report = RanksDiff.of(a, rtol or 0.0, atol or 0.0, steps, top, quiet=as_json)
    elif b is None:
        raise BadInput("give two recordings to compare, or --ranks with one distributed run")
    else:
        rtol = 1e-5 if rtol is None else rtol
        atol = 1e-8 if atol is None else atol
        check_tolerances(rtol, atol)
        rec_a, rec_b = open_or_fail(a, quiet=as_json), open_or_fail(b, quiet=as_json)
        for rec in (rec_a, rec_b):
            _require_summaries(rec)
        result = diff(rec_a, rec_b, rtol=rtol, atol=atol, by=by, first=steps[0], last=steps[1])
        report = RunsDiff(result, rec_a, rec_b, top)
    emit(report, as_json=as_json, exit_code=True)


def _require_summaries(rec: Recording) -> None:
    """Exit 2 for a recording without tensor summaries: there is nothing to compare."""
    if len(rec.tensors_table) == 0:
        raise BadInput(
            f"{rec.path} has no tensor summaries to compare"
            + (
                " (recorded with --level timing)"
                if rec.info.options.get("level") == "timing"
                else ""
            )
        )


def _where(d: Divergence) -> str:
    return (
        f"{d.module} ({d.type}) {Phase(d.phase).label} {slot_label(d.slot, d.path)}"
        + (f" (call {d.index})" if d.index > 0 else "")
        + f" at step {d.step}"
    )


def _gap(d: Divergence) -> str:
    if isinstance(d.a, str) or isinstance(d.b, str):
        return f"{d.stat} {d.a} vs {d.b}"
    rel = "" if d.rel_diff == float("inf") else f", relative difference {d.rel_diff:.2e}"
    return f"{d.stat} {num(d.a, 7)} vs {num(d.b, 7)}{rel}"


def _explain(result: DiffResult, a: Recording, b: Recording) -> list[str]:
    lines = []
    steps = result.compared_steps
    if not steps:
        lines.append(
            f"no step was recorded in both ({a.path}: {result.steps_a} recorded steps, "
            f"{b.path}: {result.steps_b})"
        )
    else:
        lines.append(
            f"compared {plural(len(steps), 'step')} ({steps[0]}-{steps[-1]}), "
            f"{plural(result.compared_rows, 'tensor summary', 'tensor summaries')}"
        )
        if result.values_from is not None:
            lines.append(
                f"{result.values_from} was recorded without --level stats: compared shapes "
                "and dtypes only"
            )
        elif result.not_compared:
            lines.append(not_compared(result))
        if result.steps_a != result.steps_b:
            lines.append(
                f"recorded steps differ: {result.steps_a} in {a.path}, "
                f"{result.steps_b} in {b.path}; only steps in both were compared"
            )
    for side, names in ((a.path, result.only_a), (b.path, result.only_b)):
        if names:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            lines.append(f"modules only in {side}: {shown}")
    if result.unmatched_rows:
        more = result.unmatched_rows - len(result.unmatched)
        lines.append(
            f"{plural(result.unmatched_rows, 'tensor summary', 'tensor summaries')} "
            "had no counterpart in the other recording: "
            + "; ".join(result.unmatched)
            + (f"; and {more:,} more" if more > 0 else "")
        )
    return lines


@dataclass
class RunsDiff(Report):
    """Where recordings A and B part ways: exit status 0 when they match, 1 when not."""

    result: DiffResult
    a: Recording
    b: Recording
    top: int

    def exit_status(self) -> int:
        return 0 if self.result.equal else 1

    def render(self, out: Output) -> None:
        result, a, b, top = self.result, self.a, self.b, self.top
        for line in _explain(result, a, b):
            out.print(f"[dim]{literal(line)}[/dim]")
        if result.equal:
            agree = (
                "every compared tensor has the same shape and dtype"
                if result.values_from is not None
                else "every compared summary agrees within "
                f"rtol={result.rtol:g}, atol={result.atol:g}"
            )
            out.print(f"[bold green]match[/]: {agree}")
            return
        first = result.first
        if first is None:
            out.print("[bold red]differ[/]: the recordings do not line up (see above)")
            return
        out.print(
            f"[bold red]first divergence[/]: {literal(_where(first))}: {literal(_gap(first))}"
        )
        differing = plural(len(result.divergences), "tensor summary", "tensor summaries")
        t = table(
            f"\nlargest divergences ({differing} differ)",
            [
                "module",
                "type",
                ("rows", "right"),
                "worst at",
                "statistic",
                ("a", "right"),
                ("b", "right"),
                ("rel diff", "right"),
            ],
        )
        for name, kind, n, d in result.ranked(top):
            where = f"step {d.step} {Phase(d.phase).label} {slot_label(d.slot, d.path)}"
            a_text = d.a if isinstance(d.a, str) else num(d.a)
            b_text = d.b if isinstance(d.b, str) else num(d.b)
            rel = "-" if d.rel_diff == float("inf") else f"{d.rel_diff:.2e}"
            t.add_row(name, kind, str(n), where, d.stat, a_text, b_text, rel)
        out.print(t)

    def to_json(self) -> dict[str, object]:
        result, a, b, top = self.result, self.a, self.b, self.top

        def div(d: Divergence) -> dict[str, object]:
            return {
                "step": d.step,
                "module": d.module,
                "type": d.type,
                "call": d.index,
                "phase": Phase(d.phase).label,
                "slot": slot_label(d.slot, d.path),
                "statistic": d.stat,
                "a": d.a,
                "b": d.b,
                "relative_difference": d.rel_diff,
            }

        return {
            "a": str(a.path),
            "b": str(b.path),
            "equal": result.equal,
            "rtol": result.rtol,
            "atol": result.atol,
            "by": result.by,
            "compared_steps": result.compared_steps,
            "compared_rows": result.compared_rows,
            "values_compared": result.values_from is None,
            "statistics_compared": list(result.stats),
            "unmatched_rows": result.unmatched_rows,
            "unmatched_examples": result.unmatched,
            "only_in_a": result.only_a,
            "only_in_b": result.only_b,
            "first_divergence": div(result.first) if result.first else None,
            "divergent_rows": len(result.divergences),
            "largest": [
                {"module": name, "rows": n, "worst": div(d)} for name, _, n, d in result.ranked(top)
            ],
            "explanation": _explain(result, a, b),
        }
