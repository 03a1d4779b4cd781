"""Headroom: a module output nearing its dtype's largest finite value, said before it
overflows.

In mixed precision the value that becomes an inf was finite the step before, and often
climbing: float16 tops out at 65504, fp8's e4m3 at 448. At the end of each recorded step
the largest magnitude of every module output in a reduced-range dtype (float16, bfloat16,
the fp8 formats) is compared with the dtype's largest finite value, from the statistics
the hooks took anyway (its min and max: no tensor is read again). A warning, not an
origin, comes once per place when that magnitude

* reaches ``share`` of the dtype's range (``--headroom``, default 50%), or
* has grown by a factor a step that would cross the range within ``AHEAD`` steps, from
  at least ``RISING`` of it (places under ``FLOOR`` of the range are not followed: a
  healthy run's outputs cost one comparison each).

Gradients are left out: a GradScaler scales them towards the range on purpose and finds
its own overflows, which are no finding. float32 and float64 are left out too: their range
is not what overflows in practice, and checking every output would cost the summaries'
number of look-ups a step.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from hookdbg.recorder.calls.calls import Call, SeenTensor, StepState
from hookdbg.recorder.calls.naming import ModuleInfo
from hookdbg.recorder.summaries.deferred import Pending
from hookdbg.recorder.summaries.stats import DTYPE, MAX, MIN
from hookdbg.store.schema import Slot
from hookdbg.store.summary import LARGEST

HEADROOM = "headroom"  # the key of a warning's info row
SHARE = 0.5  # the default share of the range that warns
AHEAD = 2  # a climb that would overflow within this many steps warns
RISING = 0.05  # ... from at least this share of the range
FLOOR = 0.01  # below this share a place is not followed (nor its growth)
# the reduced-range dtypes whose outputs are watched
WATCHED = {d: LARGEST[d] for d in LARGEST if d not in ("float32", "float64")}
_GRAD_OUTPUT = int(Slot.GRAD_OUTPUT)


@dataclass
class HeadroomWarning:
    """One place whose values near the top of their dtype's range."""

    step: int
    module: ModuleInfo
    path: str  # the output's path ("" for a module returning one tensor)
    dtype: str
    absmax: float
    largest: float
    growth: float | None  # by how much its largest magnitude grew a step (None: first)
    within: int | None  # the steps until it would overflow at that rate (None: not)
    received = False  # for the stop's words: a warning is never another rank's
    context: dict[str, object] = field(default_factory=dict, repr=False)

    @property
    def share(self) -> float:
        return self.absmax / self.largest

    def message(self) -> str:
        """'model.l2 (Linear) forward output abs-max 4.50e+04 = 69% of float16's max, x1.9
        a step: overflow expected within 1 step, at step 6'."""
        output = f"output{f'[{self.path}]' if self.path else ''}"
        text = (
            f"headroom: {self.module.name} ({self.module.type}) forward {output} abs-max "
            f"{self.absmax:.3g} = {self.share:.0%} of {self.dtype}'s max"
        )
        if self.growth is not None and self.growth > 1:
            text += f", x{self.growth:.2g} a step"
        if self.within is not None:
            steps = "1 step" if self.within == 1 else f"{self.within} steps"
            text += f": overflow expected within {steps}"
        return f"{text}, at step {self.step}"

    def value(self) -> str:
        """Its ``headroom`` info row."""
        return json.dumps(
            {
                "step": self.step,
                "module": self.module.id,
                "path": self.path,
                "dtype": self.dtype,
                "abs_max": self.absmax,
                "largest": self.largest,
                "growth": self.growth,
                "within": self.within,
                "text": self.message(),
            }
        )


class HeadroomWatch:
    """Keeps each watched place's largest magnitude a step and says which near the top."""

    def __init__(self, share: float = SHARE) -> None:
        self.share = share
        self.last: dict[tuple[int, str], tuple[int, float]] = {}  # place -> (step, absmax)
        self.warned: set[tuple[int, str]] = set()
        self.waiting: list[tuple[int, list]] = []  # steps whose summaries are on the device

    def step_ended(self, state: StepState) -> list[HeadroomWarning]:
        """The outputs of a recorded segment that ended (their statistics may still be
        on their way from the device: then they are judged once they are read)."""
        outputs = []
        for seen in state.memo.values():
            producer = seen.producer
            summary = seen.summary
            if producer is None or summary is None:
                continue
            if type(summary) is not Pending:
                top = WATCHED.get(summary[DTYPE])
                if top is None:
                    continue  # float32: the common case, one look-up
                low, high = summary[MIN], summary[MAX]
                if -FLOOR * top < low and high < FLOOR * top:
                    continue  # far from the top (a healthy run's every output): no history
            outputs.append((producer.info, _path(seen, producer), summary))
        if outputs:
            self.waiting.append((state.step, outputs))
        return self.read()

    def read(self) -> list[HeadroomWarning]:
        """Judge the steps whose statistics are all known, in order."""
        found: list[HeadroomWarning] = []
        while self.waiting:
            step, outputs = self.waiting[0]
            if any(type(s) is Pending and s.value is None for _, _, s in outputs):
                break
            self.waiting.pop(0)
            found += self._judge(step, outputs)
        return found

    def _judge(self, step: int, outputs: list) -> list[HeadroomWarning]:
        largest: dict[tuple[int, str], tuple[ModuleInfo, str, float]] = {}
        for info, path, summary in outputs:
            value = summary.value if type(summary) is Pending else summary
            if value is None:
                continue
            dtype = value[DTYPE]
            if dtype not in WATCHED:
                continue
            low, high = value[MIN], value[MAX]
            if not (math.isfinite(low) and math.isfinite(high)):
                continue  # non-finite: the NaN/inf checks' to say
            absmax = max(abs(low), abs(high))
            key = (info.id, path)
            if key not in largest or absmax > largest[key][2]:
                largest[key] = (info, dtype, absmax)
        found = []
        for key, (info, dtype, absmax) in largest.items():
            before = self.last.get(key)
            self.last[key] = (step, absmax)
            if key in self.warned:
                continue
            top = WATCHED[dtype]
            growth = None
            if before is not None and before[1] > 0 and step > before[0]:
                growth = (absmax / before[1]) ** (1 / (step - before[0]))
            within = None
            if growth is not None and growth > 1 and absmax >= RISING * top:
                steps = math.ceil(math.log(top / absmax) / math.log(growth))
                within = steps if 0 < steps <= AHEAD else None
            if absmax >= self.share * top or within is not None:
                self.warned.add(key)
                found.append(
                    HeadroomWarning(step, info, key[1], dtype, absmax, top, growth, within)
                )
        return found


def _path(seen: SeenTensor, producer: Call) -> str:
    """The path of ``seen``'s tensor in its producer's output (its first slot there)."""
    g = seen.grad_slots
    for i in range(0, len(g), 3):
        if g[i] is producer and g[i + 1] == _GRAD_OUTPUT:
            return str(g[i + 2])
    return ""
