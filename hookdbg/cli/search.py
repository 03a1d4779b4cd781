"""``hookdbg search``: find module calls and tensors by name, type and statistics."""

from __future__ import annotations

from dataclasses import dataclass

import click
import numpy as np
from rich.table import Table

from hookdbg.analysis.query import STATS, Query, QueryError, parse
from hookdbg.analysis.search import SearchResult
from hookdbg.analysis.search import search as run_search
from hookdbg.cli.common import BadInput, plural
from hookdbg.cli.inputs import open_or_fail, rank_option, require_calls
from hookdbg.cli.report import Report, emit, json_option
from hookdbg.cli.tables import ms, step_text, table, tensor_json, tensor_table
from hookdbg.cli.terminal import Output, literal
from hookdbg.read import Recording
from hookdbg.store.schema import Phase


@click.command(
    epilog=f"""\b
Query terms (all must match; !term negates; | separates alternatives):
  layer3.*  name:GLOB     module name or path glob
  type:Conv2d|Linear      module class
  phase:fwd|bwd|opt       slot:input|output|grad_output|grad_input|param_grad|param|grad
  step:5  step:3:7        dtype:float16  path:mask
  nan  inf  nonfinite     tensors holding NaN / inf
  max>1e4  std<1e-6       {" ".join(STATS)}
\b
Examples:
  hookdbg search run.h5 nan
  hookdbg search run.h5 'type:BatchNorm2d std<1e-6'
  hookdbg search run.h5 'layer4.* phase:bwd norm>10'"""
)
@click.argument("recording")
@rank_option
@click.argument("query", nargs=-1, required=True)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=50,
    show_default=True,
    help="Show at most this many matches.",
)
@json_option
def search(
    recording: str, rank: int | None, query: tuple[str, ...], limit: int, as_json: bool
) -> None:
    """Find the module calls or tensor summaries in RECORDING that match QUERY."""
    try:
        parsed = parse(" ".join(query))
    except QueryError as exc:
        raise BadInput(f"bad query: {exc}") from None
    rec = open_or_fail(recording, quiet=as_json, rank=rank)
    require_calls(rec)
    emit(SearchReport(rec, parsed, run_search(rec, parsed, limit), limit), as_json=as_json)


@dataclass
class SearchReport(Report):
    """The matches of a query, the first ``limit`` of them shown."""

    rec: Recording
    parsed: Query
    result: SearchResult
    limit: int

    def to_json(self) -> dict[str, object]:
        rec, parsed, result = self.rec, self.parsed, self.result
        rows = (
            [tensor_json(r, rec) for r in result.rows]
            if result.on_tensors
            else [
                {
                    "step": int(r["step"]),
                    "eval": step_text(rec, r).startswith("eval"),
                    "module": rec.modules.name(int(r["module"])),
                    "phase": Phase(int(r["phase"])).label,
                    "call": int(r["index"]),
                    "total_seconds": float(r["total"]),
                    "self_seconds": float(r["self"]),
                }
                for r in result.rows
            ]
        )
        return {
            "recording": str(rec.path),
            "query": parsed.text,
            "matches": result.total,
            "rows": rows,
        }

    def render(self, out: Output) -> None:
        rec, parsed, result, limit = self.rec, self.parsed, self.result, self.limit
        what = (
            plural(result.total, "tensor summary", "tensor summaries")
            if result.on_tensors
            else plural(result.total, "module call")
        )
        title = f"{rec.path}: {what} match {parsed.text!r}"
        if not result.total:
            out.print(literal(title))
            return
        if result.on_tensors:
            out.print(tensor_table(title, result.rows, rec))
        else:
            out.print(_calls_table(title, result.rows, rec))
        if result.total > limit:
            more = plural(result.total - limit, "more match", "more matches")
            out.print(f"  ... {more} (--limit shows more)")


def _calls_table(title: str, rows: np.ndarray, rec: Recording) -> Table:
    """Module call rows: where (step, module, phase, nth call in the step) and times."""
    t = table(
        title,
        [
            ("step", "right"),
            "module",
            "type",
            "phase",
            ("call", "right"),
            ("total ms", "right"),
            ("self ms", "right"),
        ],
    )
    for r in rows:
        m = rec.modules[int(r["module"])]
        t.add_row(
            step_text(rec, r),
            m.name,
            m.type,
            Phase(int(r["phase"])).label,
            str(r["index"]),
            ms(r["total"]),
            ms(r["self"]),
        )
    return t
