"""The recorder's per-segment bookkeeping: one ``StepState`` per training step or eval
batch (its ``Segment``, and what the hooks learn during it), one ``Call`` per recorded
module call and one ``SeenTensor`` per distinct tensor (object and version) seen in it.

Plain ``__slots__`` classes: thousands are made per step on the training thread.
A recording on the C path (hookdbg/recorder/accelerated.py) makes the C twins of
``Call`` and ``SeenTensor`` instead (``_hot.Call``, ``_hot.SeenTensor`` in _hot.c): the same
attributes and methods, as C structs its per-call path reads directly, held to the
classes below by tests/recorder/test_accelerated.py.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from hookdbg.recorder.calls.naming import ModuleInfo
from hookdbg.recorder.calls.recompute import RecomputeIndex

if TYPE_CHECKING:
    from hookdbg.recorder.alerts.alert import Alert
    from hookdbg.recorder.steps.steps import StepTracker
    from hookdbg.recorder.summaries.deferred import Pending, StepBatch
    from hookdbg.recorder.summaries.stats import Summary

    # what a GradScaler.step found at a call (hooks/gradscaler.py): the found_inf and
    # scale summaries, read back later on a device
    Decision = tuple[tuple | Pending, tuple | Pending]

LATER = float("inf")  # a time no interval begins at


class Segment:
    """One training step or eval batch (hookdbg/recorder/steps/steps.py). Whether it is a
    training step is asked of the step tracker while it is open and settled when it ends
    (``settle``): checks replayed later read the settled value."""

    __slots__ = (
        "_open_in",
        "_settled",
        "eval",
        "held",
        "id",
        "interrupted",
        "reduced",
        "step",
        "stepped",
    )

    def __init__(self, id: int, step: int, eval: int, open_in: StepTracker | None = None) -> None:
        self.id = id
        self.step = step  # training steps completed before it (its number, if training)
        self.eval = eval  # its number among eval batches (meaningful if not training)
        self._open_in = open_in  # the tracker it is open in (None: ended, or never begun)
        self._settled: bool | None = None
        # --on-nan raise or stop raised into the script in it: a training forward cut
        # short there is a training step (the one its alert named), not an eval batch
        self.interrupted = False
        # an optimizer stepped in it: a check replayed after that (its statistics read
        # back later) finds the weights as the step left them, not as its forward had them
        self.stepped = False
        # its calls into whose output a collective brought other ranks' values: a
        # child's partial sum reduced after its hook (tensor parallel's row-parallel
        # Linear, observe.py's shard; -1: a call at the top), or a reduction or gather
        # run inside its own forward (hooks/collectives.py); read by the NaN/inf rules
        self.reduced: set[int] = set()
        # a GradScaler scaled its loss: its gradients' alerts, held until the scaler
        # decides (recorder/hooks/gradscaler.py); None: not scaled
        self.held: list[tuple[Alert, dict[str, object]]] | None = None

    @property
    def training(self) -> bool | None:
        """Whether it is a training step: so far while it is open (None: not known yet),
        then as its end settled it."""
        steps = self._open_in
        return self._settled if steps is None else steps.training_so_far

    def settle(self, training: bool) -> None:
        """It ended, as a training step or not."""
        self._settled = training
        self._open_in = None

    @property
    def when(self) -> str:
        """'at step 3' or 'in eval batch 2', for messages."""
        return f"in eval batch {self.eval}" if self.training is False else f"at step {self.step}"


class StepState:
    """What lives exactly as long as one segment: made when it begins, dropped when it
    ends (with it the references to the segment's tensors)."""

    __slots__ = (
        "batch",
        "calls",
        "done",
        "grad_finite",
        "id",
        "index",
        "memo",
        "module_calls",
        "overhead_before",
        "recompute",
        "recording",
        "scaler",
        "seg",
        "start",
        "step",
    )

    def __init__(
        self, seg: Segment, recording: bool, start: float, batch: StepBatch | None
    ) -> None:
        self.seg = seg
        self.step = seg.step  # as written in rows
        self.id = seg.id
        self.recording = recording  # selected by --every/--steps
        self.start = start  # on the recorder's clock
        self.done = 0.0  # when its last backward pass or optimizer step ended (0: none)
        self.overhead_before = 0.0  # hookdbg's own time so far when it began (Guard.overhead)
        self.batch = batch  # device statistics read back later (recorder/summaries/deferred.py)
        self.memo: dict[int, SeenTensor] = {}  # id(tensor) -> its record in this segment
        self.index: dict[int, int] = {}  # optimizer id -> calls so far (modules: module_calls)
        self.calls: list[Call] = []
        self.module_calls: dict[int, list[Call]] = {}
        self.recompute = RecomputeIndex(self.calls)
        self.scaler: list[Decision] = []  # what GradScaler.step found, per call
        # parameter id -> its gradient was finite (the deferred checks read it later)
        self.grad_finite: dict[int, bool] = {} if batch is None else batch.grad_finite


class Call:
    """A recorded module call: its place in the call tree, timings, NaN bookkeeping."""

    __slots__ = (
        "bad_grad",
        "below_bad",
        "bwd_first",
        "bwd_self",
        "bwd_task",
        "child_time",
        "depth",
        "grad_on",
        "id",
        "index",
        "inf_below",
        "inf_inputs",
        "info",
        "nan_in",
        "parent",
        "start",
        "tainted",
        "total",
    )

    def __init__(
        self, id: int, info: ModuleInfo, index: int, parent: Call | None, start: float
    ) -> None:
        self.id = id
        self.info = info
        self.index = index
        self.parent = parent
        self.depth: int = 0 if parent is None else parent.depth + 1
        self.start = start  # on the recorder's clock, hookdbg's own time left out
        self.total = 0.0
        self.child_time = 0.0
        self.grad_on = True  # gradients were enabled for its forward
        self.bwd_task = -1  # the last backward pass (autograd graph task) that reached it
        # backward time attributed to it (recorder/hooks/timing.py), and when the first of
        # those intervals began
        self.bwd_self = 0.0
        self.bwd_first = LATER
        self.nan_in = False  # a NaN reached it as an input
        self.inf_inputs: list[tuple[str, SeenTensor]] | None = None  # inputs holding +/-inf only
        self.inf_below: Alert | None = None  # where an inf made inside it was born
        self.tainted = False  # NaN, or a reported origin, in this call or below
        self.bad_grad = False  # a gradient w.r.t. one of its outputs was non-finite
        self.below_bad = False  # a call inside it had non-finite gradients

    def note_inf_below(self, birth: Alert) -> None:
        """Tell the enclosing calls where an inf made inside them was born."""
        parent = self.parent
        while parent is not None and parent.inf_below is None:
            parent.inf_below = birth
            parent = parent.parent

    def mark_below_bad(self) -> None:
        """Tell every enclosing call that a gradient went non-finite inside it: their
        own non-finite input gradients are spread, not born."""
        parent = self.parent
        while parent is not None and not parent.below_bad:
            parent.below_bad = True
            parent = parent.parent


class SeenTensor:
    """A tensor (object + version) seen in this segment, summarised once.

    ``grad_slots`` lists where its gradient belongs: ``call, Slot.GRAD_OUTPUT, path``
    for the calls that produced it, ``call, Slot.GRAD_INPUT, path`` for those that
    consumed it, so one gradient hook serves all of them. The list is flat, three
    values per slot (``slots()`` gives them as triples): no tuple per slot for the
    garbage collector to count while the segment lasts. ``birth`` is where a value
    holding +/-inf (but no NaN) came from, kept until that inf proves to be a problem
    rather than a mask (hookdbg/recorder/alerts/nonfinite.py).
    """

    __slots__ = (
        "alerted",
        "birth",
        "finite",
        "grad_slots",
        "hooked",
        "nr",
        "producer",
        "ref",
        "segment",
        "summary",
        "timing_only",
        "version",
    )

    def __init__(
        self,
        tensor: object,
        version: int,
        summary: Summary | Pending | None,
        finite: bool,
        segment: int,
    ) -> None:
        self.ref = weakref.ref(tensor)
        self.version = version
        self.summary = summary
        self.finite = finite
        self.producer: Call | None = None
        self.grad_slots: list[Any] = []  # call, slot, path, call, slot, path, ...
        self.segment = segment
        self.alerted = False
        self.birth: Alert | None = None
        self.hooked = False  # a gradient hook is registered on the tensor
        self.nr = 0  # which output of its autograd node the tensor is
        self.timing_only = False  # its gradient times calls but is reported elsewhere

    def slots(self) -> list[tuple[Call, int, str]]:
        """``grad_slots`` as (call, slot, path) triples."""
        g = self.grad_slots
        return list(zip(g[::3], g[1::3], g[2::3], strict=True))
