"""Gradients: of the tensors module calls saw, and of parameters; timed, summarised,
checked for NaN/inf.

Gradients come from one hook per tensor, put on the autograd node that made it the way
``Tensor.register_hook`` puts one there (a dict of hooks as the tensor's
``_backward_hooks``, registered with the node) but without that method's Python wrapper
and handle, which cost more than everything else hookdbg does to hook a tensor. The hook
stays on that node, so it keeps the gradient of the value the module saw even if the
tensor is changed in place afterwards (an in-place ReLU). That one gradient is the
grad_output of the calls that produced the tensor and the grad_input of those that
consumed it. hookdbg's entry stays last in the dict (``GradHooks``): hooks the script
adds to the tensor later run first, so hookdbg sees the gradient the node is given. A
tensor that has hooks already, or is a subclass, gets a pre-hook on the node instead
(it runs after all of them); a leaf tensor that needs a gradient has no node: a hook on
the tensor itself. Parameter gradients come from a post-accumulate-grad hook on each
parameter of a recorded module.

The tensor observer (observe.py) owns this part: it asks for a tensor's gradient hook
when it first sees a tensor that needs one, and lends the segment's state, summaries,
rows and checks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from time import time
from typing import TYPE_CHECKING

import torch
from torch.compiler import is_compiling
from torch.nn.parameter import Parameter, UninitializedParameter

from hookdbg.recorder.alerts.alert import Alert, checked
from hookdbg.recorder.calls.calls import Call, SeenTensor, Segment
from hookdbg.recorder.calls.cboundary import called_from_c
from hookdbg.recorder.calls.envelope import hook, inner_hook
from hookdbg.recorder.calls.labels import find_label
from hookdbg.recorder.calls.naming import ModuleInfo
from hookdbg.recorder.hooks.timing import attribute
from hookdbg.recorder.summaries import stats
from hookdbg.recorder.summaries.deferred import Pending
from hookdbg.recorder.summaries.stats import Summary
from hookdbg.store.schema import ModuleKind, Phase, Slot

if TYPE_CHECKING:
    from hookdbg.recorder.hooks.observe import TensorObserver

_GRAD_OUTPUT = int(Slot.GRAD_OUTPUT)
_PARAM_GRAD = int(Slot.PARAM_GRAD)
_BWD = int(Phase.BWD)
_graph_task_id = torch._C._current_graph_task_id


def _version(t: torch.Tensor) -> int:
    """``t``'s version counter; -1 for an inference tensor, which has none."""
    return -1 if t.is_inference() else t._version


HOOK_KEY = "hookdbg"  # hookdbg's entry in a tensor's GradHooks


def _in_pass(calls: Sequence[Call], task: int) -> Call | None:
    """The last of ``calls`` that backward pass ``task`` reached; else the last of all."""
    for call in reversed(calls):
        if call.bwd_task == task:
            return call
    return calls[-1] if calls else None


