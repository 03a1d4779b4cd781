"""``hookdbg diff``: where two runs part ways; exit status 1 when they do (for CI)."""

from __future__ import annotations

import math
from pathlib import Path

import click
from rich.table import Table

from hookdbg.analysis.diff import DiffResult, Divergence, diff
from hookdbg.analysis.ranks import Desync, RankDiff, rank_diff
from hookdbg.cells import num, slot_label
from hookdbg.cli.common import BadInput, plural
from hookdbg.cli.output import (
    console,
    emit_json,
    json_option,
    literal,
    open_or_fail,
    open_run_or_fail,
    step_options,
    table,
)
from hookdbg.read import RankSet, Recording
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
    if ranks:
        if b is not None:
            raise BadInput("--ranks compares the ranks of one run: give one recording")
        _diff_ranks(a, rtol or 0.0, atol or 0.0, steps, top, as_json)
    elif b is None:
        raise BadInput("give two recordings to compare, or --ranks with one distributed run")
    else:
        rtol = 1e-5 if rtol is None else rtol
        atol = 1e-8 if atol is None else atol
        _diff_runs(a, b, rtol, atol, by, steps, top, as_json)


def _diff_runs(
    a: str,
    b: str,
    rtol: float,
    atol: float,
    by: str,
    steps: tuple[int | None, int | None],
    top: int,
    as_json: bool,
) -> None:
    """Recordings A and B, step by step; exit 0 when they match, 1 when they differ."""
    _check_tolerances(rtol, atol)
    rec_a, rec_b = open_or_fail(a, quiet=as_json), open_or_fail(b, quiet=as_json)
    for rec in (rec_a, rec_b):
        _require_summaries(rec)
    result = diff(rec_a, rec_b, rtol=rtol, atol=atol, by=by, first=steps[0], last=steps[1])
    if as_json:
        emit_json(_as_json(result, rec_a, rec_b, top))
    else:
        _print(result, rec_a, rec_b, top)
    raise SystemExit(0 if result.equal else 1)


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


def _check_tolerances(rtol: float, atol: float) -> None:
    """NaN would make every value differ and inf every value agree: both are typos."""
    for name, value in (("--rtol", rtol), ("--atol", atol)):
        if not (math.isfinite(value) and value >= 0):
            raise BadInput(f"{name} must be a finite number, 0 or more, not {value}")


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


def _print(result: DiffResult, a: Recording, b: Recording, top: int) -> None:
    out = console()
    for line in _explain(result, a, b):
        out.print(f"[dim]{literal(line)}[/dim]")
    if result.equal:
        agree = (
            "every compared tensor has the same shape and dtype"
            if result.values_from is not None
            else f"every compared summary agrees within rtol={result.rtol:g}, atol={result.atol:g}"
        )
        out.print(f"[bold green]match[/]: {agree}")
        return
    first = result.first
    if first is None:
        out.print("[bold red]differ[/]: the recordings do not line up (see above)")
        return
    out.print(f"[bold red]first divergence[/]: {literal(_where(first))}: {literal(_gap(first))}")
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


def _as_json(result: DiffResult, a: Recording, b: Recording, top: int) -> dict[str, object]:
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


def _diff_ranks(
    path: str,
    rtol: float,
    atol: float,
    steps: tuple[int | None, int | None],
    top: int,
    as_json: bool,
) -> None:
    """The ranks of one distributed run against each other. Exit 0 when they are in
    sync (or every parameter is sharded, so no replica can drift), 1 when they are not
    or when the recording holds no norms to compare (as text or JSON: a CI gate must not
    pass on a run that checked nothing)."""
    _check_tolerances(rtol, atol)
    run = open_run_or_fail(path, quiet=as_json)
    if not isinstance(run, RankSet) or len(run.ranks) < 2:
        raise BadInput(
            f"{path} is not a distributed run with several ranks (expected files "
            f"named like {Path(path).stem}.rank0{Path(path).suffix})"
        )
    result = rank_diff(run, rtol, atol, *steps)
    if as_json:
        emit_json(_ranks_json(run, result, top))
    else:
        _print_ranks(run, result, top)
    raise SystemExit(0 if result.in_sync else 1)


def _ranks_json(run: RankSet, result: RankDiff, top: int) -> dict[str, object]:
    return {
        "recording": str(run.path),
        "ranks": run.ranks,
        "rtol": result.rtol,
        "atol": result.atol,
        "compared_steps": result.compared_steps,
        "compared": result.compared,
        "agree": result.in_sync,
        "sharded_not_compared": result.sharded,
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


def _print_ranks(run: RankSet, result: RankDiff, top: int) -> None:
    out = console()
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
        out.print(
            "[bold yellow]nothing to compare[/]: record with --level stats under "
            "torch.distributed to get parameter norms"
        )
    elif first is None and not result.nonfinite:
        what = (
            "the replicated weights and gradients agree on every rank"
            if result.sharded
            else "every rank holds the same weights and gradients"
        )
        out.print(f"[bold green]in sync[/]: {what} (rtol={result.rtol:g}, atol={result.atol:g})")
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
