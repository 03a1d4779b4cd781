"""What a NaN/inf origin does besides being recorded: a warning, the flight recorder's
tensors, and --on-nan break, raise or stop."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from time import time

from hookdbg.recorder.alerts.alert import Alert
from hookdbg.recorder.alerts.capture import FlightRecorder
from hookdbg.recorder.alerts.headroom import HEADROOM, HeadroomWarning
from hookdbg.recorder.alerts.nonfinite import OriginDetector
from hookdbg.recorder.alerts.pinpoint import Pinpointer
from hookdbg.recorder.calls.envelope import Guard
from hookdbg.recorder.summaries.stats import FIELDS
from hookdbg.store.rows import Rows
from hookdbg.store.schema import MESSAGE_BYTES, Phase
from hookdbg.text import plural


class NonFiniteError(FloatingPointError):
    """Raised into the training script by ``--on-nan raise`` at a NaN/inf origin."""

    def __init__(self, alert: Alert) -> None:
        super().__init__(alert.message())
        self.step = alert.step
        self.module = alert.module.name
        self.phase = alert.phase.label
        self.slot = alert.slot.label
        self.path = alert.path


class NonFiniteStop(BaseException):
    """Ends the run at the first NaN/inf origin (``--on-nan stop``). A BaseException,
    so that a script's ``except Exception`` does not swallow it."""

    def __init__(self, alert: Alert | HeadroomWarning) -> None:
        super().__init__(alert.message())
        self.alert = alert

    @property
    def where(self) -> str:
        """Where the run stopped, as its end line says."""
        if self.alert.received:
            return "where a NaN/inf first came from another rank (--on-nan stop)"
        return "at the first NaN/inf origin (--on-nan stop)"


class HeadroomStop(NonFiniteStop):
    """Ends the run at a headroom warning (``--on-headroom stop``), before the overflow."""

    @property
    def where(self) -> str:
        return "at a headroom warning, before the overflow (--on-headroom stop)"


class HeadroomError(FloatingPointError):
    """Raised into the training script by ``--on-headroom raise``: a module output's
    values neared its dtype's largest finite value (``hookdbg alerts`` shows the run-up)."""

    def __init__(self, warning: HeadroomWarning) -> None:
        super().__init__(warning.message())
        self.step = warning.step
        self.module = warning.module.name
        self.path = warning.path


def interactive() -> bool:
    """Whether a debugger prompt could be answered (else --on-nan break would hang CI)."""
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def nan_breakpoint(alert: Alert) -> None:
    """Open the debugger (``breakpoint()``: pdb, or whatever $PYTHONBREAKPOINT names)
    with the origin's objects as locals of this frame; ``continue`` resumes training."""
    context = alert.context
    module = context.get("module")  # noqa: F841 (for the user at the prompt)
    inputs = context.get("inputs")  # noqa: F841
    output = context.get("output")  # noqa: F841
    grad = context.get("grad")  # noqa: F841
    step = alert.step  # noqa: F841
    summary = dict(zip(FIELDS, alert.summary, strict=True))  # noqa: F841
    names = ", ".join(
        [
            "module",
            *(k for k in ("inputs", "output", "grad") if k in context),
            "step",
            "summary",
            "alert",
        ]
    )
    print(
        f"\nhookdbg: in the debugger at the {alert.phase.label} hook where {alert.kind} was born "
        f"({alert.where}, {alert.segment.when.removeprefix('at ').removeprefix('in ')}). "
        f"Locals: {names}. 'up' walks into the model's "
        "code, 'c' continues training.",
        file=sys.stderr,
        flush=True,
    )
    breakpoint()
    return  # the debugger stops on this line, in this frame, with the locals above


