"""The per-call path in C (hookdbg/recorder/_hot.c), put in front of the Python one.

On a host-bound model hookdbg's cost is the Python it runs for every module call, every
tensor a call sees and every gradient (docs/performance.md). ``_hot.c`` does that work
in C; the classes here put its methods in front of the Python ones they stand for:

* ``FastModuleHooks``: the module hooks' ``pre`` and ``post`` ask in Python whether
  dynamo is tracing them (dynamo must see that question, to trace nothing of hookdbg),
  then go to C, which asks whether torch compiles at all (hooks run for real while it
  traces with fake tensors);
* ``FastTensorObserver``: ``see``, ``inputs``, ``outputs``, ``keep``, ``summarise`` and
  ``norm_rows`` (parameters after an optimizer step);
* ``FastGradientObserver``: each tensor's gradient hook is its ``SeenTensor`` record itself,
  each parameter's a ``ParamHook``, both called by autograd without a Python frame;
* ``_hot.backward_rows``: each segment's backward spans (timing.py), at its end;
* ``_hot.Guard``, ``_hot.Call``, ``_hot.SeenTensor``: the records those read as C structs,
  twins of envelope.py's ``Guard`` and calls.py's ``Call`` and ``SeenTensor``, which the
  Python path makes. ``chosen()`` is the one place a recording's path is picked, and
  its records with it.

Rows go straight into the store's row buffers (hookdbg/store/_pack.c), so the path
needs both extensions: they are built together, and without either the Python path
records.

What C leaves to Python (a module seen for the first time, the start of a segment, a
forward run again inside backward, NaN/inf checks, captures, statistics that wait for a
device) it hands to the same Python methods the pure path calls, so the two cannot
drift apart there; tests/recorder/test_accelerated.py records models both ways and
requires the same recordings. Those methods, and the attributes C reads, are listed in
cboundary.py and checked before a recording takes the C path. ``HOOKDBG_PURE_PYTHON=1``
records with the Python path (to rule hookdbg's C out when something looks wrong).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import torch.compiler

from hookdbg.recorder.alerts.capture import FlightRecorder
from hookdbg.recorder.calls import cboundary
from hookdbg.recorder.calls.calls import StepState
from hookdbg.recorder.calls.envelope import Guard, run_eagerly
from hookdbg.recorder.calls.handoff import Handoff
from hookdbg.recorder.calls.naming import ModuleInfo
from hookdbg.recorder.calls.recompute import Recompute
from hookdbg.recorder.calls.tensors import iter_tensors
from hookdbg.recorder.hooks.gradients import HOOK_KEY, GradHooks, GradientObserver
from hookdbg.recorder.hooks.modulehooks import _MUTED, _RAISED, ModuleHooks
from hookdbg.recorder.hooks.observe import _INDEX, TensorObserver
from hookdbg.recorder.hooks.timing import BackwardRows, backward_rows
from hookdbg.recorder.summaries import stats
from hookdbg.recorder.summaries.deferred import Pending
from hookdbg.store.rows import RowBuffer
from hookdbg.store.schema import Phase, Slot

if TYPE_CHECKING:
    from hookdbg.recorder.calls.calls import Call, SeenTensor

try:
    import hookdbg.recorder._hot as _hot
except ImportError:  # not built: the Python path only
    _hot = None
if RowBuffer is None:  # the C path writes rows into the store's buffers
    _hot = None

PURE_PYTHON = "HOOKDBG_PURE_PYTHON"
# False when called, True where dynamo traces it: one Python call, where is_compiling()
# is three (it asks torch.jit too); torch before 2.3 has only is_compiling
_traced = getattr(torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling)


def enabled() -> bool:
    """Whether a recording started now takes the C path."""
    return _hot is not None and os.environ.get(PURE_PYTHON, "") in ("", "0")


@dataclass(frozen=True)
class PerCallPath:
    """The parts of a recorder that run per module call, tensor or gradient, and the
    records they make: a recording takes all of them from one path."""

    name: str  # "C" or "Python", as the recording's metadata says
    guard: type[Guard]
    observer: type[TensorObserver]
    hooks: type[ModuleHooks]
    backward_rows: BackwardRows
    why_not_c: str | None = None  # why a recording that asked for C takes the Python path


PYTHON = PerCallPath("Python", Guard, TensorObserver, ModuleHooks, backward_rows)


def chosen() -> PerCallPath:
    """What a recording started now is made of: the C path where it is built and every
    name it uses on Python objects is there (cboundary.py), else the Python path."""
    if not enabled():
        return PYTHON
    gone = _boundary_gaps()
    if gone:
        why = (
            "hookdbg's C per-call path (_hot.c) uses names these do not have: "
            f"{', '.join(gone)}; recording with the Python path"
        )
        return replace(PYTHON, why_not_c=why)
    return PerCallPath("C", _hot.Guard, FastTensorObserver, FastModuleHooks, _hot.backward_rows)


@functools.cache
def _boundary_gaps() -> tuple[str, ...]:
    """cboundary.missing(), asked once per process: the classes do not change."""
    return tuple(cboundary.missing())


if _hot is not None:
    _hot.setup(
        Tensor=torch.Tensor,
        strided=torch.strided,
        Recompute=Recompute,
        Pending=Pending,
        MUTED=_MUTED,
        RAISED=_RAISED,
        summarise=stats.summarise,
        norm_summary=stats.norm_summary,
        one_pass=stats._one_pass,
        shape_only=stats.shape_only,
        no_stats=stats._NO_STATS,
        empty_float_stats=stats._EMPTY_FLOAT_STATS,
        transforms_active=stats.transforms_active,
        c_kinds=stats.C_KINDS,
        shapes=stats._SHAPES,
        shapes_kept=stats._SHAPES_KEPT,
        half_wide=stats._HALF_WIDE,
        iter_tensors=iter_tensors,
        index=_INDEX,
        graph_task_id=torch._C._current_graph_task_id,
        grad_enabled=torch.is_grad_enabled,
        GradHooks=GradHooks,
        hook_key=HOOK_KEY,
        compiler=torch.compiler,
        perf_counter=time.perf_counter,
        monotonic=(
            time.get_clock_info("perf_counter").implementation == "clock_gettime(CLOCK_MONOTONIC)"
        ),
        phases={name: int(Phase[name]) for name in ("FWD", "BWD", "OPT")},
        slots={
            name: int(Slot[name])
            for name in ("INPUT", "OUTPUT", "GRAD_OUTPUT", "GRAD_INPUT", "PARAM_GRAD")
        },
        # classes with __slots__ whose attributes C reads by offset (SlotRef)
        ModuleInfo=ModuleInfo,
        StepState=StepState,
        Handoff=Handoff,
        FlightRecorder=FlightRecorder,
    )

    class FastGradientObserver(GradientObserver):
        """Gradient hooks that autograd calls in C."""

        def watch_tensor(self, t: torch.Tensor, seen: SeenTensor) -> None:
            self.tensors.fast_watch(t, seen)  # type: ignore[attr-defined]

        def _param_hook(self, info: ModuleInfo, name: str) -> Callable[[torch.Tensor], None]:
            return _hot.ParamHook(self.tensors, self, info, name)  # type: ignore[no-any-return]

    class FastTensorObserver(_hot.TensorPath, TensorObserver):  # type: ignore[misc]
        """The tensor observer with its per-tensor path in C."""

        gradient_observer = FastGradientObserver
        seen_record = _hot.SeenTensor  # C hooks the tensors it sees (recomputed ones too)
        _py_summarise = TensorObserver.summarise  # what C leaves to Python: a device batch

    class FastModuleHooks(_hot.CallPath, ModuleHooks):  # type: ignore[misc]
        """The module hooks with their per-call path in C."""

        def pre(self, module: torch.nn.Module, args: tuple) -> None:
            if _traced():
                return
            opened = self._open
            self.fast_pre(module, args)
            clock = self.device_clock  # (a segment this call began may have set it)
            if clock is not None:
                call = self._open
                if call is not opened and call is not None:  # a call recorded: it starts
                    self._device(clock.start, call)

        def post(
            self, module: torch.nn.Module, args: tuple, kwargs: dict, result: object = _RAISED
        ) -> None:
            if _traced():
                return
            clock = self.device_clock
            if clock is not None:
                call = self._open
                stack = self.stack
                if call is not None and stack and stack[-1] is call:  # it ends
                    self._device(clock.end, call)
            self.fast_post(module, args, kwargs, result)

        def _device(self, mark: Callable[[Call], None], call: Call) -> None:
            """A device clock's mark, counted as hookdbg's time (as the C path's own).
            No lock: only this thread marks forward calls."""
            t0 = time.perf_counter()
            mark(call)
            self.guard.overhead += time.perf_counter() - t0

    run_eagerly(FastModuleHooks.pre.__code__)
    run_eagerly(FastModuleHooks.post.__code__)
