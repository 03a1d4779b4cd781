"""Running a query (hookdbg/analysis/query.py) against a recording."""

from __future__ import annotations

import numpy as np

from hookdbg.analysis.query import Query
from hookdbg.read.recording import Recording

TENSOR_COLUMNS = (
    "step",
    "call",
    "module",
    "phase",
    "slot",
    "path",
    "shape",
    "dtype",
    "numel",
    "min",
    "max",
    "mean",
    "std",
    "norm",
    "nan",
    "posinf",
    "neginf",
    "zero_frac",
)
CALL_COLUMNS = ("step", "call", "module", "phase", "index", "total", "self")


def search(recording: Recording, query: Query) -> np.ndarray:
    """Matching tensor rows (or call rows, for queries about modules only), in order.

    Reads only the steps the query allows and the columns it and the report need.
    """
    first, last = query.steps
    if query.on_tensors:
        columns = sorted(set(TENSOR_COLUMNS) | query.columns)
        rows = recording.tensors(first, last, columns)
    else:
        columns = sorted(set(CALL_COLUMNS) | query.columns)
        rows = recording.calls(first, last, columns)
    return rows[query.mask(rows, recording.modules)]
