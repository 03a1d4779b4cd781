"""``hookdbg show``: everything recorded about one module."""

from __future__ import annotations

import click

from hookdbg.cli.app import cli
from hookdbg.cli.common import BadInput
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


@cli.command()
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
@json_option
def show(
    recording: str,
    rank: int | None,
    module: str,
    steps: tuple[int | None, int | None],
    limit: int,
    as_json: bool,
) -> None:
    """Every summary recorded for MODULE in RECORDING: inputs, outputs, gradients and
    parameters, for one step (--step) or across steps. MODULE is a name as `hookdbg
    summary` prints it (model.layer1.0.conv1), its path (layer1.0.conv1) or a glob
    matching exactly one module."""
    rec = open_or_fail(recording, quiet=as_json, rank=rank)
    try:
        target = rec.modules.resolve(module)
    except LookupError as exc:
        raise BadInput(f"{exc} (`hookdbg summary {recording}` lists them)") from None
    first, last = check_steps(rec, steps)
    rows = rec.tensors(first, last)
    rows = rows[rows["module"] == target.id]
    if as_json:
        emit_json(
            {
                "recording": str(rec.path),
                "module": target.name,
                "type": target.type,
                "rows": [tensor_json(r, rec.modules) for r in rows[:limit]],
                "total_rows": len(rows),
            }
        )
        return
    out = console()
    if not len(rows):
        out.print(
            literal(f"{target.name} ({target.type}): no tensor summaries in steps {first}-{last}")
            + (
                ""
                if rec.info.options.get("level") != "timing"
                else " (recorded with --level timing)"
            )
        )
        return
    span = f"step {first}" if first == last else f"steps {first}-{last}"
    out.print(
        tensor_table(
            f"{target.name} ({target.type}), {span}", rows[:limit], rec.modules, module_column=False
        )
    )
    if len(rows) > limit:
        out.print(f"  ... {len(rows) - limit:,} more rows (use --step or --limit)")
