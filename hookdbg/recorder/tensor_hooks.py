"""The recorder's tensor hooks: what each module call's inputs, outputs and gradients
were, summarised once per step and version, and checked for NaN/inf.

A mixin of ``Recorder`` (hookdbg/recorder/core.py): the hooks share its per-step state
and run on every module call, so they read it as attributes of one object.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import torch

from hookdbg.options import Level
from hookdbg.recorder import stats
from hookdbg.recorder.calls import Call, Seen, Segment
from hookdbg.recorder.deferred import Pending, resolved
from hookdbg.recorder.envelope import hook
from hookdbg.recorder.naming import ModuleInfo
from hookdbg.recorder.recompute import Recompute
from hookdbg.recorder.tensors import iter_args, iter_tensors
from hookdbg.store.schema import Phase, Slot

_INPUT, _OUTPUT = int(Slot.INPUT), int(Slot.OUTPUT)
_GRAD_OUTPUT, _GRAD_INPUT = int(Slot.GRAD_OUTPUT), int(Slot.GRAD_INPUT)
_PARAM_GRAD = int(Slot.PARAM_GRAD)
_FWD, _BWD = int(Phase.FWD), int(Phase.BWD)
_set_grad_enabled = torch._C._set_grad_enabled
_graph_task_id = torch._C._current_graph_task_id


def summary_function(level: Level, check: bool) -> Callable[[torch.Tensor], tuple] | None:
    """How a tensor is summarised at this level (None: not at all)."""
    if level == Level.STATS:
        return stats.summarise
    if check:
        return stats.check_finite
    return stats.shape_only if level == Level.SHAPES else None


class TensorHooks:
    def _see(self, t: torch.Tensor, reuse: bool = True) -> Seen:
        """The step's record of tensor ``t`` at its current version, summarised once."""
        inference = t.is_inference()  # no version counter: cannot tell in-place changes
        version = -1 if inference else t._version
        seen = self._memo.get(id(t))
        if (
            seen is not None
            and seen.version == version
            and seen.ref() is t
            and (reuse or not inference)
        ):
            if not seen.hooked and t.requires_grad and not t.is_leaf:
                # it needs a gradient only now: the output of a checkpointed block, whose
                # forward ran with gradients off, once checkpoint() hands it back
                seen.hooked = True
                t.register_hook(partial(self._on_grad, seen))
            return seen
        summary = None
        base = t._base
        if base is not None:  # a view (flatten, transpose) of a tensor seen: same numbers
            of = self._memo.get(id(base))
            if (
                of is not None
                and of.summary is not None
                and of.ref() is base
                and (
                    of.version == version
                    and base.numel() == t.numel()
                    and base.dtype == t.dtype
                    and of.summary.__class__ is not Pending
                )
            ):
                summary = stats.reshaped(of.summary, t)
        if summary is None:
            summary = self._summarise(t)
        finite = (
            not self._check_nan
            or summary is None
            or summary.__class__ is Pending
            or stats.is_finite(summary)
        )
        seen = Seen(t, version, summary, finite, self._segment)
        self._memo[id(t)] = seen
        if t.requires_grad and not t.is_leaf:
            seen.hooked = True
            t.register_hook(partial(self._on_grad, seen))
        return seen

    def _observe_recomputed(self, frame: Recompute, tensors: tuple, slot: int) -> None:
        """Tensors of a forward run again inside backward (recorder/recompute.py): their
        gradients are the gradients of ``frame.call``'s tensors; nothing else is
        recorded."""
        call = frame.call
        items = iter_tensors(tensors) if slot == _GRAD_OUTPUT else iter_args(tensors)
        for path, t in items:
            if not t.requires_grad or id(t) in frame.boundary:
                continue
            if slot == _GRAD_OUTPUT:
                path = path.partition(".")[2]  # the result was wrapped in a 1-tuple
            seen = self._memo.get(id(t))
            if seen is None or seen.ref() is not t:
                seen = Seen(t, t._version, None, True, self._segment)
                self._memo[id(t)] = seen
            seen.grad_slots.append((call, slot, path))
            if not seen.hooked:
                seen.hooked = True
                t.register_hook(partial(self._on_grad, seen))

    def _forget_recomputed(self, result: object) -> None:
        """The block's output as run again: the original output's gradient reports it for
        the calls that made it; this one only times their backward (in the inner pass)."""
        for _, t in iter_tensors(result):
            seen = self._memo.get(id(t))
            if seen is not None and seen.ref() is t:
                seen.timing_only = True

    def _summarise(self, t: torch.Tensor) -> tuple | Pending | None:
        """The summary of ``t`` at this level: computed now, or (deferring) left on its
        device to be read with the rest of the step's."""
        if self._summary is None:
            return None
        if (
            self._batch is not None
            and (self._defer_all or not t.is_cpu)
            and self._level == Level.STATS
            and t.layout is torch.strided
            and stats.has_stats(t)
        ):
            return self._batch.add(t.detach())
        grad_mode = torch.is_grad_enabled()
        _set_grad_enabled(False)
        try:
            return self._summary(t) if t.layout is torch.strided else stats.shape_only(t)
        finally:
            _set_grad_enabled(grad_mode)

    def _check(self, check: Callable[..., None], *args: object) -> None:
        """Run a NaN/inf check now or, deferring, when the step's statistics are read:
        then every check of the step replays in the order the hooks ran."""
        if self._batch is not None:
            self._batch.checks.append((check, args))
        else:
            check(*args)

    def _observe_inputs(self, call: Call, module: torch.nn.Module, args: tuple) -> None:
        call.grad_on = grad_mode = torch.is_grad_enabled()
        _set_grad_enabled(False)
        try:
            for path, t in iter_args(args):
                self._observe_input(call, path, t, module, args)
        finally:
            _set_grad_enabled(grad_mode)

    def _observe_input(
        self, call: Call, path: str, t: torch.Tensor, module: torch.nn.Module, args: tuple
    ) -> None:
        seen = self._see(t)
        seen.grad_slots.append((call, _GRAD_INPUT, path))
        self._keep(call, _FWD, _INPUT, path, t, seen.summary)
        if not seen.finite or (self._batch is not None and self._check_nan):
            self._check(self._input_check, self._seg, call, path, seen, module, self._context(args))

    def _input_check(
        self,
        seg: Segment,
        call: Call,
        path: str,
        seen: Seen,
        module: torch.nn.Module,
        args: tuple | None,
    ) -> None:
        if stats.is_finite(resolved(seen.summary)):
            return
        alert = self.detector.forward_input(call, path, seen, seg, self._now())
        self._alert(alert, module=module, inputs=args)

    def _observe_outputs(
        self, call: Call, module: torch.nn.Module, args: tuple, kwargs: dict, result: object
    ) -> None:
        grad_mode = torch.is_grad_enabled()
        _set_grad_enabled(False)
        try:
            for key, value in kwargs.items():
                for path, t in iter_tensors(value, key):
                    self._observe_input(call, path, t, module, args)
            single = isinstance(result, torch.Tensor)
            for path, t in (("", result),) if single else iter_tensors(result):
                seen = self._see(t, reuse=False)
                if seen.producer is None:
                    seen.producer = call
                seen.grad_slots.append((call, _GRAD_OUTPUT, path))
                self._keep(call, _FWD, _OUTPUT, path, t, seen.summary)
                if not seen.finite or (self._batch is not None and self._check_nan):
                    self._check(
                        self._output_check,
                        self._seg,
                        call,
                        path,
                        seen,
                        module,
                        self._context(args),
                        self._context(result),
                    )
        finally:
            _set_grad_enabled(grad_mode)

    def _output_check(
        self,
        seg: Segment,
        call: Call,
        path: str,
        seen: Seen,
        module: torch.nn.Module,
        args: tuple | None,
        result: object,
    ) -> None:
        if stats.is_finite(resolved(seen.summary)):
            return
        alert = self.detector.forward_output(call, path, seen, module, seg, self._now())
        self._alert(alert, module=module, inputs=args, output=result)

    def _taint_parent(self, call: Call) -> None:
        if call.tainted and call.parent is not None:
            call.parent.tainted = True

    def _keep(
        self,
        call: Call,
        phase: int,
        slot: int,
        path: str,
        t: torch.Tensor,
        summary: tuple | Pending | None,
    ) -> None:
        """The row, the capture and the flight-recorder entry of one tensor of one call."""
        if self._emit_tensors:
            self._tensor_row(
                (call.id, self._step, self._segment, call.info.id, phase, slot, path, summary)
            )
        if self._flight is not None:
            self._flight.keep(call, phase, slot, path, t)
        if self._capturing and call.info.capture:
            self._capture(call, phase, slot, path, t)

    def _capture(self, call: Call, phase: int, slot: int, path: str, t: torch.Tensor) -> None:
        """Copy a tensor for --capture, unless the copies already waiting for the writer
        fill its memory bound: then it is dropped (and counted) before it is copied."""
        size = t.numel() * t.element_size()
        if not self._writer.has_room(size + self._pending_capture):
            self._writer.count_dropped(1)
            return
        row = self._capturer.take(self._seg, call, call.info.id, phase, slot, path, t)
        if row is not None:
            self._rows.setdefault("captures", []).append(row)
            self._pending_capture += size
            if self._pending_capture > self._writer.max_backlog_bytes // 8:
                self._handoff()  # big copies go to the writer (and its bound) at once
        self._capturing = self._capturer.active(self._step)

    def _tensor_row(self, row: tuple) -> None:
        """A pending summary waits in the step's batch until its numbers are read back;
        a ready one goes straight to the writer's rows."""
        if row[-1].__class__ is Pending:  # the summary, last in the row
            self._batch.rows.append(row)
        else:
            self._rows.setdefault("tensors", []).append(row)

    @hook
    def _on_grad(self, t0: float, seen: Seen, grad: torch.Tensor) -> None:
        if seen.segment != self._segment:
            return
        self._steps.backward_ran()
        self._seg.training = True
        v = t0 - self._ovh
        task = _graph_task_id()
        summary = self._summarise(grad)
        for call, slot, path in seen.grad_slots:
            if call.bwd_task == -1:
                call.bwd_task = task
            if call.bwd_task == task or call.recomputed:  # not a later backward pass
                if slot == _GRAD_OUTPUT:
                    if call.bwd_start is None or v < call.bwd_start:
                        call.bwd_start = v
                elif v > call.bwd_end:
                    call.bwd_end = v
            if not seen.timing_only:
                self._keep(call, _BWD, slot, path, grad, summary)
        if seen.timing_only:
            return
        if (
            self._check_nan
            and summary is not None
            and (summary.__class__ is Pending or not stats.is_finite(summary))
        ):
            self._check(self._grad_check, self._seg, seen, summary, self._context(grad))

    def _grad_check(
        self, seg: Segment, seen: Seen, summary: tuple | Pending, grad: torch.Tensor | None
    ) -> None:
        value = resolved(summary)
        if stats.is_finite(value):
            return
        alert = self.detector.gradient(seen, value, seg, time.time())
        module = alert.module.ref() if alert is not None else None
        self._alert(
            alert, module=module, grad=grad, output=seen.ref() if grad is not None else None
        )

    @hook
    def _on_param_grad(self, t0: float, info: ModuleInfo, name: str, param: torch.Tensor) -> None:
        if not self._recording or param.grad is None:
            return
        v = t0 - self._ovh
        task = _graph_task_id()
        calls = self._module_calls.get(info.id, [])
        owner = None  # the last call of the module in this backward pass
        for call in calls:
            if call.bwd_task == task or call.recomputed:
                call.param_end = max(call.param_end, v)
                owner = call
        if not calls:  # not called itself (inside a compiled model): time the caller
            for call in self._enclosing_calls(info):
                if call.bwd_task == task:
                    call.param_end = max(call.param_end, v)
        summary = self._summarise(param.grad)
        if owner is not None or calls:
            self._keep(owner or calls[-1], _BWD, _PARAM_GRAD, name, param.grad, summary)
        elif self._emit_tensors:
            self._tensor_row(
                (-1, self._step, self._segment, info.id, _BWD, _PARAM_GRAD, name, summary)
            )
        if self._check_nan and summary is not None:
            self._check(
                self._param_grad_check,
                self._seg,
                info,
                calls,
                name,
                summary,
                id(param),
                self._grad_finite,
                self._context(param.grad),
            )

    def _enclosing_calls(self, info: ModuleInfo) -> list[Call]:
        """The calls in this step of the nearest enclosing module that was called."""
        infos = self._registry.infos
        parent = info.parent
        while parent >= 0:
            calls = self._module_calls.get(parent)
            if calls:
                return calls
            parent = infos[parent].parent
        return []

    def _param_grad_check(
        self,
        seg: Segment,
        info: ModuleInfo,
        calls: list[Call],
        name: str,
        summary: tuple | Pending,
        param: int,
        grad_finite: dict[int, bool],
        grad: torch.Tensor | None,
    ) -> None:
        value = resolved(summary)
        finite = stats.is_finite(value)
        grad_finite[param] = finite  # the step's own map: a replay runs steps later
        if not finite:
            alert = self.detector.param_grad(info, calls, name, value, seg, time.time())
            self._alert(alert, module=info.ref(), grad=grad)

    def _context(self, value: object) -> object:
        """What an alert keeps for the debugger: nothing when deferring (it would keep
        the step's tensors alive until the statistics are read)."""
        return None if self._batch is not None else value
