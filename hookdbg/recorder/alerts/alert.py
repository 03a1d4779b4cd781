"""An ``Alert``: one NaN/inf origin, and the words that report it.

The origin rules (recorder/alerts/nonfinite.py) decide where a non-finite value was born and
make an Alert for it; here is what an alert says: its kind (NaN, inf), where it was
(module, phase, tensor), the counts of its summary, why that place is the origin, the
message printed and stored, and its row in the ``alerts`` table; and ``checked``, the
summary a check judges. What an alert then does (a warning, the flight recorder's
tensors, --on-nan break, raise or stop) is recorder/alerts/actions.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hookdbg.recorder.calls.calls import Call, Segment
from hookdbg.recorder.calls.naming import ModuleInfo
from hookdbg.recorder.summaries.deferred import Pending, resolved
from hookdbg.recorder.summaries.stats import COUNTS, NAN, NUMEL, Summary
from hookdbg.store.schema import Phase, Slot, slot_label

_PHASE_WORDS = {Phase.FWD: "forward", Phase.BWD: "backward", Phase.OPT: "optimizer step"}


@dataclass
class Alert:
    """One NaN/inf origin, as recorded in the ``alerts`` table."""

    segment: Segment
    call: int
    module: ModuleInfo
    phase: Phase
    slot: Slot
    path: str
    summary: Summary
    time: float
    note: str
    first: bool = False
    again: bool = False  # its place had an origin before (warned once, recorded each time)
    reported: bool = False  # a provisional inf birth that proved to be a problem
    # not born here: it came from another rank through a collective (said once, where
    # it arrived; its origin is named on the rank it was born on)
    received: bool = False
    origin: Call | None = field(default=None, repr=False)  # the call, when there is one
    # live objects for an interactive breakpoint; never written to the file
    context: dict[str, object] = field(default_factory=dict, repr=False)
    # an inf's birth, said where a later module passed it on: the call it was born in
    # (its module, inputs and keyword arguments), for the op-level check to run again
    born: dict[str, object] | None = field(default=None, repr=False)
    # found by the sentinel (sentinel.py) in a step whose module calls were not checked:
    # where it was seen, not born
    unchecked: bool = False

    @property
    def step(self) -> int:
        return self.segment.step

    @property
    def kind(self) -> str:
        nan, posinf, neginf = self.summary[COUNTS]
        kinds = [k for k, n in (("NaN", nan), ("inf", posinf + neginf)) if n > 0]
        return " and ".join(kinds) or "non-finite"

    @property
    def where(self) -> str:
        if self.slot == Slot.LOSS:  # a loss site's type is its place in the script
            return f"{self.module.name} (the loss at {self.module.type})"
        return f"{self.module.name} ({self.module.type}) {_PHASE_WORDS[self.phase]} " + (
            slot_label(self.slot, self.path)
        )

    def counts(self) -> str:
        return f"{counts_text(self.summary)} of {self.summary[NUMEL]:,} values"

    def message(self) -> str:
        appeared = "appeared again" if self.again else "first appeared"
        return (
            f"{self.kind} {appeared} {self.segment.when} in {self.where}: "
            f"{self.counts()}; {self.note}"
        )

    def row(self) -> tuple:
        nan, posinf, neginf = self.summary[COUNTS]
        return (
            self.segment.step,
            self.segment.id,
            self.call,
            self.module.id,
            int(self.phase),
            int(self.slot),
            self.path,
            self.summary[NUMEL],
            nan,
            posinf,
            neginf,
            int(self.first),
            self.time,
            self.message(),
        )


def counts_text(summary: Summary) -> str:
    """'16 NaN, 2 -inf' from a summary's counts."""
    nan, posinf, neginf = summary[COUNTS]
    parts = [f"{n:,} {k}" for k, n in (("NaN", nan), ("+inf", posinf), ("-inf", neginf)) if n]
    return ", ".join(parts)


def has_nan(summary: Summary) -> bool:
    return summary[NAN] > 0


def checked(summary: Summary | Pending | None) -> Summary:
    """The summary a NaN/inf check judges. There always is one: checking makes every
    tensor summarised, and a deferred check replays only once its step's statistics
    have been read back (hookdbg/recorder/summaries/deferred.py)."""
    value = resolved(summary)
    assert value is not None, "a NaN/inf check ran before its summary was known"
    return value


def finite_inputs_note(call: Call) -> str:
    """Why ``call`` is the origin: its inputs and parameters were fine, or held only infs
    (saying which, and where they came from)."""
    if not call.inf_inputs:
        return "its inputs and parameters were finite"
    held = []
    for path, seen in call.inf_inputs[:2]:
        birth = seen.birth
        if birth is None:
            source = ""
        elif birth.slot == Slot.INPUT:
            source = ", from the data" if "the data" in birth.note else ", from tensor code"
        else:
            source = f", from {birth.module.name} ({birth.module.type}) forward output"
        held.append(
            f"{slot_label(Slot.INPUT, path)} held {counts_text(checked(seen.summary))}{source}"
        )
    more = " and more" if len(call.inf_inputs) > 2 else ""
    return f"its inputs held no NaN ({'; '.join(held)}{more}) and its parameters were finite"
