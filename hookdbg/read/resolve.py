"""A recording's tables with ids and codes resolved into what they mean, column by column.

Stored rows say ``module 7, phase 1, slot 2, segment 12``; people and pandas want
``model.layer1.0.conv1 (Conv2d), bwd, grad_output, step 5``. The resolution works on
whole columns (each distinct id or code is looked up once, then gathered with numpy),
so ``Recording.to_pandas`` and ``hookdbg export --format csv|json`` share it and a
million rows resolve in well under a second.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from hookdbg.cells import shape_text
from hookdbg.store.schema import ModuleKind, Phase, Slot, StepKind
from hookdbg.text import utf8

if TYPE_CHECKING:  # pandas is optional: imported only by to_pandas
    import pandas as pd  # type: ignore[import-untyped, unused-ignore]

    from hookdbg.read.recording import Recording
    from hookdbg.read.table import Table

TABLES = ("tensors", "calls", "steps", "alerts", "modules", "losses")

_PHASES = np.array([p.label for p in Phase], dtype=object)
_SLOTS = np.array([s.label for s in Slot], dtype=object)
_KINDS = np.array([k.name.lower() for k in StepKind], dtype=object)  # train, eval
_MODULE_KINDS = np.array([k.name.lower() for k in ModuleKind], dtype=object)
_COUNTS = ("nan", "posinf", "neginf")  # -1: values were not looked at
_FLAGS = ("backward", "recorded", "first")  # stored as 0/1


@dataclass
class Columns:
    """Resolved columns of one table, in order. ``missing`` marks values that were not
    measured (NaN/inf counts at ``--level shapes``): ``None`` in rows, ``<NA>`` in pandas."""

    data: dict[str, np.ndarray]
    missing: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(next(iter(self.data.values()))) if self.data else 0

    def rows(self) -> Iterator[dict[str, object]]:
        """Plain Python rows for CSV and JSON: NaN and unmeasured values are None."""
        names = list(self.data)
        columns = []
        for name, values in self.data.items():
            items: list[Any] = values.tolist()
            holes = self.missing.get(name)
            if values.dtype.kind == "f":
                holes = np.isnan(values) | (False if holes is None else holes)
            if holes is not None and holes.any():
                for i in np.flatnonzero(holes).tolist():
                    items[i] = None
            columns.append(items)
        for row in zip(*columns, strict=True):
            yield dict(zip(names, row, strict=True))

    def to_pandas(self) -> pd.DataFrame:
        pd = _pandas()
        data: dict[str, Any] = {}
        for name, values in self.data.items():
            holes = self.missing.get(name)
            data[name] = values if holes is None else pd.arrays.IntegerArray(values, holes)
        return pd.DataFrame(data)


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise ImportError(
            "to_pandas needs pandas, which is not installed: pip install 'hookdbg[pandas]'"
        ) from None
    return pandas


def resolve(recording: Recording, table: str, rows: np.ndarray) -> Columns:
    """Rows of ``table`` (a structured array as the reader returns them, any subset of
    its columns) with names and labels in place of ids and codes."""
    out = Columns({})
    for name in rows.dtype.names or ():
        values = rows[name]
        if name == "module":
            out.data["module"] = _lookup(values, recording.modules.name)
            out.data["type"] = _lookup(values, lambda i: recording.modules[i].type)
        elif name == "segment":  # which step or eval batch: 'step 3', 'eval batch 0'
            out.data["segment"] = values
            out.data["of"] = _lookup(values, recording.segment_label)
            if "kind" not in (rows.dtype.names or ()):
                out.data["kind"] = _KINDS[recording.is_eval(values).astype(np.intp)]
        elif name == "kind":
            labels = _MODULE_KINDS if table == "modules" else _KINDS
            out.data["kind"] = labels[values]
        elif name == "phase":
            out.data["phase"] = _PHASES[values]
        elif name == "slot":
            out.data["slot"] = _SLOTS[values]
        elif name == "shape":
            out.data["shape"] = _lookup(values, shape_text)
        elif name in _FLAGS:
            out.data[name] = values.astype(bool)
        elif values.dtype.kind == "S":
            out.data[name] = _lookup(values, utf8)
        elif name in _COUNTS:
            out.data[name] = values
            out.missing[name] = values < 0
        elif values.dtype.kind == "f":
            out.data[name] = values.astype(np.float64)
        else:
            out.data[name] = values
    return out


def read_rows(
    recording: Recording,
    table: str,
    first: int | None = None,
    last: int | None = None,
    columns: list[str] | None = None,
) -> np.ndarray:
    """Stored rows of ``table`` for steps ``first``..``last`` (eval batches by the step
    they came after; all when both are None), with only ``columns`` if given."""
    if table not in TABLES:
        raise ValueError(f"no table {table!r}; tables are {', '.join(TABLES)}")
    if table in ("tensors", "calls"):
        return _stored(recording, table).read(columns, row_span(recording, table, first, last))
    if table == "modules":
        rows = recording.module_rows
    else:
        rows = {"steps": recording.segments, "losses": recording.losses}.get(
            table, recording.alerts
        )
        lo = -(2**31) if first is None else first
        hi = 2**31 - 1 if last is None else last
        rows = rows[(rows["step"] >= lo) & (rows["step"] <= hi)]
    if columns is not None:
        names = rows.dtype.names or ()
        unknown = [c for c in columns if c not in names]
        if unknown:
            raise ValueError(f"no column {unknown[0]!r} in {table}; columns are {', '.join(names)}")
        rows = rows[columns]
    return rows


def blocks(
    recording: Recording,
    table: str,
    first: int | None = None,
    last: int | None = None,
    size: int = 1 << 14,
) -> Iterator[Columns]:
    """``table`` resolved, ``size`` rows at a time: a long recording is never all in
    memory (calls and tensors are read block by block; the other tables are small)."""
    if table not in ("tensors", "calls"):
        yield resolve(recording, table, read_rows(recording, table, first, last))
        return
    stored = _stored(recording, table)
    span = row_span(recording, table, first, last)
    for start in range(span.start, span.stop, size):
        rows = stored.read(None, slice(start, min(start + size, span.stop)))
        yield resolve(recording, table, rows)


def row_span(recording: Recording, table: str, first: int | None, last: int | None) -> slice:
    """The rows of ``calls`` or ``tensors`` in steps ``first``..``last``, eval batches
    included (their rows carry the step they came after)."""
    stored = _stored(recording, table)
    if first is None and last is None:
        return slice(0, len(stored))
    lo, hi = recording.segment_range(first, last)
    return stored.step_rows(lo, hi)


def _stored(recording: Recording, table: str) -> Table:
    return recording.tensors_table if table == "tensors" else recording.calls_table


def _lookup(values: np.ndarray, label: Any) -> np.ndarray:
    """``label(v)`` for every value, computed once per distinct value."""
    if not len(values):
        return np.empty(0, dtype=object)
    distinct, where = np.unique(values, return_inverse=True)
    labels = np.array([label(v.item()) for v in distinct], dtype=object)
    return labels[where.reshape(-1)]
