"""Running a query (hookdbg/analysis/query.py) against a recording.

Two passes, so a search over millions of rows stays fast: the query is evaluated on
just the columns it names (``std<1e-6`` reads ``std``), then the columns a report
shows are read only for the matches it will show.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hookdbg.analysis.query import Query
from hookdbg.cells import CALL_COLUMNS, TENSOR_COLUMNS
from hookdbg.read.recording import Recording


@dataclass(frozen=True)
class SearchResult:
    total: int  # all matches
    rows: np.ndarray  # the first ``limit`` of them, with the report columns
    on_tensors: bool  # tensor summaries (else module calls)


def search(recording: Recording, query: Query, limit: int | None = None) -> SearchResult:
    """Matching tensor rows (or call rows, for queries about modules only), in order."""
    table = recording.tensors_table if query.on_tensors else recording.calls_table
    first, last = query.steps
    span = table.step_rows(
        -(2**31) if first is None else first, 2**31 - 1 if last is None else last
    )
    data = table.read(sorted(query.columns) or ["step"], span)
    matches = np.flatnonzero(query.mask(data, recording.modules)) + (span.start or 0)
    shown = matches if limit is None else matches[:limit]
    columns = TENSOR_COLUMNS if query.on_tensors else CALL_COLUMNS
    return SearchResult(len(matches), table.take(shown, columns), query.on_tensors)
