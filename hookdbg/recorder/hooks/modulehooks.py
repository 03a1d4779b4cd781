"""The global module hooks: a forward pre-hook and a forward hook, run on every module
call of the process.

* the pre-hook names the module (naming.py), lets the segments decide at root calls
  (segments.py), and summarises positional inputs *before* forward runs (in-place ops
  would change them after);
* the forward hook (``with_kwargs``, ``always_call``) times the call, summarises
  keyword inputs and outputs (observe.py) and writes the call's row; it also runs when
  forward raises, so the call stack never goes out of step.

They run on every module call, so the per-call state (the call stack, the open call)
lives here as plain attributes, and inside a call that is not recorded a nested call
only counts its depth. A forward run again inside backward (activation checkpointing)
is matched to the calls it repeats (recompute.py).

Parametrizations (``torch.nn.utils.parametrize``: weight norm, orthogonal, spectral
norm) are modules that run when a parametrized weight is read. Read inside a module's
forward they are calls inside it, part of the call that reads the weight; read with no
module call around (Hugging Face's weight initialisation at build time, a regulariser
in the loop) they are no call of the model's: not recorded, named or counted, and no
step or eval batch begins there.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch.compiler import is_compiling
from torch.nn.utils.parametrize import ParametrizationList

from hookdbg.recorder.calls.calls import Call
from hookdbg.recorder.calls.cboundary import called_from_c
from hookdbg.recorder.calls.envelope import Guard, inner_hook, run_eagerly
from hookdbg.recorder.calls.handoff import Handoff
from hookdbg.recorder.calls.naming import ModuleInfo, ModuleRegistry
from hookdbg.recorder.calls.recompute import Recompute
from hookdbg.recorder.calls.tensors import iter_tensors
from hookdbg.recorder.hooks.devicetime import DeviceClock
from hookdbg.recorder.hooks.elsewhere import OtherThreads
from hookdbg.recorder.hooks.observe import TensorObserver
from hookdbg.store.rows import Rows
from hookdbg.store.schema import Phase, Slot

if TYPE_CHECKING:
    from hookdbg.recorder.alerts.sentinel import Sentinel
    from hookdbg.recorder.steps.segments import Segments

_RAISED = object()  # forward raised: torch calls always_call hooks without kwargs
_MUTED = object()  # a call in a muted subtree (step not recorded, or inside backward)
_GRAD_OUTPUT, _GRAD_INPUT = int(Slot.GRAD_OUTPUT), int(Slot.GRAD_INPUT)
_FWD = int(Phase.FWD)
_graph_task_id = torch._C._current_graph_task_id
_grad_enabled = torch.is_grad_enabled
_get_ident = threading.get_ident
_PROXY = getattr(getattr(torch._C, "_TorchDispatchModeKey", None), "PROXY", None)


def _tracing() -> bool:
    """Whether make_fx traces the calls (torch.func.linearize does, running the function
    a second time to build its graph): a trace, not a run, and any torch op hookdbg ran
    would land in the graph."""
    return _PROXY is not None and torch._C._get_dispatch_mode(_PROXY) is not None


class ModuleHooks:
    """The global module hooks (``pre``, ``post``) and the per-call state they share."""

    def __init__(
        self,
        guard: Guard,
        registry: ModuleRegistry,
        observer: TensorObserver,
        segments: Segments,
        rows: Rows,
        handoff: Handoff,
        call_ids: Iterator[int],
    ) -> None:
        self.guard = guard
        self.registry = registry
        self._by_id = registry.by_id  # the per-call fast path reads it directly
        self.observer = observer
        self.segments = segments
        self.rows = rows
        self.handoff = handoff
        self._call_ids = call_ids  # shared with the optimizer's calls
        self.state = segments.state  # the current segment's, as the segments began it
        self.stack: list = []  # Call, ModuleInfo (not recorded), Recompute or _MUTED
        self._open: Call | None = None
        self._mute = 0
        self._tid: int | None = None  # the thread that records (set by ``start``)
        self._origin = 0.0  # the recording's start, on its clock (set by ``start``)
        self.calls_recorded = 0
        # the time of top-level calls and backward passes so far, on the recorder's
        # clock: an optimizer step's self time leaves out what ran inside it (timing.py)
        self.root_time = 0.0
        self.others = OtherThreads()  # what ran on other threads, not recorded
        # while a recorded segment's model runs on CUDA: its calls' device times
        self.device_clock: DeviceClock | None = None
        # the check of top-level outputs where module calls are not (sentinel.py), and
        # the top-level call open now that began or continued a segment: its module's
        # info, the module and its positional inputs (for the op-level check's re-run)
        self.sentinel: Sentinel | None = None
        self._step_root: tuple[ModuleInfo, torch.nn.Module, tuple] | None = None

    def start(self, origin: float) -> None:
        """The recording starts now, on this thread, at ``origin`` on its clock."""
        self._origin = origin
        self._tid = _get_ident()

    def on_other_thread(self) -> bool:
        """Whether the hook asking runs on a thread other than the one recording."""
        return _get_ident() != self._tid

    def pre(self, module: torch.nn.Module, args: tuple) -> None:
        """Inside a call that is not recorded (a step --every skips, an eval batch left
        out) a nested call only counts its depth: no clock, no lock."""
        if is_compiling():
            return
        if self._mute and _get_ident() == self._tid:
            self._mute += 1
            return
        self._pre_recorded(module, args)

    def post(
        self, module: torch.nn.Module, args: tuple, kwargs: dict, result: object = _RAISED
    ) -> None:
        if is_compiling():
            return
        if self._mute > 1 and _get_ident() == self._tid:
            self._mute -= 1
            return
        self._post_recorded(module, args, kwargs, result)

    @inner_hook
    def _pre_recorded(self, t0: float, module: torch.nn.Module, args: tuple) -> None:
        if _get_ident() != self._tid:
            self._elsewhere()
            return
        stack = self.stack
        if stack:
            top = stack[-1]
            cls = top.__class__
            if cls is Recompute:
                self._recompute_inner(top, module, args)
                return
            pinfo = top.info if cls is Call else top
        elif type(module) is ParametrizationList:  # a weight read outside any call
            self._mute = 1
            stack.append(_MUTED)
            return
        else:
            pinfo = None
        info = self._by_id.get(id(module))
        if info is None or info.ref() is not module:
            info = self.registry.lookup(module, pinfo)
        if pinfo is None and not self._root(info, module, args, t0 - self.guard.overhead):
            return
        if info.transparent or not info.selected:
            stack.append(info)
            return
        state = self.state
        calls = state.module_calls.get(info.id)  # the module's calls so far
        index = 0 if calls is None else len(calls)
        call = Call(next(self._call_ids), info, index, self._open, t0 - self.guard.overhead)
        call.grad_on = _grad_enabled()
        state.calls.append(call)
        if calls is None:
            state.module_calls[info.id] = [call]
        else:
            calls.append(call)
        stack.append(call)
        self._open = call
        if args:
            self.observer.inputs(call, module, args)
        if self.device_clock is not None:
            self.device_clock.start(call)

    @called_from_c
    def _elsewhere(self) -> None:
        """A module call on a thread other than the one recording: not recorded, but
        counted, so that the recording can say so."""
        self.others.module_call()

    @called_from_c
    def _root(self, info: ModuleInfo, module: torch.nn.Module, args: tuple, now: float) -> bool:
        """A call with no module call around it, at ``now`` on the recorder's clock: a
        forward run again inside backward, or maybe a new segment. Whether the call is
        recorded."""
        if _graph_task_id() != -1:  # a forward run again inside backward
            self._recompute_outer(info, module, args)
            return False
        if _tracing():
            self._mute = 1
            self.stack.append(_MUTED)
            return False
        self.state = self.segments.root_call(info, module, now)
        self._step_root = (info, module, args)
        if not self.state.recording:
            self._mute = 1
            self.stack.append(_MUTED)
            return False
        return True

    def _recompute_outer(self, info: ModuleInfo, module: torch.nn.Module, args: tuple) -> None:
        """A module called with no other around it inside backward: a checkpointed block
        run again (recorder/calls/recompute.py), or user code in a hook (not recorded)."""
        state = self.state
        calls = state.module_calls.get(info.id)
        entry = None
        if calls and state.recording:
            inputs = {id(t) for _, t in iter_tensors(args, "", 0)}
            entry = state.recompute.outer(calls, inputs)
        if entry is None:
            self._mute = 1
            self.stack.append(_MUTED)
        else:
            self.stack.append(entry)

    @called_from_c
    def _recompute_inner(self, parent: Recompute, module: torch.nn.Module, args: tuple) -> None:
        info = self._by_id.get(id(module))
        entry = None if info is None else self.state.recompute.inner(parent, info)
        if entry is None:
            self._mute = 1
            self.stack.append(_MUTED)
            return
        self.stack.append(entry)
        self.observer.recomputed(entry, args, _GRAD_INPUT)

    @called_from_c
    def _leave_other(self, entry: object, result: object) -> None:
        """The end of a call that is not recorded (``entry``, popped off the stack): a
        muted one, a module not selected, or one run again inside backward."""
        if entry is _MUTED:
            self._mute -= 1
        if not self.stack and entry.__class__ is not Recompute:
            self._root_ended(result)
        if result is _RAISED:
            return
        if isinstance(entry, Recompute):
            if entry.outer:  # its own output's gradient reports for the calls inside
                self.observer.forget_recomputed(result)
            else:
                self.observer.recomputed(entry, (result,), _GRAD_OUTPUT)
        elif not self.stack and not self.segments.steps.saw_backward:
            self._watch_backward(result)  # a root call that is not recorded

    @called_from_c
    def _root_ended(self, result: object) -> None:
        """A top-level call ended: the sentinel reads its outputs if it began or
        continued a segment whose module calls are not checked."""
        root, self._step_root = self._step_root, None
        sentinel = self.sentinel
        if root is not None and sentinel is not None and sentinel.armed and result is not _RAISED:
            sentinel.outputs(*root, result, self.state.seg)

    def _watch_backward(self, result: object) -> None:
        """Hear of the backward pass of a root call that is not recorded (its segment
        is not, or its module is not selected): one hook on the node that made its first
        output. Without it a step whose weights are updated by hand (no optimizer to say
        the step ended) runs into the next one."""
        for _, t in iter_tensors(result):
            node = t.grad_fn
            if node is not None:
                node.register_prehook(partial(self._backward_ran, self.segments.state.id))
                return

    def _backward_ran(self, segment: int, grads: tuple) -> None:
        """It only sets a flag, on whichever thread backward runs: no guard needed."""
        if not is_compiling() and segment == self.segments.state.id:
            self.segments.steps.backward_ran()

    @inner_hook
    def _post_recorded(
        self,
        t0: float,
        module: torch.nn.Module,
        args: tuple,
        kwargs: dict,
        result: object = _RAISED,
    ) -> None:
        if _get_ident() != self._tid or not self.stack:
            return
        entry = self.stack.pop()
        if entry.__class__ is not Call:
            self._leave_other(entry, result)
            return
        call: Call = entry
        if self.device_clock is not None:
            self.device_clock.end(call)
        total = call.total = t0 - self.guard.overhead - call.start
        parent = self._open = call.parent
        if parent is not None:
            parent.child_time += total
        else:
            self.root_time += total
        observer = self.observer
        if result is not _RAISED:
            observer.outputs(call, module, args, kwargs, result)
        if parent is None:
            self._root_ended(result)
        state = self.state
        if state.batch is not None:
            observer.check(observer.taint_parent, call)
        elif call.tainted and parent is not None:
            parent.tainted = True
        self.rows.calls.append(
            (
                call.id,
                _FWD,
                state.step,
                state.id,
                call.info.id,
                call.index,
                -1 if parent is None else parent.id,
                call.depth,
                call.start - self._origin,
                total,
                total - call.child_time,
            )
        )
        self.calls_recorded += 1
        handoff = self.handoff
        if t0 - handoff.last > handoff.every:
            handoff()


# called from the frames of a compiled model that dynamo resumes after a graph break, the
# hooks would be compiled as frames of their own, guarded on the grad mode (envelope.py)
for _hook in (ModuleHooks.pre, ModuleHooks.post, ModuleHooks._backward_ran):
    if hasattr(_hook, "__code__"):  # compiled (mypyc), it runs in no frame of its own
        run_eagerly(_hook.__code__)
