"""What a NaN/inf origin does besides being recorded: --on-nan break, raise, stop."""

from __future__ import annotations

import sys

from hookdbg.recorder.nonfinite import Alert
from hookdbg.recorder.stats import FIELDS


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

    def __init__(self, alert: Alert) -> None:
        super().__init__(alert.message())
        self.alert = alert


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
        f"({alert.where}, step {alert.step}). Locals: {names}. 'up' walks into the model's "
        "code, 'c' continues training.",
        file=sys.stderr,
        flush=True,
    )
    breakpoint()
    return  # the debugger stops on this line, in this frame, with the locals above
