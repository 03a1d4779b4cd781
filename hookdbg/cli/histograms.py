"""The histograms part of ``hookdbg show``: one sparkline per tensor that has one."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from hookdbg.analysis.histograms import has_histogram, sparkline
from hookdbg.cells import num
from hookdbg.cli.tables import step_text, table
from hookdbg.read import Recording
from hookdbg.store.schema import HISTOGRAM, Phase, slot_label
from hookdbg.text import utf8


def histogram_table(rows: Any, rec: Recording, call_index: dict[int, int]) -> Table | None:
    """Each row's histogram between its min and max, or None if no row has one."""
    kept = [r for r in rows if has_histogram(r)]
    if not kept:
        return None
    t = table(
        f"histograms: {rec.histogram_bins} bins, min to max (NaN/inf counted apart)",
        [("step", "right"), ("call", "right"), "phase", "slot", ("min", "right"), "values", "max"],
    )
    for r in kept:
        index = call_index.get(int(r["call"]))
        t.add_row(
            step_text(rec, r),
            "-" if index is None else str(index),
            Phase(int(r["phase"])).label,
            slot_label(int(r["slot"]), utf8(r["path"])),
            num(r["min"]),
            sparkline(r[HISTOGRAM]),
            num(r["max"]),
        )
    return t
