"""NaN/inf alerts with their context: the offending tensor, and what was still finite."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hookdbg.cells import TENSOR_COLUMNS
from hookdbg.read.modules import Module
from hookdbg.read.recording import Recording
from hookdbg.store.schema import Phase, Slot
from hookdbg.text import utf8


@dataclass(frozen=True)
class AlertReport:
    """One alert: its row, the module, the offending tensor's summary, and the tensors
    that fed it (forward: the call's inputs; backward: its output gradients; optimizer
    step: the parameter's gradient), which the origin rule says were finite."""

    alert: np.void
    module: Module
    tensor: np.void | None
    context_label: str
    context: np.ndarray
    # the op and line that made it, or that they were not found (an ``op_origin`` row:
    # its ``text`` says it; recorder/alerts/pinpoint.py), None if not looked for
    op: dict | None = None

    @property
    def op_said_apart(self) -> str | None:
        """What was found of the op, where the alert's own words do not say it already
        (a re-run's finding is in them; a watch's came later)."""
        if self.op is None or self.op["text"] in utf8(self.alert["message"]):
            return None
        return str(self.op["text"])


def alert_reports(recording: Recording) -> list[AlertReport]:
    reports = []
    for alert in recording.alerts:
        step = int(alert["step"])
        rows = recording.tensors(step, step, list(TENSOR_COLUMNS), kind=None)
        rows = rows[rows["segment"] == alert["segment"]]  # the step, or an eval batch
        phase, slot, call = int(alert["phase"]), int(alert["slot"]), int(alert["call"])
        same = rows[
            (rows["module"] == alert["module"])
            & (rows["phase"] == phase)
            & (rows["slot"] == slot)
            & (rows["path"] == alert["path"])
        ]
        if call >= 0 and len(same[same["call"] == call]):
            same = same[same["call"] == call]
        if phase == Phase.FWD and slot == Slot.INPUT:
            label, context = "", rows[:0]  # the offending tensor is the input itself
        elif phase == Phase.FWD:
            label = "its inputs"
            context = rows[(rows["call"] == call) & (rows["slot"] == Slot.INPUT)]
        elif phase == Phase.BWD:
            label = "the gradients w.r.t. its outputs"
            context = rows[(rows["call"] == call) & (rows["slot"] == Slot.GRAD_OUTPUT)]
        elif slot == Slot.STEP_GRAD:
            label = "this rank's own gradient"
            context = rows[
                (rows["module"] == alert["module"])
                & (rows["slot"] == Slot.PARAM_GRAD)
                & (rows["path"] == alert["path"])
            ]
        else:
            label = "the gradients the step used"
            context = rows[
                (rows["module"] == alert["module"])
                & np.isin(rows["slot"], [Slot.PARAM_GRAD, Slot.STEP_GRAD])
                & (rows["path"] == alert["path"])
            ]

        reports.append(
            AlertReport(
                alert=alert,
                module=recording.modules[int(alert["module"])],
                tensor=same[0] if len(same) else None,
                context_label=label,
                context=context,
                op=recording.op_origins.get(
                    (step, int(alert["module"]), phase, slot, utf8(alert["path"]))
                ),
            )
        )
    return reports
