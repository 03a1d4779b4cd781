"""Segments: where each training step or eval batch begins and ends, and what is
settled then.

A root call (a module called with no other around it) may start a segment;
recorder/steps/steps.py decides, and whether it was a training step is known only when it
ends. When one begins: a new ``StepState`` (calls.py) for the hooks, with a device
batch if its statistics are read back later (deferred.py), the flight recorder's new
step, the lazy modules' new parameters watched, and torch.distributed noted once the
script has set it up. When one ends: its calls' backward rows (timing.py), its
``steps`` row, which waits until what a GradScaler found is known (gradscaler.py), its
device batch launched, its CUDA events queued (devicetime.py), its rows handed to
the writer at once. Earlier segments'
batches are read once their copy to the host is done: that completes their tensor rows
and replays their NaN/inf checks, in the order the hooks ran.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from hookdbg.options import RecordOptions
from hookdbg.recorder.alerts.capture import FlightRecorder
from hookdbg.recorder.alerts.headroom import HeadroomWarning
from hookdbg.recorder.alerts.nonfinite import OriginDetector
from hookdbg.recorder.calls.calls import Segment, StepState
from hookdbg.recorder.calls.envelope import Guard
from hookdbg.recorder.calls.handoff import Handoff
from hookdbg.recorder.calls.naming import ModuleInfo, ModuleRegistry
from hookdbg.recorder.hooks.devicetime import DeviceClock
from hookdbg.recorder.hooks.gradscaler import ScalerWatch, step_columns
from hookdbg.recorder.hooks.observe import TensorObserver
from hookdbg.recorder.hooks.optimizer import OptimizerObserver
from hookdbg.recorder.hooks.shared import Shared
from hookdbg.recorder.hooks.timing import BackwardRows, backward_rows
from hookdbg.recorder.steps.meta import backend_name
from hookdbg.recorder.steps.steps import RootKind, StepTracker, root_kind
from hookdbg.recorder.summaries.deferred import StepBatch
from hookdbg.store.rows import Rows
from hookdbg.store.schema import StepKind

if TYPE_CHECKING:
    from hookdbg.recorder.calls.calls import Decision
    from hookdbg.recorder.hooks.modulehooks import ModuleHooks


class Segments:
    """Begins and ends the segments of a recording; ``state`` is the current one's."""

    def __init__(self, shared: Shared, observer: TensorObserver, defer_all: bool) -> None:
        self.guard: Guard = shared.guard
        self.options: RecordOptions = shared.options
        self.rows: Rows = shared.rows
        self.detector: OriginDetector = shared.detector
        self.observer = observer
        self.steps: StepTracker = shared.steps
        self.registry: ModuleRegistry = shared.registry
        self.flight: FlightRecorder | None = shared.flight
        self.pinpoint = shared.pinpoint
        self.headroom = shared.headroom
        self.sentinel = shared.sentinel
        self.handoff: Handoff = shared.handoff
        self.warn: Callable[[str], None] = shared.warn
        options = shared.options
        # device tensors' statistics are read back a step later (recorder/summaries/deferred.py),
        # unless an action must happen inside the hook; defer_all does it on CPU too
        self.defer = options.on_nan in ("record", "warn", "stop") and options.checks_nan
        self.defer_all = defer_all
        self.inflight: collections.deque[StepBatch] = collections.deque()
        self.learned: dict[int, tuple] = {}  # tensors copied at their hook (StepBatch.learned)
        # CUDA events of recorded segments whose model runs on CUDA (devicetime.py), and
        # the module hooks that mark their calls (set by the recorder)
        self.clock: DeviceClock | None = None
        self.hooks: ModuleHooks | None = None
        # steps rows wait here, in order, until what a GradScaler found is known
        self.step_rows: collections.deque[tuple[tuple, list[Decision], float]] = collections.deque()
        # set when the recording starts (``start``)
        self.origin = 0.0
        self.optimizer: OptimizerObserver | None = None
        self.scaler: ScalerWatch | None = None
        self.warned_device = False
        self.state = StepState(Segment(-1, 0, 0), False, 0.0, None)  # none yet
        observer.begin(self.state)
        # each segment's backward spans, or the same in C (recorder/accelerated.py)
        self.backward_rows: BackwardRows = backward_rows
        self.unmatched_globs: list[str] = []  # --modules globs said to match nothing
        self.steps_recorded = 0  # training steps
        self.evals_recorded = 0  # eval batches
        self._all_recorded = True  # every segment so far was recorded (and so checked)
        # how long training steps went on after their last backward pass or optimizer
        # step (zero_grad, the next batch's loading), the latest ones: the last step's
        # end follows them (``last_end``)
        self.tails: collections.deque[float] = collections.deque(maxlen=64)
        self.open = False  # a segment has begun and not ended
        self.trained_until: float | None = None  # where the last training step ended
        # set by the recorder: whether a step is recorded (its plan applied: the
        # level, modules and captures steering gave it, recorder/steps/steering.py), and what
        # it does as each segment begins: the recursion limit followed, its hooks
        # checked, steering commands applied (True: the recording was stopped)
        self.plan: Callable[[int], bool] = options.records_step
        self.boundary: Callable[[int], bool] = lambda step: False

    def start(
        self, origin: float, optimizer: OptimizerObserver, scaler: ScalerWatch | None
    ) -> None:
        """The recording starts: its clock's ``origin``, and the parts a segment's
        beginning and end ask."""
        self.origin = origin
        self.optimizer = optimizer
        self.scaler = scaler

    def root_call(self, info: ModuleInfo, module: torch.nn.Module, now: float) -> StepState:
        """A call with no module around it, at ``now`` on the recorder's clock: maybe a
        new segment. Returns the current segment's state (``recording``: whether the
        call is recorded)."""
        steps = self.steps
        kind = root_kind(module, info.has_params)
        if steps.starts_segment(info.id, kind, module):
            if steps.segment >= 0:
                # a training step followed by an eval batch ends as the last step of a
                # run does (``last_end``): what the script did between (``model.eval()``,
                # a checkpoint, an eval loader) is neither step's time
                self.end(now if kind == RootKind.TRAIN else self.last_end(now))
            steps.begin()
            if self.boundary(steps.step):  # stopped: this call and all after go unrecorded
                return StepState(Segment(-1, steps.step, 0), False, now, None)
            self.begin(now, module)
            self.read_batches(wait=False)
        steps.root_ran(info.id, module)
        if self.pinpoint is not None and self.pinpoint.waiting:
            self.pinpoint.begin()
        return self.state

    def pass_call(self, now: float, loss: torch.Tensor | None) -> StepState:
        """A backward pass the script starts from ``loss`` at ``now``, outside any module
        call: maybe a new segment (a loop without modules, steps.py's rule 7). Until an
        optimizer has stepped, the optimizers found in the script's variables are named
        here, so that parameters no module holds are watched from the first pass on
        (recorder/hooks/gradients.py). Returns the current segment's state."""
        steps = self.steps
        if steps.starts_at_pass():
            if steps.segment >= 0:
                self.end(now)
            steps.begin()
            if self.boundary(steps.step):  # stopped: nothing more is recorded
                return StepState(Segment(-1, steps.step, 0), False, now, None)
            self.begin(now, loss)
            self.read_batches(wait=False)
            if self.hooks is not None:  # module calls of this segment go in it
                self.hooks.state = self.state
        steps.pass_ran()
        if steps.optimizer_calls == 0:
            owned = self.observer.gradients.param_owner
            for opt in steps.awaited():
                if any(id(p) not in owned for g in opt.param_groups for p in g["params"]):
                    self.registry.optimizer(opt)
        return self.state

    def begin(self, now: float, module: torch.nn.Module | torch.Tensor | None) -> None:
        """Begin a segment at ``now``, with a root call of ``module`` (or a backward pass
        from that tensor). Whether the model runs on an accelerator is asked only of a
        recorded segment: it decides how its statistics are taken, and the warning below
        is about its times (a step that is not recorded pays nothing for it)."""
        gradients = self.observer.gradients
        if gradients.lazy:
            gradients.watch_lazy()
        optimizer = self.optimizer
        if optimizer is not None and not optimizer.distributed:
            self._learn_distributed(optimizer)
        steps = self.steps
        options = self.options
        seg = Segment(steps.segment, steps.step, steps.evals, steps)
        recording = self.plan(seg.step)
        on_device = recording and _on_device(module)
        on_cuda = recording and _on_cuda(module)  # its calls timed with CUDA events
        deferring = recording and self.defer and (self.defer_all or on_device)
        if on_device and not self.warned_device:
            self.warned_device = True
            if not on_cuda:  # elsewhere no events time the device
                self.warn(
                    "the model runs on an accelerator: module times are measured on the "
                    "host (kernel launches, and any waits), not on the device"
                )
            if not self.defer and options.checks_nan:
                self.warn(
                    f"--on-nan {options.on_nan} checks every tensor inside its hook, "
                    "which waits for the device each time; warn and stop do not"
                )
        batch = StepBatch(seg.id, options.histograms, self.learned) if deferring else None
        self.state = state = StepState(seg, recording, now, batch)
        self._time_on_device(on_cuda, state)
        state.overhead_before = self.guard.overhead
        self.observer.begin(state)
        if self.sentinel is not None:
            checked = recording and self.observer.check_nan
            self.sentinel.begin(checked, self.detector.step_tainted)
        if self.flight is not None:
            self.flight.new_step(seg)
        if self.pinpoint is not None:
            self.pinpoint.new_segment(seg.step)
        self.detector.new_step()
        self.detector.watched = seg.id > 0 and self._all_recorded
        self._all_recorded = self._all_recorded and recording
        self.open = True

    def _time_on_device(self, timed: bool, state: StepState) -> None:
        """Mark this segment's calls with CUDA events (``timed``), or nothing of it."""
        clock = self.clock
        if timed and clock is None:
            clock = self.clock = DeviceClock(self.rows)
        if clock is None:
            return
        if timed:
            clock.begin(state.step, state.id, state.calls)
        hooks = self.hooks
        if hooks is not None:
            hooks.device_clock = clock if timed else None
        self.observer.device_mark = clock.mark if timed else None

    def end(self, now: float, cut: bool = False) -> None:
        self.open = False
        state = self.state
        steps = self.steps
        origin = self.origin
        training = steps.end(cut, state.seg.interrupted)
        state.seg.settle(training)
        if training:
            self.trained_until = now
        if training and state.done and not cut:
            self.tails.append(max(now - state.done, 0.0))
        if state.recording:
            self.backward_rows(state.calls, state.step, state.id, origin, self.rows.calls)
            if training:
                self.steps_recorded += 1
            else:
                self.evals_recorded += 1
        if state.seg.held is not None and self.scaler is not None:
            self.observer.check(self.scaler.release_held, state.seg)
        row = (
            state.step,
            state.id,
            int(StepKind.TRAIN if training else StepKind.EVAL),
            state.start - origin,
            now - origin,
            len(state.calls),
            steps.optimizer_steps,
            int(steps.saw_backward),
            int(state.recording),
        )
        self.step_rows.append((row, state.scaler, self.guard.overhead - state.overhead_before))
        self._complete_step_rows()
        if self.headroom is not None and state.recording:
            self._headroom(self.headroom.step_ended(state))
        state.memo = {}  # drop references to this step's tensors now, not at the next step
        if state.batch is not None:
            state.batch.launch()
            self.inflight.append(state.batch)
        if self.clock is not None:
            self.clock.end_segment()
        if state.recording:
            self.handoff()  # a finished step is on its way to disk at once
        else:  # its steps row only: with the next hand-over, at most ``every`` away
            self.handoff.when_due()
        if state.id == 0:
            self._check_globs()

    def last_end(self, now: float) -> float:
        """Where the open segment ends when the recording closes at ``now`` (or an eval
        batch begins): a training step whose iteration was done (its optimizers
        stepped) ends as the steps before it did, its last backward pass or optimizer
        step followed by their median tail; a recorded eval batch ends with its last
        module call. What the script did after that (saving a checkpoint, a checksum)
        is after training, not step time. Anything else ends at ``now``."""
        state = self.state
        if not self.open:
            return now
        if state.seg.training is False and state.recording:
            for call in reversed(state.calls):
                if call.parent is None:
                    return min(now, call.start + call.total)
            return now
        if not (state.done and self.steps.iteration_done()):
            return now
        tails = sorted(self.tails)
        tail = tails[len(tails) // 2] if tails else 0.0
        return min(now, state.done + tail)

    def read_batches(self, wait: bool) -> None:
        """Complete the steps whose device statistics have reached the host: rows to the
        writer, NaN/inf checks replayed in order (their alerts acted on by the hook)."""
        if self.clock is not None:
            self.clock.read(wait)
        while self.inflight and (wait or self.inflight[0].ready()):
            batch = self.inflight.popleft()
            batch.read()
            self.rows.tensors.extend(batch.finished_rows())
            self.detector.new_step()
            for check, args in batch.checks:
                check(*args)
        if self.headroom is not None and self.headroom.waiting:
            self._headroom(self.headroom.read())
        self._complete_step_rows()

    def _headroom(self, found: list[HeadroomWarning]) -> None:
        """Headroom warnings go with the alerts: said, recorded and acted on as
        --on-headroom says after the hook that found them (recorder/alerts/actions.py)."""
        self.guard.alerts.extend(found)

    def _complete_step_rows(self) -> None:
        """Steps rows to the writer, in order, once their GradScaler columns are known."""
        waiting = self.step_rows
        while waiting:
            columns = step_columns(waiting[0][1])
            if columns is None:
                return
            row, _, overhead = waiting.popleft()
            self.rows.steps.append((*row, *columns, overhead))

    def _check_globs(self) -> None:
        """Say at once, not when the run ends, that a --modules glob matched nothing in
        the first step (almost always a typo)."""
        seen = self.registry.module_names()
        self.unmatched_globs = self.options.modules.unmatched(seen)
        for glob in self.unmatched_globs:
            examples = ", ".join(repr(n) for n, _ in seen[1:3]) or "none so far"
            self.warn(
                f"--modules {glob!r} matched none of the {len(seen)} modules of the first "
                f"step (names look like {examples}); recording goes on"
            )

    def _learn_distributed(self, optimizer: OptimizerObserver) -> None:
        """torch.distributed is set up by the script after recording starts: note its
        backend and world in the ``info`` table once it is (file attributes are fixed
        once SWMR starts)."""
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            optimizer.distributed = dist.get_world_size() > 1
            now = time.time()
            self.rows.info.extend(
                [
                    (now, "backend", backend_name()),
                    (now, "rank", str(dist.get_rank())),
                    (now, "world_size", str(dist.get_world_size())),
                ]
            )


def _first_tensor(module: torch.nn.Module | torch.Tensor | None) -> torch.Tensor | None:
    """What tells where a model computes: its first parameter (a loss: itself)."""
    if isinstance(module, torch.nn.Module):
        return next(module.parameters(), None)
    return module


def _on_cuda(module: torch.nn.Module | torch.Tensor | None) -> bool:
    """Whether a model computes on a CUDA device (judged by its first parameter)."""
    t = _first_tensor(module)
    return t is not None and t.is_cuda


def _on_device(module: torch.nn.Module | torch.Tensor | None) -> bool:
    """Whether a model computes on an accelerator (judged by its first parameter)."""
    t = _first_tensor(module)
    return t is not None and not t.is_cpu
