"""Optimizer steps: step boundaries, optimizer timings, parameter norms after each step
and, under torch.distributed, gradient norms as the step uses them.

An optimizer whose ``step()`` steps others (torchtitan's ``OptimizersContainer``, one
optimizer per model part; any ``Optimizer`` subclass wrapping another) is one step: the
outermost is recorded, its time holding the inner ones', and the parameters of all of
them get their rows once. The inner steps are known by torch's step wrapper
(``Optimizer.profile_hook_step``) running further up the stack, so that an outer step
that raised leaves nothing open behind it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from time import time
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from torch.nn import Parameter

from hookdbg.options import Level
from hookdbg.recorder.alerts.alert import checked
from hookdbg.recorder.calls.calls import Segment
from hookdbg.recorder.calls.envelope import Guard, hook
from hookdbg.recorder.calls.naming import ModuleInfo, ModuleRegistry
from hookdbg.recorder.hooks.observe import TensorObserver
from hookdbg.recorder.summaries import stats
from hookdbg.recorder.summaries.deferred import Pending
from hookdbg.recorder.summaries.stats import Summary
from hookdbg.store.rows import Rows
from hookdbg.store.schema import Phase, Slot

if TYPE_CHECKING:
    from hookdbg.recorder.hooks.modulehooks import ModuleHooks
    from hookdbg.recorder.hooks.shared import Shared
    from hookdbg.recorder.steps.steps import StepTracker

_OPT = int(Phase.OPT)
# the frame torch runs every hooked optimizer step in (its hooks are called from it)
_STEP_WRAPPER = torch.optim.Optimizer.profile_hook_step(lambda self: None).__code__


def _inside_another_step() -> bool:
    """Whether the optimizer step whose hook calls this runs inside another optimizer's
    step: a second frame of torch's step wrapper above it."""
    frame = sys._getframe(1)
    wrappers = 0
    while frame is not None:
        if frame.f_code is _STEP_WRAPPER:
            wrappers += 1
            if wrappers == 2:
                return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class OptimizerObserver:
    """The global optimizer step pre- and post-hooks."""

    def __init__(
        self,
        shared: Shared,
        tensors: TensorObserver,
        call_ids: Iterator[int],
        origin: float,
        calls: ModuleHooks,
    ) -> None:
        self.guard: Guard = shared.guard
        self.tensors = tensors  # the segment's state, summaries, checks and alerts
        self.steps: StepTracker = shared.steps
        self.registry: ModuleRegistry = shared.registry
        self.rows: Rows = shared.rows
        self.call_ids = call_ids
        self.origin = origin  # the recording's start, on its clock
        self.distributed = False  # torch.distributed with several ranks
        self.calls = calls  # their root_time: what ran inside a step is not its own
        self.sentinel = shared.sentinel  # the gradients a step is given, where not checked
        self._started: dict[int, tuple[float, float]] = {}  # when, and root_time then
        # inside the outermost step open: the optimizers it stepped, and the parameters
        # whose step gradients have their rows
        self._inner: list[torch.optim.Optimizer] = []
        self._grads_done: set[int] = set()

    @hook
    def pre(self, t0: float, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if self.calls.on_other_thread():  # another training loop's: counted, not recorded
            self.calls.others.optimizer_step()
            return
        sentinel = self.sentinel
        if sentinel is not None and sentinel.armed and not sentinel.grads_read:
            owner = self.tensors.gradients.param_owner
            sentinel.gradients(opt, self.registry.optimizer(opt), owner, self.tensors.state.seg)
        if _inside_another_step():  # part of the outer step: its gradients, if new
            tensors = self.tensors
            if self.distributed and tensors.state.recording and tensors.level == Level.STATS:
                self._step_grads(opt)
            return
        self._inner.clear()
        self._grads_done.clear()
        self.steps.optimizer_begin()
        gradients = self.tensors.gradients
        if gradients.lazy:  # modules met only inside functional_call hold their own now
            gradients.watch_lazy()
        self._started[id(opt)] = (t0 - self.guard.overhead, self.calls.root_time)
        state = self.tensors.state
        if self.distributed and state.recording and self.tensors.level == Level.STATS:
            self._step_grads(opt)

    @hook
    def post(self, t0: float, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if self.calls.on_other_thread():
            return
        if _inside_another_step():  # its parameters get their rows with the outer step's
            self._inner.append(opt)
            return
        v = t0 - self.guard.overhead
        start, before = self._started.pop(id(opt), (v, self.calls.root_time))
        inside = self.calls.root_time - before  # LBFGS's closure: forwards, backwards
        info = self.registry.optimizer(opt)
        state = self.tensors.state
        # a step whose closure's first forward began the segment: what came before it
        # was the previous segment's time
        start = max(start, state.start)
        if state.recording:
            call = next(self.call_ids)
            index = state.index.get(info.id, 0)
            state.index[info.id] = index + 1
            self.rows.calls.append(
                (
                    call,
                    _OPT,
                    state.step,
                    state.id,
                    info.id,
                    index,
                    -1,
                    0,
                    start - self.origin,
                    v - start,
                    max(v - start - inside, 0.0),
                )
            )
            if self.tensors.level == Level.STATS or self.tensors.check_nan:
                self._param_values(opt, info, call)  # below stats: checked, not kept
            if state.batch is not None:
                state.batch.settle()
        self.steps.optimizer_end(opt, self._inner)
        state.done = v
        self._inner = []
        state.seg.stepped = True

    def _owned(
        self,
        opts: Sequence[torch.optim.Optimizer],
        with_grad: bool,
        done: set[int] | None = None,
    ) -> list:
        """The recorded parameters ``opts`` step (those with a gradient, if
        ``with_grad``), each once, with their owners; ``done``: ids to leave out, and
        those taken are added to it."""
        owner = self.tensors.gradients.param_owner
        done = set() if done is None else done
        owned = []
        for opt in opts:
            for group in opt.param_groups:
                for p in group["params"]:
                    key = id(p)
                    if key in owner and key not in done and (p.grad is not None or not with_grad):
                        done.add(key)
                        owned.append((p, owner[key]))
        return owned

    def _step_grads(self, opt: torch.optim.Optimizer) -> None:
        """Gradient norms as the step will use them. Under DDP these are all-reduced
        (the post-accumulate hooks saw each rank's local gradient), so replicas must
        agree on them: ``hookdbg diff --ranks`` checks that they do."""
        owned = self._owned([opt], with_grad=True, done=self._grads_done)
        self._per_parameter(
            -1, Slot.STEP_GRAD, owned, [p.grad for p, _ in owned], self._step_grad_check, opt
        )

    def _param_values(self, opt: torch.optim.Optimizer, info: ModuleInfo, call: int) -> None:
        owned = self._owned([opt, *self._inner], with_grad=False)
        check = partial(self._param_value_check, info)
        self._per_parameter(call, Slot.PARAM, owned, [p for p, _ in owned], check, opt)

    def _per_parameter(
        self,
        call: int,
        slot: Slot,
        owned: list,
        tensors: list[torch.Tensor],
        check: Callable[..., None],
        opt: torch.optim.Optimizer,
    ) -> None:
        """Rows and NaN/inf checks for one tensor per parameter: norms (``stats.norms_of``),
        or, deferring, full statistics left on their device (a norm read back would wait
        for it)."""
        if not owned:
            return
        observer = self.tensors
        state = observer.state
        step, segment, column, check_nan = state.step, state.id, int(slot), observer.check_nan
        for t, (_, (owner, name)) in zip(tensors, owned, strict=True):
            if type(t) is not Parameter and type(t) is not Tensor:  # FSDP2's: DTensors
                observer.shards.note(owner.id, _OPT, column, name, t)
        keep = observer.level == Level.STATS  # below it the weights are only checked
        if (state.batch is not None and (observer.defer_all or not tensors[0].is_cpu)) or (
            observer.histogram_bins  # histograms asked for: of the weights too
        ):
            summaries: Sequence[Summary | Pending | None] = [observer.summarise(t) for t in tensors]
        else:  # norms only, and their rows: only what is not finite comes back, to check
            modules = [owner.id for _, (owner, _) in owned]
            names = [name for _, (_, name) in owned]
            norms = stats.norms_of(tensors)
            bad = observer.norm_rows(call, column, modules, names, tensors, norms, keep)
            if check_nan:
                for i, value in bad:
                    p, (owner, name) = owned[i]
                    observer.check(
                        check,
                        state.seg,
                        owner,
                        name,
                        value,
                        id(p),
                        state.grad_finite,
                        call,
                        observer.context(opt),  # a check that waits holds no optimizer
                    )
            return
        rows = self.rows.tensors if state.batch is None else state.batch.rows
        for (p, (owner, name)), summary in zip(owned, summaries, strict=True):
            if summary is None:  # not summarised at this level (summarise decides)
                continue
            row = (call, step, segment, owner.id, _OPT, column, name, summary)
            if type(summary) is Pending:
                rows.append(row)
                if not check_nan:
                    continue
            else:
                if keep:
                    self.rows.tensors.append(row)
                if not check_nan or stats.is_finite(summary):
                    continue
            observer.check(
                check,
                state.seg,
                owner,
                name,
                summary,
                id(p),
                state.grad_finite,
                call,
                observer.context(opt),
            )

    def _step_grad_check(
        self,
        seg: Segment,
        owner: ModuleInfo,
        name: str,
        summary: Summary | Pending,
        param: int,
        grad_finite: dict[int, bool],
        call: int,
        opt: torch.optim.Optimizer | None,
    ) -> None:
        value = checked(summary)
        if stats.is_finite(value):
            return
        local = grad_finite.get(param)
        grad_finite[param] = False  # the step's weights spread it, not born
        if local:
            alert = self.tensors.detector.reduced_grad(owner, name, value, seg, time())
            self.tensors.alert(alert, module=owner.ref(), optimizer=opt)

    def _param_value_check(
        self,
        info: ModuleInfo,
        seg: Segment,
        owner: ModuleInfo,
        name: str,
        summary: Summary | Pending,
        param: int,
        grad_finite: dict[int, bool],
        call: int,
        opt: torch.optim.Optimizer | None,
    ) -> None:
        value = checked(summary)
        detector = self.tensors.detector
        detector.weight_after_step(owner.id, name, stats.is_finite(value))
        if stats.is_finite(value):
            return
        alert = detector.param_value(
            owner, info, call, name, value, grad_finite.get(param), seg, time()
        )
        self.tensors.alert(alert, module=owner.ref(), optimizer=opt)
