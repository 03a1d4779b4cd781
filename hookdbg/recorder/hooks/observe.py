"""What each module call's tensors were: inputs, outputs, gradients, parameter
gradients, summarised once per segment and version and checked for NaN/inf.

The recorder's module hooks hand each module call's arguments and results here; the
gradient hooks (gradients.py, a part of this observer) report back on their own. All
of it runs on every module call, so it reads the segment's ``StepState`` as plain
attributes and builds plain tuples.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from math import isfinite
from time import time
from typing import TYPE_CHECKING

import torch

from hookdbg.options import Level
from hookdbg.recorder.alerts.alert import checked
from hookdbg.recorder.alerts.capture import Capturer, FlightRecorder
from hookdbg.recorder.alerts.nonfinite import OriginDetector
from hookdbg.recorder.alerts.pinpoint import call_kwargs
from hookdbg.recorder.calls.calls import Call, SeenTensor, Segment, StepState
from hookdbg.recorder.calls.cboundary import called_from_c
from hookdbg.recorder.calls.envelope import Guard
from hookdbg.recorder.calls.handoff import Handoff
from hookdbg.recorder.calls.naming import ModuleRegistry
from hookdbg.recorder.calls.recompute import Recompute
from hookdbg.recorder.calls.tensors import iter_tensors
from hookdbg.recorder.hooks.gradients import GradientObserver
from hookdbg.recorder.hooks.timing import NO_PASS
from hookdbg.recorder.summaries import histograms, stats
from hookdbg.recorder.summaries.deferred import Pending
from hookdbg.recorder.summaries.shards import ShardPlaces
from hookdbg.recorder.summaries.stats import Summary
from hookdbg.store.rows import Rows
from hookdbg.store.schema import Phase, Slot

if TYPE_CHECKING:
    from hookdbg.recorder.hooks.shared import Shared
    from hookdbg.recorder.steps.steps import StepTracker

_INPUT, _OUTPUT = int(Slot.INPUT), int(Slot.OUTPUT)
_GRAD_OUTPUT, _GRAD_INPUT = int(Slot.GRAD_OUTPUT), int(Slot.GRAD_INPUT)
_FWD, _OPT = int(Phase.FWD), int(Phase.OPT)
_Tensor = torch.Tensor
_INDEX = tuple(str(i) for i in range(64))
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def summary_function(level: Level, check: bool) -> Callable[[torch.Tensor], Summary] | None:
    """How a tensor is summarised at this level (None: not at all)."""
    if level == Level.STATS:
        return stats.summarise
    if check:
        return stats.check_finite
    return stats.shape_only if level == Level.SHAPES else None


class TensorObserver:
    """Observes the tensors of module calls; see the module docstring."""

    gradient_observer = GradientObserver  # its gradient hooks (accelerated.py: in C)
    seen_record: type[SeenTensor] = SeenTensor  # what it notes a tensor in (accelerated.py: in C)

    def __init__(
        self, shared: Shared, capturer: Capturer | None, alert: Callable[..., None]
    ) -> None:
        options = shared.options
        self.guard: Guard = shared.guard
        self.rows: Rows = shared.rows
        self.detector: OriginDetector = shared.detector
        self.steps: StepTracker = shared.steps
        self.registry: ModuleRegistry = shared.registry
        self.flight: FlightRecorder | None = shared.flight
        self.capturer = capturer
        self.alert = alert  # queue an origin with its live objects (recorder/alerts/actions.py)
        self.handoff: Handoff = shared.handoff  # hands the rows gathered so far to the writer
        self.histogram_bins = options.histograms
        self.set_level(options.level, options.nan_check, options.histograms)
        self.defer_all = False  # summarise CPU tensors on the device path too (tests)
        self.capturing = False
        self.keeping = False  # ``keep`` has something to do (set with each segment)
        self.defer_checks = False  # checks wait for the step's statistics (ditto)
        self.state: StepState  # the current segment's, set by ``begin`` (segments.py)
        # where the current backward pass stands (recorder/hooks/timing.py's Mark)
        self.bwd_mark = 0.0
        self.bwd_mark_task = NO_PASS
        self.bwd_attributed = 0.0
        self.bwd_current: Call | None = None
        self.bwd_last: Call | None = None
        self.device_mark: Callable[[Call | None], None] | None = None  # timing.Mark
        self.shards = ShardPlaces(self.rows)  # where DTensors' summarised shards lie
        self.gradients = self.gradient_observer(self)  # hooks of tensors and parameters

    def set_level(self, level: Level, nan_check: bool | None, bins: int) -> None:
        """Record at ``level`` from the next segment on (at launch, and when steering
        changes it): tensor rows from shapes up, NaN/inf checks at stats unless
        ``nan_check`` says, a histogram of ``bins`` in each summary at stats."""
        self.level = level
        self.emit_tensors = level >= Level.SHAPES  # tensor rows in the file
        self.check_nan = level == Level.STATS if nan_check is None else nan_check
        self.summary = summary_function(level, self.check_nan)
        if bins and level == Level.STATS:  # a histogram in every summary (histograms.py)
            self.summary = histograms.summarising(bins)

    def begin(self, state: StepState) -> None:
        """A new segment: its state, and whether its tensors are captured."""
        self.state = state
        capturer = self.capturer
        self._capture(capturer is not None and state.recording and capturer.active(state.step))
        self.defer_checks = state.batch is not None and self.check_nan

    def _capture(self, capturing: bool) -> None:
        """Whether tensors are captured from now on, and so whether ``keep`` has work."""
        self.capturing = capturing
        self.keeping = self.emit_tensors or self.flight is not None or capturing

    # -- one tensor, once per segment and version -------------------------------------

    def see(self, t: torch.Tensor, reuse: bool = True) -> SeenTensor:
        """The segment's record of tensor ``t`` at its current version, summarised once."""
        state = self.state
        inference = t.is_inference()  # no version counter: cannot tell in-place changes
        version = -1 if inference else t._version
        seen = state.memo.get(id(t))
        if (
            seen is not None
            and seen.version == version
            and seen.ref() is t
            and (reuse or not inference)
        ):
            if not seen.hooked and t.requires_grad:
                # it needs a gradient only now: the output of a checkpointed block, whose
                # forward ran with gradients off, once checkpoint() hands it back
                self.gradients.watch_tensor(t, seen)
            return seen
        summary: Summary | Pending | None = None
        base = t._base
        if base is not None:  # a view (flatten, transpose) of a tensor seen: same numbers
            of = state.memo.get(id(base))
            if (
                of is not None
                and of.summary is not None
                and of.ref() is base
                and of.version == version
                and type(of.summary) is not Pending
                and of.summary[stats.NUMEL] == t.numel()  # not so for a view under vmap
                and base.dtype == t.dtype
            ):
                summary = stats.reshaped(of.summary, t)
        if summary is None:
            summary = self.summarise(t)
        finite = (
            not self.check_nan
            or summary is None
            or type(summary) is Pending
            or stats.is_finite(summary)
        )
        seen = self.seen_record(t, version, summary, finite, state.id)
        state.memo[id(t)] = seen
        if t.requires_grad:
            self.gradients.watch_tensor(t, seen)
        return seen

    @called_from_c
    def summarise(self, t: torch.Tensor) -> Summary | Pending | None:
        """The summary of ``t`` at this level, the one place that decides whether a
        tensor is summarised (None at ``timing``): computed now (one C pass on CPU), or,
        deferring, copied to the step's device buffer to be read with the rest. Inside
        torch.func's transforms, that of the tensor under the wrappers (``physical``)."""
        summary = self.summary
        if summary is None:
            return None
        batch = self.state.batch
        t = stats.local(t)  # a DTensor's own shard
        if (
            batch is not None
            and (self.defer_all or not t.is_cpu)
            and not t.is_meta
            and self.level == Level.STATS
            and t.layout is torch.strided
            and stats.has_stats(t)
        ):
            if not stats.transforms_active():
                return batch.add(t)  # held, not copied: no torch op (deferred.py)
            with stats.outside_transforms():  # there, t.detach() would be a wrapper
                return batch.add(stats.physical(t).detach())
        try:
            if t.layout is not torch.strided:
                return stats.shape_only(t)
            return summary(t)  # records no autograd graph, whatever the grad mode
        except RuntimeError:  # inside torch.func's transforms: a wrapper, or an op made one
            if not stats.transforms_active():
                raise
            with stats.outside_transforms():
                return summary(stats.physical(t))

    def value(self, t: torch.Tensor) -> Summary | Pending:
        """The full statistics of a tensor the recorder itself needs to know (what a
        GradScaler found), whatever the level; on a device, read back with the step's
        (copied now: the scaler changes its tensors in place)."""
        t = stats.local(t).detach()
        batch = self.state.batch
        if batch is not None and (self.defer_all or not t.is_cpu):
            return batch.add(t, hold=False)
        return stats.summarise(t)

    @called_from_c
    def check(self, check: Callable[..., None], *args: object) -> None:
        """Run a NaN/inf check now or, deferring, when the step's statistics are read:
        then every check of the step replays in the order the hooks ran."""
        batch = self.state.batch
        if batch is not None:
            batch.checks.append((check, args))
        else:
            check(*args)

    def context(self, value: object) -> object:
        """What an alert keeps for the debugger: nothing when deferring (it would keep
        the step's tensors alive until the statistics are read)."""
        return None if self.state.batch is not None else value

    # -- a module call's inputs and outputs -------------------------------------------

    def inputs(self, call: Call, module: torch.nn.Module, args: tuple) -> None:
        """Positional inputs, before forward runs (an in-place op would change them)."""
        for i, arg in enumerate(args):
            if isinstance(arg, _Tensor):
                self.input(call, _INDEX[i] if i < 64 else str(i), arg, module, args)
            elif arg is not None and not isinstance(arg, (int, float, str, bool)):
                for path, t in iter_tensors(arg, _INDEX[i] if i < 64 else str(i), 1):
                    self.input(call, path, t, module, args)

    def input(
        self, call: Call, path: str, t: torch.Tensor, module: torch.nn.Module, args: tuple
    ) -> None:
        seen = self.see(t)
        seen.grad_slots.extend((call, _GRAD_INPUT, path))
        if self.keeping:
            self.keep(call, _FWD, _INPUT, path, t, seen.summary, seen.version)
        if not seen.finite or self.defer_checks:
            self._check_input(call, path, seen, module, args)

    @called_from_c
    def _check_input(
        self, call: Call, path: str, seen: SeenTensor, module: torch.nn.Module, args: tuple
    ) -> None:
        """Check an input now or with the step's statistics (called only when it is not
        finite, or when checks wait for the device). A check that waits holds the
        module weakly: the script may let its model go before the step is read back."""
        self.check(
            self._input_check,
            self.state.seg,
            call,
            path,
            seen,
            weakref.ref(module),
            self.context(args),
            time(),  # when it happened, also when checked later
        )

    def _input_check(
        self,
        seg: Segment,
        call: Call,
        path: str,
        seen: SeenTensor,
        module: Callable[[], object],
        args: object,
        when: float,
    ) -> None:
        if stats.is_finite(checked(seen.summary)):
            return
        alert = self.detector.forward_input(call, path, seen, seg, when)
        self.alert(alert, module=module(), inputs=args)

    def outputs(
        self, call: Call, module: torch.nn.Module, args: tuple, kwargs: dict, result: object
    ) -> None:
        """Keyword inputs (only the forward hook gets them) and the outputs."""
        for key, value in kwargs.items():
            if isinstance(value, _Tensor):
                self.input(call, key, value, module, args)
            elif value is not None and not isinstance(value, (int, float, str, bool)):
                for path, t in iter_tensors(value, key):
                    self.input(call, path, t, module, args)
        if isinstance(result, _Tensor):
            self.output(call, "", result, module, args, result)
        elif result is not None:
            for path, t in iter_tensors(result):
                self.output(call, path, t, module, args, result)

    def output(
        self,
        call: Call,
        path: str,
        t: torch.Tensor,
        module: torch.nn.Module,
        args: tuple,
        result: object,
    ) -> None:
        seen = self.see(t, reuse=False)
        if seen.producer is None:
            seen.producer = call
        seen.grad_slots.extend((call, _GRAD_OUTPUT, path))
        if self.keeping:
            self.keep(call, _FWD, _OUTPUT, path, t, seen.summary, seen.version)
        if not seen.finite or self.defer_checks:
            self._check_output(call, path, seen, module, args, result)

    @called_from_c
    def _check_output(
        self,
        call: Call,
        path: str,
        seen: SeenTensor,
        module: torch.nn.Module,
        args: tuple,
        result: object,
    ) -> None:
        """Check an output now or with the step's statistics (see ``_check_input``)."""
        self.check(
            self._output_check,
            self.state.seg,
            call,
            path,
            seen,
            weakref.ref(module),
            self.context(args),
            self.context(result),
            self.state.batch is not None,
            time(),
        )

    def _output_check(
        self,
        seg: Segment,
        call: Call,
        path: str,
        seen: SeenTensor,
        module: Callable[[], object],
        args: object,
        result: object,
        deferred: bool,
        when: float,
    ) -> None:
        if stats.is_finite(checked(seen.summary)):
            return
        live = module()
        # replayed after its step's optimizer stepped: its weights are not those it ran with
        weights = None if deferred and seg.stepped else live
        alert = self.detector.forward_output(call, path, seen, weights, seg, when)
        birth = seen.birth
        if birth is not None and birth.origin is call and not birth.reported and not deferred:
            # an inf, said once a later module passes it on: what the op-level check
            # needs to run this call again then (pinpoint.py), held until the step ends
            birth.born = {"module": live, "inputs": args, "kwargs": call_kwargs(live)}
        self.alert(alert, module=live, inputs=args, output=result)

    @called_from_c
    def taint_parent(self, call: Call) -> None:
        """Deferred checks replay in order: a child's problem reaches its parent then."""
        if call.tainted and call.parent is not None:
            call.parent.tainted = True

    def keep(
        self,
        call: Call,
        phase: int,
        slot: int,
        path: str,
        t: torch.Tensor,
        summary: Summary | Pending | None,
        version: int,
    ) -> None:
        """The row, the capture and the flight-recorder entry of one tensor of one call
        (``t`` at ``version``, -1 for an inference tensor); where a DTensor's shard lies."""
        if type(t) not in _PLAIN:
            self.shard(call, phase, slot, path, t)
        if self.emit_tensors:
            state = self.state
            self.tensor_row(
                (call.id, state.step, state.id, call.info.id, phase, slot, path, summary)
            )
        if self.flight is not None:
            self.flight.keep(call, phase, slot, path, t, version)
        if self.capturing and call.info.capture:
            self.capture(call, phase, slot, path, t)

    @called_from_c
    def shard(self, call: Call, phase: int, slot: int, path: str, t: torch.Tensor) -> None:
        """A tensor of a subclass seen at a call: where its shard lies, if a DTensor (the
        C path asks this of every tensor that is not a plain one). An output that is a
        partial sum is reduced by a collective after this hook (tensor parallel's
        row-parallel Linear): the NaN/inf checks of what holds its result know that
        another rank's values come in there (nonfinite.py)."""
        if self.shards.note(call.info.id, phase, slot, path, t) and phase == _FWD:
            parent = call.parent
            self.state.seg.reduced.add(-1 if parent is None else parent.id)

    def norm_rows(
        self,
        call: int,
        slot: int,
        modules: list[int],
        names: list[str],
        tensors: list[torch.Tensor],
        norms: list[float],
        keep: bool,
    ) -> list[tuple[int, Summary]]:
        """Parameters after an optimizer step: where ``keep``, a row per tensor (of
        module ``modules[i]``, named ``names[i]``) holding just its norm (from
        ``stats.norms_of``), or its full statistics where the norm is not finite.
        Returns those: (index, summary), for the caller to check."""
        state = self.state
        step, segment, rows = state.step, state.id, self.rows.tensors
        bad = []
        for i, norm in enumerate(norms):
            if isfinite(norm):
                if not keep:
                    continue
                summary = stats.norm_summary(tensors[i], norm)
            else:
                summary = stats.summarise(tensors[i])
                bad.append((i, summary))
            if keep:
                rows.append((call, step, segment, modules[i], _OPT, slot, names[i], summary))
        return bad

    def tensor_row(self, row: tuple) -> None:
        """A row of the tensors table: to the writer, or, while its statistics wait for
        the device (its summary is ``Pending``), to the step's batch until read back."""
        if type(row[-1]) is Pending:
            self.state.batch.rows.append(row)  # type: ignore[union-attr]
        else:
            self.rows.tensors.append(row)

    @called_from_c
    def capture(self, call: Call, phase: int, slot: int, path: str, t: torch.Tensor) -> None:
        """Copy a tensor for --capture, unless the copies already waiting for the writer
        fill its memory bound: then it is dropped (and counted) before it is copied. A
        sparse or nested tensor is not captured (a capture holds a dense array)."""
        if t.layout != torch.strided:
            return
        handoff, capturer = self.handoff, self.capturer
        writer = handoff.writer
        assert writer is not None and capturer is not None
        size = t.numel() * t.element_size()
        if not writer.has_room(size + handoff.pending_capture):
            writer.count_dropped(1)
            return
        row = capturer.take(self.state.seg, call, call.info.id, phase, slot, path, t)
        if row is not None:
            self.rows.captures.append(row)
            handoff.pending_capture += size
            if handoff.pending_capture > writer.max_backlog_bytes // 8:
                handoff()  # big copies go to the writer (and its bound) at once
        self._capture(capturer.active(self.state.step))

    # -- forwards run again inside backward (recorder/calls/recompute.py) -------------

    def recomputed(self, rerun: Recompute, tensors: tuple, slot: int) -> None:
        """Tensors of a forward run again inside backward: their gradients are the
        gradients of ``rerun.call``'s tensors; nothing else is recorded."""
        call = rerun.call
        memo = self.state.memo
        items = iter_tensors(tensors) if slot == _GRAD_OUTPUT else iter_tensors(tensors, "", 0)
        for path, t in items:
            if not t.requires_grad or id(t) in rerun.boundary:
                continue
            path = path.partition(".")[2] if slot == _GRAD_OUTPUT else path
            seen = memo.get(id(t))
            if seen is None or seen.ref() is not t:
                seen = self.seen_record(t, t._version, None, True, self.state.id)
                memo[id(t)] = seen
            seen.grad_slots.extend((call, slot, path))
            if not seen.hooked:
                self.gradients.watch_tensor(t, seen)

    def forget_recomputed(self, result: object) -> None:
        """The block's output as run again: the original output's gradient reports it for
        the calls that made it; this one only times their backward (in the inner pass)."""
        memo = self.state.memo
        for _, t in iter_tensors(result):
            seen = memo.get(id(t))
            if seen is not None and seen.ref() is t:
                seen.timing_only = True
