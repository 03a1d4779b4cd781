"""Where a NaN or inf was born, as opposed to everywhere it spread to.

Once a value goes non-finite it poisons everything downstream, so "module X has a NaN"
is rarely news; the useful answer is the *origin*. hookdbg calls a tensor an origin when:

* forward: a module's output is non-finite while its inputs and its own parameters
  were finite and none of its submodules already saw a non-finite value (so the
  module's own code made it);
* backward: the gradient w.r.t. a module's input is non-finite while the gradients
  w.r.t. its outputs were finite, or a parameter's gradient is non-finite while its
  module's output gradients were finite;
* optimizer: a parameter is non-finite right after a step although its gradient was
  finite (a too-large learning rate, Adam with eps=0);
* distributed: the gradient a step uses (all-reduced) is non-finite although this
  rank's own gradient was finite: it came from another rank;
* unknown provenance, counted only if nothing non-finite was seen earlier in the step
  (otherwise it is almost surely spread, not born): a module input that no recorded
  module produced (the data, or tensor code between modules), and an output gradient
  that feeds no module (the loss computation).

Propagation is tracked with three flags on each ``Call`` (inputs_finite, tainted,
bad_grad) and one per step, so each check is O(1) and only runs when a summary is
already non-finite.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hookdbg.recorder.calls import Call, Seen
from hookdbg.recorder.deferred import resolved
from hookdbg.recorder.naming import ModuleInfo
from hookdbg.store.schema import Phase, Slot, slot_label

_PHASE_WORDS = {Phase.FWD: "forward", Phase.BWD: "backward", Phase.OPT: "optimizer step"}


@dataclass
class Alert:
    """One NaN/inf origin, as recorded in the ``alerts`` table."""

    step: int
    call: int
    module: ModuleInfo
    phase: Phase
    slot: Slot
    path: str
    summary: tuple
    time: float
    note: str
    first: bool = False
    origin: Call | None = field(default=None, repr=False)  # the call, when there is one
    # live objects for an interactive breakpoint; never written to the file
    context: dict[str, object] = field(default_factory=dict, repr=False)

    @property
    def kind(self) -> str:
        nan, posinf, neginf = self.summary[9:12]
        kinds = [k for k, n in (("NaN", nan), ("inf", posinf + neginf)) if n > 0]
        return " and ".join(kinds) or "non-finite"

    @property
    def where(self) -> str:
        return f"{self.module.name} ({self.module.type}) {_PHASE_WORDS[self.phase]} " + (
            slot_label(self.slot, self.path)
        )

    def counts(self) -> str:
        nan, posinf, neginf = self.summary[9:12]
        parts = [f"{n:,} {k}" for k, n in (("NaN", nan), ("+inf", posinf), ("-inf", neginf)) if n]
        return f"{', '.join(parts)} of {self.summary[3]:,} values"

    def message(self) -> str:
        return (
            f"{self.kind} first appeared at step {self.step} in {self.where}: "
            f"{self.counts()}; {self.note}"
        )

    def row(self) -> tuple:
        nan, posinf, neginf = self.summary[9:12]
        return (
            self.step,
            self.call,
            self.module.id,
            int(self.phase),
            int(self.slot),
            self.path,
            self.summary[3],
            nan,
            posinf,
            neginf,
            int(self.first),
            self.time,
            self.message(),
        )


class OriginDetector:
    """Applies the rules above; each method returns an ``Alert`` for an origin, else None."""

    def __init__(self) -> None:
        self.alerts = 0
        self.origins: dict[tuple, int] = {}  # (module, phase, slot, path) -> occurrences
        self.step_tainted = False  # a non-finite value was seen in the current step

    def new_step(self) -> None:
        self.step_tainted = False

    def is_new_origin(self, alert: Alert) -> bool:
        """Count the alert; True the first time its place shows up (warn once per place)."""
        key = (alert.module.id, alert.phase, alert.slot, alert.path)
        seen = self.origins.get(key, 0)
        self.origins[key] = seen + 1
        alert.first = self.alerts == 0
        self.alerts += 1
        return seen == 0

    def _unknown_provenance_ok(self) -> bool:
        clean, self.step_tainted = not self.step_tainted, True
        return clean

    def forward_input(
        self, call: Call, path: str, seen: Seen, step: int, now: float
    ) -> Alert | None:
        call.inputs_finite = False
        call.tainted = True
        if seen.producer is not None or seen.alerted:
            return None
        seen.alerted = True
        if not self._unknown_provenance_ok():
            return None
        where = "the data" if call.parent is None else "tensor code between modules"
        return Alert(
            step,
            call.id,
            call.info,
            Phase.FWD,
            Slot.INPUT,
            path,
            resolved(seen.summary),
            now,
            f"no recorded module produced it: it came from {where}",
            origin=call,
        )

    def forward_output(
        self, call: Call, path: str, seen: Seen, module: object, step: int, now: float
    ) -> Alert | None:
        self.step_tainted = True
        origin = call.inputs_finite and not call.tainted and not seen.alerted
        seen.alerted = True
        if not origin or not _params_finite(module):
            return None
        call.tainted = True
        return Alert(
            step,
            call.id,
            call.info,
            Phase.FWD,
            Slot.OUTPUT,
            path,
            resolved(seen.summary),
            now,
            "its inputs and parameters were finite",
            origin=call,
        )

    def gradient(self, seen: Seen, summary: tuple, step: int, now: float) -> Alert | None:
        consumers = [(c, p) for c, slot, p in seen.grad_slots if slot == Slot.GRAD_INPUT]
        producers = [(c, p) for c, slot, p in seen.grad_slots if slot == Slot.GRAD_OUTPUT]
        for c, _ in producers:
            c.bad_grad = True
        candidates = [(c, p) for c, p in consumers if not c.bad_grad]
        if candidates:
            self.step_tainted = True
            call, path = max(candidates, key=lambda cp: cp[0].depth)
            return Alert(
                step,
                call.id,
                call.info,
                Phase.BWD,
                Slot.GRAD_INPUT,
                path,
                summary,
                now,
                "the gradients w.r.t. its outputs were finite",
                origin=call,
            )
        if not consumers and producers and self._unknown_provenance_ok():
            call, path = min(producers, key=lambda cp: cp[0].depth)
            return Alert(
                step,
                call.id,
                call.info,
                Phase.BWD,
                Slot.GRAD_OUTPUT,
                path,
                summary,
                now,
                "it feeds no module, so it came from code after the module (the loss computation?)",
                origin=call,
            )
        self.step_tainted = True
        return None

    def param_grad(
        self, info: ModuleInfo, calls: list[Call], name: str, summary: tuple, step: int, now: float
    ) -> Alert | None:
        self.step_tainted = True
        if any(c.bad_grad for c in calls):
            return None
        origin = calls[-1] if calls else None
        return Alert(
            step,
            origin.id if origin else -1,
            info,
            Phase.BWD,
            Slot.PARAM_GRAD,
            name,
            summary,
            now,
            "the gradients w.r.t. its outputs were finite",
            origin=origin,
        )

    def reduced_grad(
        self, info: ModuleInfo, name: str, summary: tuple, step: int, now: float
    ) -> Alert | None:
        """The gradient the optimizer step uses is non-finite, but this rank's own was
        finite: it came from another rank through the all-reduce (one alert a step)."""
        if not self._unknown_provenance_ok():
            return None
        return Alert(
            step,
            -1,
            info,
            Phase.OPT,
            Slot.STEP_GRAD,
            name,
            summary,
            now,
            "this rank's own gradient was finite: it came from another rank through the all-reduce",
        )

    def param_value(
        self,
        info: ModuleInfo,
        opt: ModuleInfo,
        call: int,
        name: str,
        summary: tuple,
        grad_finite: bool | None,
        step: int,
        now: float,
    ) -> Alert | None:
        self.step_tainted = True
        if grad_finite is False:
            return None
        grad = "its gradient was finite" if grad_finite else "it had no gradient this step"
        return Alert(
            step,
            call,
            info,
            Phase.OPT,
            Slot.PARAM,
            name,
            summary,
            now,
            f"after {opt.name}.step(); {grad}",
        )


def _params_finite(module: object) -> bool:
    """A module computing with non-finite weights spreads an earlier NaN; it is no origin."""
    if not isinstance(module, torch.nn.Module):
        return True
    with torch.no_grad():
        return all(
            bool(torch.isfinite(p).all())
            for p in module.parameters(recurse=False)
            if p.is_floating_point()
        )
