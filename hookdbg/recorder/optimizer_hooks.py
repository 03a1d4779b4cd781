"""The recorder's optimizer hooks: step boundaries, optimizer timings, parameter norms
after each step and, under torch.distributed, gradient norms as the step uses them.

A mixin of ``Recorder`` (hookdbg/recorder/core.py), sharing its per-step state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import torch

from hookdbg.options import Level
from hookdbg.recorder import stats
from hookdbg.recorder.calls import Segment
from hookdbg.recorder.deferred import Pending, resolved
from hookdbg.recorder.envelope import hook
from hookdbg.recorder.naming import ModuleInfo
from hookdbg.recorder.timing import call_row
from hookdbg.store.schema import Phase, Slot

_OPT = int(Phase.OPT)
_set_grad_enabled = torch._C._set_grad_enabled


class OptimizerHooks:
    @hook
    def _opt_pre(self, t0: float, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        self._steps.optimizer_begin()
        self._opt_start[id(opt)] = t0 - self._ovh
        if self._distributed and self._recording and self._level == Level.STATS:
            self._step_grads(opt)

    def _step_grads(self, opt: torch.optim.Optimizer) -> None:
        """Gradient norms as the step will use them. Under DDP these are all-reduced
        (the post-accumulate hooks saw each rank's local gradient), so replicas must
        agree on them: ``hookdbg diff --ranks`` checks that they do."""
        owned = [
            (p, self._param_owner[id(p)])
            for group in opt.param_groups
            for p in group["params"]
            if p.grad is not None and id(p) in self._param_owner
        ]
        self._per_parameter(
            -1, Slot.STEP_GRAD, owned, [p.grad for p, _ in owned], self._step_grad_check, opt
        )

    def _step_grad_check(
        self,
        seg: Segment,
        owner: ModuleInfo,
        name: str,
        summary: object,
        param: int,
        grad_finite: dict[int, bool],
        call: int,
        opt: torch.optim.Optimizer,
    ) -> None:
        value = resolved(summary)
        if stats.is_finite(value):
            return
        local = grad_finite.get(param)
        grad_finite[param] = False  # the step's weights spread it, not born
        if local:
            alert = self.detector.reduced_grad(owner, name, value, seg, time.time())
            self._alert(alert, module=owner.ref(), optimizer=self._context(opt))

    def _per_parameter(
        self,
        call: int,
        slot: Slot,
        owned: list,
        tensors: list[torch.Tensor],
        check: Callable[..., None],
        opt: torch.optim.Optimizer,
    ) -> None:
        """Rows and NaN/inf checks for one tensor per parameter: norms in one fused call,
        or, deferring, full statistics left on their device (a norm read back would wait
        for it)."""
        if not owned:
            return
        if self._batch is not None and (self._defer_all or not tensors[0].is_cpu):
            summaries = [self._summarise(t) for t in tensors]
        else:
            with torch.no_grad():
                summaries = stats.norms_only(tensors)
        for (p, (owner, name)), summary in zip(owned, summaries, strict=True):
            self._tensor_row(
                (call, self._step, self._segment, owner.id, _OPT, int(slot), name, summary)
            )
            if self._check_nan and (summary.__class__ is Pending or not stats.is_finite(summary)):
                self._check(
                    check, self._seg, owner, name, summary, id(p), self._grad_finite, call, opt
                )

    @hook
    def _opt_post(self, t0: float, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        v = t0 - self._ovh
        start = self._opt_start.pop(id(opt), v)
        info = self._registry.optimizer(opt)
        if self._recording:
            call = self._next_call
            self._next_call += 1
            index = self._index.get(info.id, 0)
            self._index[info.id] = index + 1
            self._rows.setdefault("calls", []).append(
                call_row(
                    call,
                    _OPT,
                    self._step,
                    self._segment,
                    info.id,
                    index,
                    -1,
                    0,
                    start - self._v0,
                    v - start,
                    v - start,
                )
            )
            if self._level == Level.STATS:
                self._param_values(opt, info, call)
        self._steps.optimizer_end(opt)
        self._seg.training = True

    def _param_values(self, opt: torch.optim.Optimizer, info: ModuleInfo, call: int) -> None:
        owned = [
            (p, self._param_owner[id(p)])
            for group in opt.param_groups
            for p in group["params"]
            if id(p) in self._param_owner
        ]
        self._per_parameter(
            call,
            Slot.PARAM,
            owned,
            [p for p, _ in owned],
            partial(self._param_value_check, info),
            opt,
        )

    def _param_value_check(
        self,
        info: ModuleInfo,
        seg: Segment,
        owner: ModuleInfo,
        name: str,
        summary: object,
        param: int,
        grad_finite: dict[int, bool],
        call: int,
        opt: torch.optim.Optimizer,
    ) -> None:
        value = resolved(summary)
        if stats.is_finite(value):
            return
        alert = self.detector.param_value(
            owner, info, call, name, value, grad_finite.get(param), seg, time.time()
        )
        self._alert(alert, module=owner.ref(), optimizer=self._context(opt))
