"""``hookdbg show``: everything recorded about one module."""

from __future__ import annotations

import click
import numpy as np

from hookdbg.analysis.histograms import histogram_json
from hookdbg.cli.common import BadInput
from hookdbg.cli.histograms import histogram_table, with_histograms
from hookdbg.cli.output import (
    check_steps,
    console,
    emit_json,
    json_option,
    literal,
    open_or_fail,
    rank_option,
    step_options,
    tensor_json,
    tensor_table,
)
from hookdbg.store.schema import StepKind


@click.command()
@click.argument("recording")
@rank_option
@click.argument("module")
@step_options
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="Show at most this many rows.",
)
@click.option(
    "--eval",
    "evals",
    is_flag=True,
    help="Show the eval batches (forward-only: validation, test) instead of the training "
    "steps; --step/--steps then select eval batches by their number (eval 0, eval 1...).",
)
@json_option
def show(
    recording: str,
    rank: int | None,
    module: str,
    steps: tuple[int | None, int | None],
    limit: int,
    evals: bool,
    as_json: bool,
) -> None:
    """Every summary recorded for MODULE in RECORDING: inputs, outputs, gradients and
    parameters, for one step (--step) or across steps. MODULE is a name as `hookdbg
    summary` prints it (model.layer1.0.conv1), its path (layer1.0.conv1) or a glob
    matching exactly one module. The call column says which call of the module in its
    step a row belongs to (0 for the first), for modules called several times."""
    rec = open_or_fail(recording, quiet=as_json, rank=rank)
    try:
        target = rec.modules.resolve(module)
    except LookupError as exc:
        raise BadInput(f"{exc} (`hookdbg summary {recording}` lists them)") from None
    kind = StepKind.EVAL if evals else StepKind.TRAIN
    segments = None
    if evals:  # --step/--steps number the eval batches, as reports label them
        count = len(rec.evals)
        lo, hi = steps[0] or 0, count - 1 if steps[1] is None else min(steps[1], count - 1)
        if lo > hi:
            raise BadInput(f"no such eval batch; {recording} has eval batches 0..{count - 1}")
        chosen = rec.evals[lo : hi + 1]
        segments = chosen["segment"]
        first, last = int(chosen["step"].min()), int(chosen["step"].max())
    else:
        first, last = check_steps(rec, steps)
    rows = rec.tensors(first, last, with_histograms(rec), kind=kind)
    calls = rec.calls(first, last, ["call", "module", "index", "segment"], kind=kind)
    if segments is not None:
        rows = rows[np.isin(rows["segment"], segments)]
        calls = calls[np.isin(calls["segment"], segments)]
    rows = rows[rows["module"] == target.id]
    calls = calls[calls["module"] == target.id]
    call_index = dict(zip(calls["call"].tolist(), calls["index"].tolist(), strict=True))
    if as_json:
        emit_json(
            {
                "recording": str(rec.path),
                "module": target.name,
                "type": target.type,
                "rows": [
                    {
                        **tensor_json(r, rec),
                        "call": call_index.get(int(r["call"])),
                        **histogram_json(r),
                    }
                    for r in rows[:limit]
                ],
                "total_rows": len(rows),
            }
        )
        return
    out = console()
    if not len(rows):
        where = "eval batches" if evals else f"steps {first}-{last}"
        out.print(
            literal(f"{target.name} ({target.type}): no tensor summaries in {where}")
            + (
                ""
                if rec.info.options.get("level") != "timing"
                else " (recorded with --level timing)"
            )
        )
        return
    span = f"step {first}" if first == last else f"steps {first}-{last}"
    if evals:
        span = f"eval batch {lo}" if lo == hi else f"eval batches {lo}-{hi}"
    out.print(
        tensor_table(
            f"{target.name} ({target.type}), {span}",
            rows[:limit],
            rec,
            module_column=False,
            call_index=call_index,
        )
    )
    if len(rows) > limit:
        out.print(f"  ... {len(rows) - limit:,} more rows (use --step or --limit)")
    histograms = histogram_table(rows[:limit], rec, call_index)
    if histograms is not None:
        out.print(histograms)
