"""``Shared``: what a recorder makes once and its hooks and segments all share.

core.py builds one and hands it to the tensor observer, the optimizer hooks and the
segments, rather than each of them taking the same nine objects one by one. Each keeps
the ones it uses as attributes of its own (the C path reads them there: cboundary.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hookdbg.options import RecordOptions
from hookdbg.recorder.alerts.capture import FlightRecorder
from hookdbg.recorder.alerts.headroom import HeadroomWatch
from hookdbg.recorder.alerts.nonfinite import OriginDetector
from hookdbg.recorder.alerts.pinpoint import Pinpointer
from hookdbg.recorder.alerts.sentinel import Sentinel
from hookdbg.recorder.calls.envelope import Guard
from hookdbg.recorder.calls.handoff import Handoff
from hookdbg.recorder.calls.naming import ModuleRegistry
from hookdbg.store.rows import Rows

if TYPE_CHECKING:
    from hookdbg.recorder.steps.steps import StepTracker


@dataclass(frozen=True)
class Shared:
    """One recording's shared objects, made by ``Recorder.__init__``."""

    options: RecordOptions
    guard: Guard  # what wraps every hook (its C twin on the C path)
    rows: Rows  # the rows waiting for the writer
    handoff: Handoff  # hands them to the writer
    registry: ModuleRegistry  # module names and what is recorded
    steps: StepTracker  # which root call is a step
    detector: OriginDetector  # where a NaN/inf was born
    flight: FlightRecorder | None  # the last steps' tensors, kept for an alert
    warn: Callable[[str], None]  # a warning to the user
    pinpoint: Pinpointer | None = None  # the op that made an origin (None: no checks)
    headroom: HeadroomWatch | None = None  # outputs nearing their dtype's top (ditto)
    sentinel: Sentinel | None = None  # the check where module calls are not (--no-nan-check: None)
