"""How reports write a recording's values: the one place for the text of every cell.

The CLI tables, ``--json`` and the TUI widgets all write a tensor summary through
``tensor_text`` and the helpers here: the slot label (``param_grad[weight]``, defined
with the schema because the recorder names captures and alerts with it too), the shape,
compact numbers, the NaN/inf count, and which columns of a tensors row a report shows.

A NaN statistic has two readings. Where both must read differently (the TUI, for a NaN
hunt) ``cell_text`` writes ``nan`` for a tensor holding NaN/inf and ``-`` for a
statistic that was not recorded; the CLI tables write ``num``, which shows ``-`` for
both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hookdbg.store import summary as layout
from hookdbg.store.schema import (
    CHANGED_IN_PLACE,
    SUMMARY_COLUMNS,
    WHERE_COLUMNS,
    Phase,
    slot_label,
)
from hookdbg.text import printable, utf8

__all__ = [
    "CALL_COLUMNS",
    "CHANGED",
    "CHANGED_NOTE",
    "FRACTIONS",
    "STATS",
    "TENSOR_COLUMNS",
    "TensorText",
    "cell_text",
    "count_text",
    "fraction_text",
    "label",
    "nonfinite_count",
    "num",
    "shape_text",
    "slot_label",
    "stat_text",
    "tensor_text",
]

# what a report shows of a tensor row (everything but the device), and of a call row
TENSOR_COLUMNS = tuple(c for c in (*WHERE_COLUMNS, *SUMMARY_COLUMNS) if c != "device")
CALL_COLUMNS = ("step", "segment", "call", "module", "phase", "index", "total", "self")

# the statistics of a tensor summary that tables show, in their order (summary.py's
# shown numbers: min, max, mean, std, norm), then its shown fractions (zero_frac...)
STATS = layout.STATS
FRACTIONS = layout.FRACTIONS
# the TUI's tables place min, max, mean, std and norm by hand; the statistics declared
# after them follow, each a column of its own
PLACED = ("min", "max", "mean", "std", "norm")
assert STATS[: len(PLACED)] == PLACED
LATER_STATS = STATS[len(PLACED) :]


def label(name: str) -> str:
    """A summary field's column title: ``zeros`` for zero_frac."""
    return layout.field(name).label


def num(value: float, digits: int = 4) -> str:
    """Compact numbers for tables: 0.1234, 1.234e+05, nan, inf."""
    value = float(value)
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    if 1e-3 <= abs(value) < 1e5:
        return f"{value:.{digits}g}"
    return f"{value:.{max(digits - 1, 1)}e}"


def shape_text(shape: bytes | str) -> str:
    """'16,64,32,32' -> '(16, 64, 32, 32)'; scalars -> '()'."""
    text = utf8(shape)
    return f"({text.replace(',', ', ')})" if text else "()"


def nonfinite_count(row: np.void) -> int:
    """NaN and inf elements of one tensors row together; below 0 where none were counted
    (schema.NOT_LOOKED, schema.CHANGED_IN_PLACE)."""
    nan = int(row["nan"])
    return nan + int(row["posinf"]) + int(row["neginf"]) if nan >= 0 else nan


def fraction_text(value: float) -> str:
    """A fraction as a percentage, ``37%``; ``-`` where it was not recorded."""
    value = float(value)
    return "-" if math.isnan(value) else f"{value:.0%}"


def stat_text(value: float) -> str:
    """``0.1234``, ``1.2e+05``, ``nan``, ``inf``, ``-inf``."""
    value = float(value)
    return "nan" if math.isnan(value) else num(value)


def cell_text(value: float, nonfinite: int) -> str:
    """A statistic of a tensor with ``nonfinite`` NaN/inf elements (-1: not looked
    at): ``-`` when it was not recorded, ``nan`` when it is NaN."""
    if nonfinite < 0 or (nonfinite == 0 and math.isnan(float(value))):
        return "-"
    return stat_text(value)


# what ``count_text`` writes for a tensor whose values changed in place before its
# statistics were taken, and what it means
CHANGED = "changed"
CHANGED_NOTE = (
    "changed: its values changed in place between its hook and its statistics (taken "
    "later on a GPU: at the end of the backward pass or of the step); nothing is known of "
    "them in that step, and from the next step on that tensor is copied at its hook"
)


def count_text(count: int) -> str:
    """NaN/inf elements of a tensor: ``-`` when values were not looked at, ``changed``
    when they changed in place before they were counted."""
    if count == CHANGED_IN_PLACE:
        return CHANGED
    return "-" if count < 0 else f"{count:,}"


@dataclass(frozen=True)
class TensorText:
    """One tensor summary row as text, every string safe to print on a terminal."""

    phase: str
    slot: str  # input[0], output, param_grad[weight]
    path: str  # the raw path inside the slot ("weight", "0", "")
    shape: str
    dtype: str
    nonfinite: int  # NaN and inf elements; -1 when values were not looked at
    count: str  # ``nonfinite`` as text
    values: dict[str, float]  # the statistics (STATS), as numbers
    fractions: dict[str, str]  # the fractions (FRACTIONS) as text, "37%"

    @property
    def zeros(self) -> str:
        """The zero fraction, "37%"."""
        return self.fractions["zero_frac"]

    def stat(self, name: str) -> str:
        """A statistic as the TUI writes it (``nan`` and ``-`` apart)."""
        return cell_text(self.values[name], self.nonfinite)


def tensor_text(row: np.void) -> TensorText:
    """The one formatter of a tensors row: what every report writes for it."""
    path = utf8(row["path"])
    names = row.dtype.names or ()
    bad = nonfinite_count(row)
    return TensorText(
        phase=Phase(int(row["phase"])).label,
        slot=printable(slot_label(int(row["slot"]), path)),
        path=path,
        shape=printable(shape_text(row["shape"])),
        dtype=printable(utf8(row["dtype"])),
        nonfinite=bad,
        count=count_text(bad),
        values=_values(row),
        # a row read without a field (a report's own selection of columns) shows ``-``
        fractions={n: fraction_text(row[n]) if n in names else "-" for n in FRACTIONS},
    )


def _values(row: np.void) -> dict[str, float]:
    """A row's statistics; the recorded min and max are of the finite values, so a
    tensor holding -inf or inf has those as its own (an attention mask's min is -inf)."""
    names = row.dtype.names or ()
    # a row read without a field (a report's own selection of columns) shows ``-``
    values = {name: float(row[name]) if name in names else math.nan for name in STATS}
    for stat, count, infinite in (("min", "neginf", -math.inf), ("max", "posinf", math.inf)):
        if stat in values and count in names and int(row[count]) > 0:
            values[stat] = infinite
    return values
