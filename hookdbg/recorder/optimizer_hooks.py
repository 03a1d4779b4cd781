"""The recorder's optimizer hooks: step boundaries, optimizer timings, parameter norms
after each step and, under torch.distributed, gradient norms as the step uses them.

A mixin of ``Recorder`` (hookdbg/recorder/core.py), sharing its per-step state.
"""

from __future__ import annotations

import time

import torch

from hookdbg.options import Level
from hookdbg.recorder import stats
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
        grad_mode = torch.is_grad_enabled()
        _set_grad_enabled(False)
        try:
            summaries = stats.norms_only([p.grad for p, _ in owned])
        finally:
            _set_grad_enabled(grad_mode)
        rows = self._rows.setdefault("tensors", [])
        for (p, (owner, name)), summary in zip(owned, summaries, strict=True):
            rows.append((-1, self._step, owner.id, _OPT, int(Slot.STEP_GRAD), name, summary))
            if self._check and not stats.is_finite(summary):
                local = self._grad_finite.get(id(p))
                self._grad_finite[id(p)] = False  # the step's weights spread it, not born
                if local:
                    alert = self.detector.reduced_grad(
                        owner, name, summary, self._step, time.time()
                    )
                    self._alert(alert, module=owner.ref(), optimizer=opt, grad=p.grad)

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
                self._param_values(opt, info, call, v)
        self._steps.optimizer_end(opt)

    def _param_values(
        self, opt: torch.optim.Optimizer, info: ModuleInfo, call: int, v: float
    ) -> None:
        owned = [
            (p, self._param_owner[id(p)])
            for group in opt.param_groups
            for p in group["params"]
            if id(p) in self._param_owner
        ]
        grad_mode = torch.is_grad_enabled()
        _set_grad_enabled(False)
        try:
            summaries = stats.norms_only([p for p, _ in owned])
        finally:
            _set_grad_enabled(grad_mode)
        rows = self._rows.setdefault("tensors", [])
        for (p, (owner, name)), summary in zip(owned, summaries, strict=True):
            rows.append((call, self._step, owner.id, _OPT, int(Slot.PARAM), name, summary))
            if self._check and not stats.is_finite(summary):
                alert = self.detector.param_value(
                    owner,
                    info,
                    call,
                    name,
                    summary,
                    self._grad_finite.get(id(p)),
                    self._step,
                    time.time(),
                )
                self._alert(alert, module=owner.ref(), optimizer=opt, param=p)