class Actions:
    """What happens to the origins the hooks find: ``alert`` queues one with the live
    objects a debugger would want, and ``act`` (run by each hook after its error guard,
    so that an action may raise into the training code) records them, reports each
    new origin (``report``: a line that --quiet does not hide; ``warn`` is a status
    line), writes the flight recorder's tensors, then does what --on-nan asks."""

    def __init__(
        self,
        guard: Guard,
        rows: Rows,
        detector: OriginDetector,
        on_nan: str,
        warn: Callable[[str], None],
        report: Callable[[str], None],
        handoff: Callable[[], None],
        flight: FlightRecorder | None,
        path: Path,
        pinpoint: Pinpointer | None = None,
        on_headroom: str = "warn",
    ) -> None:
        self.guard = guard
        self.rows = rows
        self.detector = detector
        self.on_nan = on_nan
        self.warn = warn
        self.report = report
        self.handoff = handoff
        self.flight = flight
        self.path = path
        self.pinpoint = pinpoint
        self.on_headroom = on_headroom
        # --on-nan record: what records the steps after an alert the sentinel made
        # (sentinel.py; set by the recorder)
        self.zoom: Callable[[Alert], None] | None = None
        guard.actions = self.act

    def alert(self, alert: Alert | None, **context: object) -> None:
        """Queue an origin found by a hook, with the live objects a debugger would want.
        A gradient's, in a step whose loss a GradScaler scaled, waits for the scaler's
        decision instead (recorder/hooks/gradscaler.py)."""
        if alert is None:
            return
        held = alert.segment.held
        if held is not None and alert.phase != Phase.FWD:
            held.append((alert, context))
            return
        self.release(alert, context)

    def release(self, alert: Alert, context: dict[str, object]) -> None:
        alert.context = context
        self.guard.alerts.append(alert)

    def act(self, actions: bool = True) -> None:
        """Act on the alerts the hooks queued (``Guard.act`` calls this, its time counted
        as hookdbg's); ``actions`` False: record and report them only (the script is
        over)."""
        guard = self.guard
        found, guard.alerts = guard.alerts, []
        alerts = [a for a in found if isinstance(a, Alert)]
        headroom = [a for a in found if isinstance(a, HeadroomWarning)]
        new_origin = None
        action = "warn" if self.on_nan == "record" else self.on_nan
        try:
            for warning in headroom:
                with guard.lock:
                    self.rows.info.append((time(), HEADROOM, warning.value()[:MESSAGE_BYTES]))
                self.report(warning.message())
            for alert in alerts:
                new = self.detector.is_new_origin(alert)
                # the sentinel's: run again where found at once (its call at hand)
                if self.pinpoint is not None and (not alert.unchecked or "inputs" in alert.context):
                    self._pinpoint(alert, new)
                with guard.lock:
                    self.rows.alerts.append(alert.row())
                if new:
                    new_origin = new_origin or alert
                    self.report(alert.message())
                    with guard.lock:
                        self._fly(alert)
                if new and alert.unchecked and self.zoom is not None:
                    self.zoom(alert)
            if action != "warn" and actions:
                with guard.lock:
                    self.handoff()  # what led here is on its way to disk before anything else
        except Exception:  # a bug in hookdbg: the recording stops, not the training
            guard.broken()  # nor the action asked for
        if headroom and actions and self.on_headroom != "warn":
            self._headroom_action(headroom[0])
        if action == "warn" or not actions or not alerts:
            return
        stop_at = alerts[0] if action in ("raise", "stop") else None
        if action == "break" and new_origin is not None:
            if interactive():
                nan_breakpoint(new_origin)
                return
            self.report(
                "--on-nan break needs a terminal to type into (stdin is not one); stopping instead"
            )
            stop_at = new_origin
        if stop_at is None:
            return
        # the script is cut short in this segment: a training forward there is the
        # training step its alert named, not an eval batch, whatever the script does next
        stop_at.segment.interrupted = True
        if action == "raise":
            raise NonFiniteError(stop_at)
        raise NonFiniteStop(stop_at)

    def _headroom_action(self, warning: HeadroomWarning) -> None:
        """--on-headroom break, raise or stop, at the first warning of a hook."""
        with self.guard.lock:
            self.handoff()  # what led here is on its way to disk before anything else
        action = self.on_headroom
        if action == "break" and interactive():
            print(
                f"\nhookdbg: in the debugger at a {warning.message()}. Locals: warning, "
                "step, module (the module's name); 'c' continues training.",
                file=sys.stderr,
                flush=True,
            )
            step, module = warning.step, warning.module.name  # noqa: F841 (for the prompt)
            breakpoint()
            return
        if action == "break":
            self.report(
                "--on-headroom break needs a terminal to type into (stdin is not one); "
                "stopping instead"
            )
        if action == "raise":
            raise HeadroomError(warning)
        raise HeadroomStop(warning)

    def _pinpoint(self, alert: Alert, new: bool) -> None:
        """The op that made a new origin, or one the watch looks for (pinpoint.py). A
        failure there ends the op-level check, said, and nothing else."""
        pinpoint = self.pinpoint
        assert pinpoint is not None
        try:
            if new:
                pinpoint.origin(alert)
            else:
                pinpoint.seen(alert)
        except Exception as exc:
            self.pinpoint = None
            with contextlib.suppress(Exception):
                pinpoint.stop()
            problem = f"op-level check failed, and is off: {type(exc).__name__}: {exc}"
            self.warn(problem)
            pinpoint.note(pinpoint.FAILED_KEY, problem)

    def _fly(self, alert: Alert) -> None:
        """Write the flight recorder's tensors around a new origin."""
        if self.flight is None or alert.origin is None:
            return
        rows, stale = self.flight.dump(alert.origin, alert.segment)
        if rows:
            self.rows.captures.extend(rows)
            steps = sorted({r[0] for r in rows})
            span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
            if not alert.segment.training:
                span = alert.segment.when.removeprefix("in ")
            note = (
                f"; {plural(stale, 'tensor')} changed in place since "
                + ("it was seen, so it was left out" if stale == 1 else "seen, so left out")
                if stale
                else ""
            )
            self.warn(
                f"flight recorder: wrote {len(rows)} tensors of {alert.module.name} and "
                f"its neighbours ({span}) to {self.path}{note}"
            )
