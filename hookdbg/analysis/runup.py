"""The run-up to an alert: how the tensor that went non-finite, the tensors feeding it
and its module's parameters climbed over the last recorded steps, each step's largest
magnitude set against its dtype's largest finite value (an fp16 overflow is seen coming
as 2.39e4, 4.50e4, inf against 65504)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hookdbg.analysis.alerts import AlertReport
from hookdbg.cells import TENSOR_COLUMNS, num, slot_label
from hookdbg.read.recording import Recording
from hookdbg.store.schema import Phase, Slot
from hookdbg.store.summary import LARGEST
from hookdbg.text import utf8

STEPS = 5  # recorded steps shown, the alert's the last
TITLE = "largest finite magnitude (% of dtype's max, shown from 1%)"


@dataclass(frozen=True)
class Climb:
    """One tensor over the run-up: per step, its largest finite magnitude (NaN where it
    held no finite value or was not recorded) and its NaN and inf counts."""

    label: str  # "output", "input[0]", "param[weight]"...
    dtype: str
    steps: tuple[int, ...]
    absmax: tuple[float, ...]
    nan: tuple[int, ...]
    inf: tuple[int, ...]

    @property
    def largest(self) -> float | None:
        """The dtype's largest finite value (None: not a floating dtype known here)."""
        return LARGEST.get(self.dtype)

    def headroom(self, i: int) -> float | None:
        """Step ``i``'s magnitude as a fraction of the dtype's largest finite value."""
        largest, value = self.largest, self.absmax[i]
        return None if largest is None or math.isnan(value) else value / largest

    def text(self, i: int) -> str:
        """Step ``i`` as a cell: ``6.41e+04 (98%), 8 inf``; the share of the dtype's
        largest finite value where it is 1% or more; ``-`` where nothing was recorded."""
        value, share = self.absmax[i], self.headroom(i)
        parts = []
        if not math.isnan(value):
            used = f" ({share:.0%})" if share is not None and share >= 0.01 else ""
            parts.append(num(value, 3) + used)
        parts += [f"{n} {what}" for n, what in ((self.nan[i], "NaN"), (self.inf[i], "inf")) if n]
        return ", ".join(parts) or "-"


def run_up(recording: Recording, report: AlertReport, steps: int = STEPS) -> list[Climb]:
    """The climbs of the alert's tensor, what fed it (``report.context``) and its
    module's parameters, over the last ``steps`` recorded steps up to the alert's."""
    alert = report.alert
    step, module = int(alert["step"]), int(alert["module"])
    recorded = recording.recorded_steps
    shown = [int(s) for s in recorded[recorded <= step][-steps:]] or [step]
    rows = recording.tensors(shown[0], step, list(TENSOR_COLUMNS), kind=None)
    rows = rows[(rows["module"] == module) & np.isin(rows["step"], shown)]
    wanted = [(int(alert["phase"]), int(alert["slot"]), bytes(alert["path"]))]
    wanted += sorted({(int(c["phase"]), int(c["slot"]), bytes(c["path"])) for c in report.context})
    params = rows[rows["slot"] == Slot.PARAM]
    wanted += sorted({(int(p["phase"]), Slot.PARAM, bytes(p["path"])) for p in params})
    climbs = []
    for phase, slot, path in dict.fromkeys(wanted):  # in order, once each
        mine = rows[(rows["phase"] == phase) & (rows["slot"] == slot) & (rows["path"] == path)]
        if not len(mine):
            continue
        per_step = [mine[mine["step"] == s] for s in shown]
        label = slot_label(slot, utf8(path))
        if phase == Phase.OPT:  # as the optimizer step left it, not as the module ran
            label += " after the step"
        climb = Climb(
            label=label,
            dtype=utf8(mine[-1]["dtype"]),
            steps=tuple(shown),
            absmax=tuple(_absmax(r) for r in per_step),
            nan=tuple(int(np.maximum(r["nan"], 0).sum()) for r in per_step),
            inf=tuple(
                int((np.maximum(r["posinf"], 0) + np.maximum(r["neginf"], 0)).sum())
                for r in per_step
            ),
        )
        if any(not math.isnan(v) for v in climb.absmax) or any(climb.nan) or any(climb.inf):
            climbs.append(climb)  # (a parameter's values summarised by norms alone: none)
    return climbs


def _absmax(rows: np.ndarray) -> float:
    """The largest finite magnitude over a step's rows (every call of the module)."""
    values = np.abs(np.concatenate([rows["min"], rows["max"]]))
    values = values[np.isfinite(values)]
    return float(values.max()) if len(values) else math.nan
