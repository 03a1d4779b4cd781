"""How the TUI writes a statistic. A NaN statistic of a tensor holding NaN/inf is
``nan``, not ``-``: in a NaN hunt "this value is NaN" and "this was not recorded" (a
statistic the recorder left out, as it does for weights after a step, or a tensor
whose values were not looked at) must read differently."""

from __future__ import annotations

import math

from hookdbg.text import num


def stat_text(value: float) -> str:
    """``0.1234``, ``1.2e+05``, ``nan``, ``inf``, ``-inf``."""
    value = float(value)
    return "nan" if math.isnan(value) else num(value)


def cell_text(value: float, nonfinite: int) -> str:
    """A statistic of a tensor with ``nonfinite`` NaN/inf elements (-1: not looked
    at): ``-`` when it was not recorded."""
    if nonfinite < 0 or (nonfinite == 0 and math.isnan(float(value))):
        return "-"
    return stat_text(value)


def count_text(count: int) -> str:
    """NaN/inf elements of a tensor: ``-`` when values were not looked at."""
    return "-" if count < 0 else f"{count:,}"
