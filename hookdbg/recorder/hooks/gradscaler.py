"""AMP's GradScaler: gradients that overflow on purpose.

Mixed-precision training multiplies the loss by a large *scale* before the backward
pass so that small float16 gradients do not flush to zero. When the scaled gradients
overflow, the GradScaler skips that optimizer step and lowers the scale: a healthy run
has a few such steps at the start and one every couple of thousand steps after (each
time the scale has grown back). Those infs and NaNs are the scaler at work, not a bug,
and a debugger that alerts on them is switched off.

So while recording, ``GradScaler.scale`` and ``GradScaler.step`` are wrapped (the
script's calls go through unchanged) and the non-finite *gradients* of a step whose
loss a scaler scaled are held back until it decides:

* it found inf/NaN at a scale above 1: the step is skipped; the held alerts are
  dropped, and the step is recorded as skipped (the steps table's ``skipped`` and
  ``scale``);
* it found inf/NaN at a scale of 1 or less: even the unscaled gradient is non-finite,
  so the held alerts are alerts (a NaN made in the backward pass every step would
  otherwise only show as a scale halving towards zero);
* it found none, or the step ends without a decision: the held alerts are alerts.

Forward values are never held: the scaler does not touch the forward pass. Whether the
optimizer step ran is known on the host at once (the steps numbering needs it); what
the scaler found (``found_inf``, the scale it used) is summarised like any tensor, so on
a GPU it is read back with the step's statistics, without waiting for the device.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.compiler import is_compiling

from hookdbg.recorder.calls.calls import Segment
from hookdbg.recorder.calls.envelope import Guard, inner_hook, run_eagerly
from hookdbg.recorder.summaries import stats
from hookdbg.recorder.summaries.deferred import resolved

if TYPE_CHECKING:
    from hookdbg.recorder.alerts.nonfinite import Alert
    from hookdbg.recorder.calls.calls import Decision
    from hookdbg.recorder.hooks.observe import TensorObserver
    from hookdbg.recorder.steps.steps import StepTracker


class ScalerWatch:
    """Wraps ``torch.amp.GradScaler.scale`` and ``.step`` while recording; ``remove``
    restores them."""

    def __init__(
        self,
        guard: Guard,
        observer: TensorObserver,
        steps: StepTracker,
        release: Callable[[Alert, dict[str, object]], None],
        warn: Callable[[str], None],
        elsewhere: Callable[[], bool],
    ) -> None:
        self.guard = guard
        self.elsewhere = elsewhere  # whether a scaler is used on another thread than ours
        self.observer = observer
        self.steps = steps
        self.release = release  # queue a held alert as a real one (recorder/alerts/actions.py)
        self.warn = warn
        self.skipped = 0  # steps the scaler skipped, over the recording (decided so far)
        # the tensor last scaled (the id of the result), what it scaled (held weakly: it
        # holds the step's graph) and by which scaler: backward starts from the result,
        # and the loss recorded is what it scaled (recorder/hooks/backward.py)
        self._last: tuple[int, weakref.ref[torch.Tensor], torch.amp.GradScaler] | None = None
        self._cls = torch.amp.GradScaler
        self._scale = scale = self._cls.scale
        self._step = step = self._cls.step
        watch = self

        def scale_wrapper(scaler: torch.amp.GradScaler, outputs: Any) -> Any:
            result = scale(scaler, outputs)
            if scaler.is_enabled() and not is_compiling():
                watch.scaled(scaler, outputs, result)
            return result

        def step_wrapper(
            scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer, *args: Any, **kw: Any
        ) -> Any:
            before = steps.optimizer_calls
            result = step(scaler, optimizer, *args, **kw)
            if scaler.is_enabled() and not is_compiling():
                watch.stepped(scaler, optimizer, steps.optimizer_calls != before)
            return result

        for wrapper, original in ((scale_wrapper, scale), (step_wrapper, step)):
            wrapper.__doc__ = original.__doc__
            wrapper.__name__ = original.__name__
            run_eagerly(wrapper.__code__)
        self._cls.scale = scale_wrapper  # type: ignore[method-assign, assignment]
        self._cls.step = step_wrapper  # type: ignore[method-assign, assignment]

    def remove(self) -> None:
        self._cls.scale = self._scale  # type: ignore[method-assign]
        self._cls.step = self._step  # type: ignore[method-assign]

    # -- what the wrappers do, under the recorder's guard ------------------------------

    @inner_hook
    def scaled(
        self, t0: float, scaler: torch.amp.GradScaler, outputs: object, result: object
    ) -> None:
        """The loss of the current step was scaled: hold its non-finite gradients."""
        if self.elsewhere():
            return
        seg = self.observer.state.seg
        if seg.held is None:
            seg.held = []
        self._last = None
        if isinstance(outputs, torch.Tensor) and isinstance(result, torch.Tensor):
            self._last = (id(result), weakref.ref(outputs), scaler)

    def unscaled(self, loss: object) -> tuple[torch.Tensor | None, torch.Tensor] | None:
        """Where ``loss`` is a GradScaler's last scaled tensor: what it scaled (None if
        that is gone) and the scale; else None."""
        last = self._last
        if last is None or last[0] != id(loss) or last[2]._scale is None:
            return None
        return last[1](), last[2]._scale

    @inner_hook
    def stepped(
        self,
        t0: float,
        scaler: torch.amp.GradScaler,
        optimizer: torch.optim.Optimizer,
        ran: bool,
    ) -> None:
        """``scaler.step(optimizer)`` returned: note whether the optimizer stepped (the
        step's end depends on it) and queue the check of what the scaler found."""
        if self.elsewhere():
            return
        if not ran:
            self.steps.optimizer_skipped(optimizer)
        self._decide(scaler, optimizer)

    def _decide(self, scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> None:
        observer = self.observer
        state = observer.state
        if not (state.recording and observer.check_nan):
            return
        per_device = scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
        scale = scaler._scale
        if not per_device or scale is None:
            return
        found = sum(t.to(scale.device, non_blocking=True) for t in per_device.values())
        decision = (observer.value(found), observer.value(scale))
        state.scaler.append(decision)
        observer.check(self.decided, state.seg, decision)

    def decided(self, seg: Segment, decision: Decision) -> None:
        """What the scaler found, in order with the step's other checks."""
        held = seg.held or []
        found, scale = (resolved(s)[stats.MAX] for s in decision)  # type: ignore[index]
        if not found:
            return  # held alerts wait for the step's end
        self.skipped += 1
        seg.held = []
        if scale > 1:
            if held and self.skipped == 1:
                first = held[0][0]
                self.warn(
                    f"the GradScaler skipped the optimizer step {seg.when}: its scaled "
                    f"gradients overflowed at loss scale {scale:g} (first in {first.where}). "
                    "That is mixed precision at work, not an alert; `hookdbg summary` "
                    "counts the skipped steps"
                )
            return
        for alert, context in held:
            alert.note += (
                f"; the GradScaler skipped the step, but at loss scale {scale:g} the "
                "gradient is non-finite even unscaled"
            )
            self.release(alert, context)

    def release_held(self, seg: Segment) -> None:
        """The step ended: what is still held was not the scaler's overflow."""
        held, seg.held = seg.held or [], []
        for alert, context in held:
            self.release(alert, context)


def step_columns(decisions: list[Decision]) -> tuple[float, int] | None:
    """The steps table's (scale, skipped) for a step's scaler decisions; None while one
    is still on its device. A step without a scaler: (NaN, 0)."""
    values = [(resolved(f), resolved(s)) for f, s in decisions]
    if any(f is None or s is None for f, s in values):
        return None
    if not values:
        return math.nan, 0
    # index: None was ruled out above, which mypy cannot see in a list; misc follows from it
    skipped = sum(1 for f, _ in values if f[stats.MAX])  # type: ignore[index, misc]
    return values[0][1][stats.MAX], skipped  # type: ignore[index]
