"""``hookdbg show``: everything recorded about one module."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import click
import numpy as np

from hookdbg.analysis.histograms import histogram_json
from hookdbg.analysis.stepview import ModuleRows, module_rows
from hookdbg.cli.common import BadInput
from hookdbg.cli.histograms import histogram_table
from hookdbg.cli.inputs import (
    check_evals,
    check_steps,
    open_or_fail,
    open_run_or_fail,
    rank_option,
    resolve_or_fail,
    step_options,
)
from hookdbg.cli.report import Report, emit, json_option
from hookdbg.cli.tables import tensor_json, tensor_table
from hookdbg.cli.terminal import Output, literal, note
from hookdbg.read import RankSet, Recording
from hookdbg.read.modules import Module
from hookdbg.store.schema import Phase, slot_label
from hookdbg.text import utf8


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
@click.option(
    "--global",
    "merged",
    is_flag=True,
    help="A distributed run's sharded tensors (FSDP2, tensor parallel: DTensors) as their "
    "global tensors: each rank's row holds its local shard; this merges the shards of "
    "the ranks that hold them (a partial sum cannot be, and says so).",
)
@json_option
def show(
    recording: str,
    rank: int | None,
    module: str,
    steps: tuple[int | None, int | None],
    limit: int,
    evals: bool,
    merged: bool,
    as_json: bool,
) -> None:
    """Every summary recorded for MODULE in RECORDING: inputs, outputs, gradients and
    parameters, for one step (--step) or across steps. MODULE is a name as `hookdbg
    summary` prints it (model.layer1.0.conv1), its path (layer1.0.conv1) or a glob
    matching exactly one module. The call column says which call of the module in its
    step a row belongs to (0 for the first), for modules called several times."""
    # --global's own note says which rows are one rank's: rank 0's unless --rank says
    rec = open_or_fail(recording, quiet=as_json, rank=0 if merged and rank is None else rank)
    target = resolve_or_fail(rec, module, recording)
    # with --eval, --step/--steps number the eval batches, as reports label them
    first, last = check_evals(rec, steps, recording) if evals else check_steps(rec, steps)
    view = module_rows(rec, target.id, first, last, evals)
    if merged:
        view = _merged(recording, rec, view)
    emit(ModuleReport(rec, view, limit), as_json=as_json)


def _merged(recording: str, rec: Recording, view: ModuleRows) -> ModuleRows:
    """``view`` with its DTensor shards' rows as their global tensors'."""
    run = open_run_or_fail(recording, quiet=True)
    if not isinstance(run, RankSet):
        raise BadInput(
            f"--global merges the ranks of a distributed run; {recording} is one file "
            "(give run.h5 for run.rank0.h5, run.rank1.h5, ...)"
        )
    rows = run.global_tensors(rec.info.rank, view.rows)
    if not rec.shards:
        note(f"note: {rec.path} holds no DTensor: every row is this rank's own")
    return dataclasses.replace(view, rows=rows)


@dataclass
class ModuleReport(Report):
    """A module's rows over a range of steps or eval batches, the first ``limit`` shown."""

    rec: Recording
    view: ModuleRows
    limit: int

    def to_json(self) -> dict[str, object]:
        rec, view, limit = self.rec, self.view, self.limit
        return {
            "recording": str(rec.path),
            "module": view.module.name,
            "type": view.module.type,
            # where its class's forward is (a loss site: its backward call); null: unknown
            "source": _source(view.module),
            "rows": [
                {
                    **tensor_json(r, rec),
                    "call": view.call_index.get(int(r["call"])),
                    **histogram_json(r),
                    **_placement_json(r),
                }
                for r in view.rows[:limit]
            ],
            "total_rows": len(view.rows),
        }

    def render(self, out: Output) -> None:
        rec, view, limit = self.rec, self.view, self.limit
        target, rows = view.module, view.rows
        if not len(rows):
            where = "eval batches" if view.evals else f"steps {view.first}-{view.last}"
            timing = rec.info.options.get("level") == "timing"
            out.print(
                literal(f"{target.name} ({target.type}): no tensor summaries in {where}")
                + (" (recorded with --level timing)" if timing else "")
            )
            return
        shown = rows[:limit]
        title = f"{target.name} ({target.type}), {view.span}"
        out.print(tensor_table(title, shown, rec, module_column=False, call_index=view.call_index))
        if "placement" in (rows.dtype.names or ()):
            out.print(literal(_global_note(shown, rec.info.rank)))
        if len(rows) > limit:
            out.print(f"  ... {len(rows) - limit:,} more rows (use --step or --limit)")
        histograms = histogram_table(shown, rec, view.call_index)
        if histograms is not None:
            out.print(histograms)
        source = view.module.source
        if source is not None:
            out.print(literal(f"  source: {source[0]}:{source[1]}"))


def _global_note(shown: np.ndarray, rank: int) -> str:
    """What ``--global`` did to the rows shown: merged shards, replicas, and the rows
    that stay one rank's (named: a partial sum is easily taken for the whole)."""
    placed = shown[shown["placement"] != b""]
    merged = placed[placed["ranks"] != b""]
    unmerged = placed[placed["ranks"] == b""]
    replicated = np.array([set(utf8(p).split(",")) == {"R"} for p in unmerged["placement"]])
    others = unmerged[~replicated] if len(unmerged) else unmerged
    groups = sorted({(utf8(r["placement"]), utf8(r["ranks"])) for r in merged})
    kinds = "; ".join(f"{placement} from ranks {ranks}" for placement, ranks in groups)
    note = f"  global: {len(merged)} of {len(shown)} rows merged from their ranks' shards"
    note += f" ({kinds})" if kinds else ""
    if replicated.any():
        note += f"; {int(replicated.sum())} replicated (R): the same on every rank"
    if len(others):
        labels = sorted(
            {f"{Phase(r['phase']).label} {slot_label(r['slot'], utf8(r['path']))}" for r in others}
        )
        note += (
            f"; kept as rank {rank}'s own values, not the global tensor's: "
            f"{', '.join(labels)} (a partial sum, or a rank's file missing)"
        )
    return note


def _placement_json(row: np.void) -> dict[str, object]:
    """Where a merged row's shards came from (``show --global``)."""
    names = row.dtype.names or ()
    if "placement" not in names or not row["placement"]:
        return {}
    ranks = utf8(row["ranks"])
    return {
        "placement": utf8(row["placement"]),
        "merged_ranks": [int(r) for r in ranks.split(",")] if ranks else None,
    }


def _source(module: Module) -> dict[str, object] | None:
    source = module.source
    return None if source is None else {"file": source[0], "line": source[1]}