def _unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name#2``... where it is taken already (two tensors one variable
    named in turn)."""
    candidate, k = name, 1
    while candidate in taken:
        k += 1
        candidate = f"{name}#{k}"
    taken.add(candidate)
    return candidate


class GradHooks(dict):
    """A tensor's gradient hooks (its ``_backward_hooks``) with hookdbg's entry kept last.

    Autograd calls a tensor's hooks in the dict's order (torch reads a subclass's entries
    as a plain dict's). ``Tensor.register_hook`` adds the script's hooks to this dict once
    hookdbg has put it there; each goes before hookdbg's, which then sees the gradient as
    the script's hooks leave it.
    """

    __slots__ = ("__weakref__",)  # the script's hooks' handles hold it weakly

    def __setitem__(self, key: object, value: object) -> None:
        super().__setitem__(key, value)
        if key != HOOK_KEY and HOOK_KEY in self:
            super().__setitem__(HOOK_KEY, self.pop(HOOK_KEY))


class GradientObserver:
    """The gradient hooks of a ``TensorObserver``'s tensors and of the parameters of
    recorded modules; see the module docstring."""

    def __init__(self, tensors: TensorObserver) -> None:
        self.tensors = tensors  # the segment's state, summaries, rows, checks and alerts
        self.guard = tensors.guard
        self.steps = tensors.steps
        self.detector = tensors.detector
        self.registry = tensors.registry
        self.param_owner: dict[int, tuple[ModuleInfo, str]] = {}
        self.lazy: list[tuple[ModuleInfo, object, Callable[..., object]]] = []

    # -- tensors ------------------------------------------------------------------------

    def watch_tensor(self, t: torch.Tensor, seen: SeenTensor) -> None:
        """Hear of ``t``'s gradient (see the module docstring for how)."""
        seen.hooked = True
        node = t.grad_fn
        if node is None:
            t.register_hook(self._tensor_hook(seen))
        elif type(t) is torch.Tensor and t._backward_hooks is None:
            t._backward_hooks = GradHooks({HOOK_KEY: self._tensor_hook(seen)})
            try:
                node._register_hook_dict(t)
            except BaseException:
                t._backward_hooks = None  # not left where the script's hooks would go unheard
                raise
        else:
            seen.nr = t.output_nr
            node.register_prehook(partial(self._on_grad, seen))

    def _tensor_hook(self, seen: SeenTensor) -> Callable[[torch.Tensor], None]:
        """A hook on the tensor's gradient, marked for torch.save, which warns of a hook
        it cannot save with a tensor unless the hook says it need not be."""
        on_grad = partial(self._on_tensor_grad, seen)
        on_grad.__torch_unserializable__ = True  # type: ignore[attr-defined]
        return on_grad

    @hook
    def _on_grad(self, t0: float, seen: SeenTensor, grads: tuple) -> None:
        grad = grads[seen.nr] if seen.nr < len(grads) else None
        if grad is not None:
            self.grad(t0, seen, grad)

    @hook
    def _on_tensor_grad(self, t0: float, seen: SeenTensor, grad: torch.Tensor | None) -> None:
        if grad is not None:  # undefined: no gradient flowed to this output
            self.grad(t0, seen, grad)

    def grad(self, t0: float, seen: SeenTensor, grad: torch.Tensor) -> None:
        tensors = self.tensors
        state = tensors.state
        if seen.segment != state.id:
            return
        self.steps.backward_ran()
        v = t0 - self.guard.overhead
        task = _graph_task_id()
        summary = tensors.summarise(grad)
        timing_only = seen.timing_only
        keeping = tensors.keeping and not timing_only
        version = _version(grad) if tensors.flight is not None else 0
        slots = seen.grad_slots
        then = None  # the node about to run made the tensor: the innermost producer's
        for i in range(0, len(slots), 3):
            call, slot, path = slots[i], slots[i + 1], slots[i + 2]
            call.bwd_task = task
            if slot == _GRAD_OUTPUT and (then is None or call.depth > then.depth):
                then = call
            if keeping:
                tensors.keep(call, _BWD, slot, path, grad, summary, version)
        attribute(tensors, v, task, then)
        if (
            not timing_only
            and tensors.check_nan
            and summary is not None
            and (type(summary) is Pending or not stats.is_finite(summary))
        ):
            self._check_grad(seen, summary, grad)

    @called_from_c
    def _check_grad(self, seen: SeenTensor, summary: Summary | Pending, grad: torch.Tensor) -> None:
        """Check a gradient now or with the step's statistics (called only when it is not
        finite, or when its statistics wait for the device)."""
        tensors = self.tensors
        tensors.check(
            self._grad_check,
            tensors.state.seg,
            seen,
            summary,
            tensors.context(grad),
            tensors.bwd_last,  # the module whose backward ran just before, if any
        )

    def _grad_check(
        self,
        seg: Segment,
        seen: SeenTensor,
        summary: Summary | Pending,
        grad: torch.Tensor | None,
        after: Call | None,
    ) -> None:
        value = checked(summary)
        if stats.is_finite(value):
            return
        alert = self.detector.gradient(seen, value, seg, time(), after)
        module = alert.module.ref() if alert is not None else None
        output = seen.ref() if grad is not None else None
        self.tensors.alert(alert, module=module, grad=grad, output=output)

    # -- parameters ---------------------------------------------------------------------

    def watch_params(self, info: ModuleInfo, module: object, hooks: Callable[..., object]) -> None:
        """A post-accumulate hook on each parameter a module owns (shared ones once). A
        lazy module's parameters get theirs once its first call has made them; a module
        first seen inside ``torch.func.functional_call``, which puts the tensors it is
        given in place of the parameters for the call, once it holds its own again (at
        a later step or optimizer step)."""
        waits = False
        for name, p in module._parameters.items():  # type: ignore[attr-defined]
            if p is None or id(p) in self.param_owner:
                continue
            if isinstance(p, UninitializedParameter) or not isinstance(p, Parameter):
                waits = True
                continue
            self.param_owner[id(p)] = (info, name)
            if p.requires_grad:
                hooks(p.register_post_accumulate_grad_hook, self._param_hook(info, name))
        if waits:
            self.lazy.append((info, module, hooks))

    def watch_own(self, info: ModuleInfo, opt: object, hooks: Callable[..., object]) -> None:
        """The parameters of optimizer ``opt`` (``info``) that no module holds: the
        tensors a loop trains without ``nn.Module``, a temperature beside the models.
        Their gradients, and their values after each step, go in rows of the optimizer,
        named from the script's variables (``w``) or by their place in its groups."""
        if not isinstance(opt, torch.optim.Optimizer):
            return
        held = {
            id(p)
            for known in self.registry.infos
            if known.kind == ModuleKind.MODULE and isinstance(m := known.ref(), torch.nn.Module)
            for p in m._parameters.values()
        }
        names: set[str] = set()
        for g, group in enumerate(opt.param_groups):
            for k, p in enumerate(group["params"]):
                if id(p) in self.param_owner or id(p) in held or not isinstance(p, torch.Tensor):
                    continue
                name = _unique(find_label(p) or f"param_groups[{g}][{k}]", names)
                self.param_owner[id(p)] = (info, name)
                info.selected = True  # its rows are recorded (--modules selects modules)
                info.n_params += p.numel()
                if p.requires_grad and p.is_leaf:
                    hooks(p.register_post_accumulate_grad_hook, self._param_hook(info, name))

    def _param_hook(self, info: ModuleInfo, name: str) -> Callable[[torch.Tensor], None]:
        """The post-accumulate-grad hook of parameter ``name`` of module ``info``."""
        return partial(self._on_param_grad, info, name)

    def watch_lazy(self) -> None:
        """Watch the parameters lazy modules have made since (called at each step)."""
        waiting, self.lazy = self.lazy, []
        for info, module, hooks in waiting:
            self.watch_params(info, module, hooks)

    def _on_param_grad(self, info: ModuleInfo, name: str, param: torch.Tensor) -> None:
        """Every parameter's hook runs on every backward pass: in a step that is not
        recorded it returns before the guard."""
        if is_compiling() or not self.tensors.state.recording or not info.selected:
            return  # (a module steering deselected keeps its hooks)
        self._param_grad(info, name, param)

    @inner_hook
    def _param_grad(self, t0: float, info: ModuleInfo, name: str, param: torch.Tensor) -> None:
        tensors = self.tensors
        state = tensors.state
        grad = param.grad
        if grad is None:
            return
        v = t0 - self.guard.overhead
        task = _graph_task_id()
        calls: Sequence[Call] = state.module_calls.get(info.id, ())
        owner = _in_pass(calls, task)  # the last call of the module in this backward pass
        # not called itself (inside a compiled model): its work is its caller's
        timed = owner if calls else _in_pass(self._enclosing_calls(info), task)
        # the interval up to here was the module's node's; the next is still its work
        attribute(tensors, v, task, timed)
        summary = tensors.summarise(grad)
        if tensors.keeping:
            version = _version(grad) if tensors.flight is not None else 0
            if owner is not None:
                tensors.keep(owner, _BWD, _PARAM_GRAD, name, grad, summary, version)
            elif tensors.emit_tensors:
                tensors.tensor_row(
                    (-1, state.step, state.id, info.id, _BWD, _PARAM_GRAD, name, summary)
                )
        if summary is None or not tensors.check_nan:
            return
        if tensors.defer_checks or not stats.is_finite(summary):  # type: ignore[arg-type]
            self._check_param_grad(info, list(calls), name, summary, param, grad)
        else:
            state.grad_finite[id(param)] = True

    @called_from_c
    def _check_param_grad(
        self,
        info: ModuleInfo,
        calls: list[Call],
        name: str,
        summary: Summary | Pending,
        param: torch.Tensor,
        grad: torch.Tensor,
    ) -> None:
        """Check a parameter's gradient now or with the step's statistics."""
        tensors = self.tensors
        state = tensors.state
        tensors.check(
            self._param_grad_check,
            state.seg,
            info,
            calls,
            name,
            summary,
            id(param),
            state.grad_finite,
            tensors.context(grad),
        )

    @called_from_c
    def _enclosing_calls(self, info: ModuleInfo) -> list[Call]:
        """The calls in this step of the nearest enclosing module that was called."""
        infos = self.registry.infos
        module_calls = self.tensors.state.module_calls
        parent = info.parent
        while parent >= 0:
            calls = module_calls.get(parent)
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
        summary: Summary | Pending,
        param: int,
        grad_finite: dict[int, bool],
        grad: torch.Tensor | None,
    ) -> None:
        value = checked(summary)
        finite = stats.is_finite(value)
        grad_finite[param] = finite  # the step's own map: a replay runs steps later
        if not finite and info.kind == ModuleKind.OPTIMIZER and self.detector.step_tainted:
            return  # a tensor of no module: what it was computed from was not finite first
        if not finite:
            alert: Alert | None = self.detector.param_grad(info, calls, name, value, seg, time())
            self.tensors.alert(alert, module=info.ref(), grad=grad)
