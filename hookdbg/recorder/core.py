"""The recorder: PyTorch's global hooks in, rows for the background writer out.

Hooks installed (all owned by one ``HookSet`` and removed together):

* global forward pre-hook: names the module, decides steps at root calls, summarises
  positional inputs *before* forward runs (in-place ops would change them after);
* global forward hook (``with_kwargs``, ``always_call``): timing, keyword inputs,
  outputs; also runs when forward raises, so the call stack never goes out of step;
* a ``register_hook`` on each new non-leaf tensor that needs a gradient: one gradient
  summary serves every call that produced or consumed the tensor. (A global full
  backward hook would be simpler but crashes on in-place ReLU, see docs/design.md);
* a post-accumulate-grad hook on each parameter of a recorded module;
* global optimizer step pre/post hooks: step boundaries and parameter values.

Each tensor is summarised once per step and version (containers see their children's
tensors). Times are on a corrected clock that stops while hookdbg's own hooks run, so
module timings exclude hookdbg's overhead.

The hooks share per-step state and run on every module call, so they live in one
class (attribute lookups stay local); everything that is not hot path is delegated:
statistics (stats), naming, steps, NaN/inf origins (nonfinite), what an origin does
(actions), full tensors (capture), backward spans (timing), the file (store.writer).
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import traceback
from functools import partial
from pathlib import Path
from time import perf_counter

import torch
from torch.nn.modules import module as module_hooks
from torch.optim import optimizer as optimizer_hooks

from hookdbg.options import Level, RecordOptions
from hookdbg.recorder import stats
from hookdbg.recorder.actions import NonFiniteError, NonFiniteStop, interactive, nan_breakpoint
from hookdbg.recorder.calls import Call, Seen
from hookdbg.recorder.capture import Capturer, FlightRecorder
from hookdbg.recorder.hookset import HookSet
from hookdbg.recorder.meta import run_metadata
from hookdbg.recorder.naming import ModuleInfo, ModuleRegistry
from hookdbg.recorder.nonfinite import Alert, OriginDetector
from hookdbg.recorder.rows import CONVERTERS
from hookdbg.recorder.steps import StepTracker
from hookdbg.recorder.tensors import iter_args, iter_tensors
from hookdbg.recorder.timing import backward_rows, call_row
from hookdbg.store.schema import ModuleKind, Phase, Slot
from hookdbg.store.writer import Writer, WriterError

_RAISED = object()  # forward raised: torch calls always_call hooks without kwargs
_MUTED = object()  # a call in a muted subtree (step not recorded, or inside backward)
_INPUT, _OUTPUT = int(Slot.INPUT), int(Slot.OUTPUT)
_GRAD_OUTPUT, _GRAD_INPUT = int(Slot.GRAD_OUTPUT), int(Slot.GRAD_INPUT)
_FWD, _BWD, _OPT = int(Phase.FWD), int(Phase.BWD), int(Phase.OPT)
_set_grad_enabled = torch._C._set_grad_enabled
_graph_task_id = torch._C._current_graph_task_id

_active: Recorder | None = None


def status_prefix() -> str:
    """'hookdbg: ', or 'hookdbg[rank 1]: ' as one of several torch.distributed ranks."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"hookdbg[rank {os.environ.get('RANK', '?')}]: "
    return "hookdbg: "


class RecordError(Exception):
    """A recording cannot start; the message is one line meant for the user."""


def _disable_after_fork() -> None:
    # DataLoader workers fork with our hooks installed; they must not record.
    if _active is not None:
        _active._live = False


os.register_at_fork(after_in_child=_disable_after_fork)


class Recorder:
    """Records every module call of this process into one HDF5 file. Use as a context
    manager, or ``start()`` / ``close()``; see ``hookdbg.record``."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        options: RecordOptions | None = None,
        *,
        force: bool = False,
        argv: list[str] | None = None,
    ) -> None:
        self.options = options or RecordOptions()
        self.path = Path(path)
        if self.path.is_dir():
            raise RecordError(f"{self.path} is a directory; give a file name like run.h5")
        if self.path.exists() and not force:
            raise RecordError(f"{self.path} already exists; pass --force to overwrite it")
        self._argv = list(sys.argv if argv is None else argv)
        self._level = int(self.options.level)
        self._emit_tensors = self.options.level >= Level.SHAPES  # tensor rows in the file
        self._check = self.options.checks_nan
        self._summary = _summary_function(self.options.level, self._check)
        self._capturer = Capturer(self.options, self.warn) if self.options.capture else None
        self._capturing = False
        self._flight = (
            FlightRecorder(self.options.flight_budget)
            if (self.options.flight_budget and self._check)
            else None
        )
        self._hooks = HookSet()
        self._registry = ModuleRegistry(self.options.modules.selects, self._on_new_module)
        self._by_id = self._registry.by_id  # the per-call fast path reads it directly
        self._steps = StepTracker()
        self.detector = OriginDetector()
        self._live = False
        self._closed = False
        self._writer: Writer | None = None
        self._froze = False
        self._distributed = False  # torch.distributed initialised with several ranks
        # per-call state
        self._stack: list = []
        self._open: Call | None = None
        self._mute = 0
        self._ovh = 0.0  # seconds spent inside hookdbg's hooks so far
        self._next_call = 0
        # per-step state
        self._step = -1
        self._recording = False
        self._step_start = 0.0
        self._memo: dict[int, Seen] = {}
        self._index: dict[int, int] = {}
        self._calls: list[Call] = []
        self._module_calls: dict[int, list[Call]] = {}
        self._grad_finite: dict[int, bool] = {}
        self._opt_start: dict[int, float] = {}
        self._param_owner: dict[int, tuple[ModuleInfo, str]] = {}
        self._alerts: list[Alert] = []
        # rows waiting to be handed to the writer
        self._rows: dict[str, list] = {}
        self._last_handoff = 0.0
        self._handoff_every = min(0.5, self.options.flush_interval / 2)
        self.steps_recorded = 0
        self.calls_recorded = 0

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> Recorder:
        global _active
        if _active is not None:
            raise RecordError("a hookdbg recording is already running in this process")
        meta = run_metadata(self._argv, self.options)
        try:
            self._writer = Writer(
                self.path,
                meta,
                converters=CONVERTERS,
                flush_interval=self.options.flush_interval,
                max_backlog_rows=self.options.max_backlog_rows,
                warn=self.warn,
            )
        except WriterError as exc:
            raise RecordError(str(exc)) from None
        self._v0 = self._last_handoff = perf_counter()
        self._tid = threading.get_ident()
        hooks = self._hooks
        hooks.add(module_hooks.register_module_forward_pre_hook, self._pre)
        hooks.add(
            module_hooks.register_module_forward_hook,
            self._post,
            with_kwargs=True,
            always_call=True,
        )
        hooks.add(optimizer_hooks.register_optimizer_step_pre_hook, self._opt_pre)
        hooks.add(optimizer_hooks.register_optimizer_step_post_hook, self._opt_post)
        # Full garbage collections scan every tracked object, ~300,000 of them torch's
        # own; the flight recorder makes them come sooner (it keeps tensors alive for
        # two steps). Objects from before the recording are frozen out of those scans
        # (NumNet MLP: 417 -> 28 us of collection per step) and unfrozen at close.
        self._froze = gc.isenabled()
        if self._froze:
            gc.freeze()
        _active = self
        self._live = True
        return self

    def close(self, status: str = "complete", exit_code: int = 0, message: str = "") -> None:
        """Remove every hook, write what is pending and the end row, close the file."""
        global _active
        if self._closed:
            return
        self._closed = True
        self._live = False
        try:
            self._hooks.remove()
        finally:
            if _active is self:
                _active = None
            if self._froze:
                gc.unfreeze()
            now = perf_counter() - self._ovh
            if self._step >= 0:
                self._end_step(now)
            self._handoff()
            end = {
                "time": time.time(),
                "status": status,
                "exit_code": exit_code,
                "steps": self.steps_recorded,
                "calls": self.calls_recorded,
                "alerts": self.detector.alerts,
                "message": message,
            }
            if self._writer is not None:
                self._writer.close(end)

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if exc_type is None:
            self.close()
        elif issubclass(exc_type, NonFiniteStop):
            self.close("stopped", 3, str(exc))
        elif issubclass(exc_type, KeyboardInterrupt):
            self.close("interrupted", 130, "KeyboardInterrupt")
        else:
            self.close("exception", 1, f"{exc_type.__name__}: {exc}")

    @property
    def modules(self) -> list[ModuleInfo]:
        """Every module seen so far (optimizers excluded)."""
        return [i for i in self._registry.infos if i.kind == ModuleKind.MODULE]

    @property
    def dropped_rows(self) -> int:
        return self._writer.dropped_rows if self._writer else 0

    @property
    def write_error(self) -> str | None:
        return self._writer.failed if self._writer else None

    def warn(self, message: str) -> None:
        if not self.options.quiet:
            print(f"{status_prefix()}{message}", file=sys.stderr, flush=True)

    # -- module hooks ----------------------------------------------------------------

    def _pre(self, module: torch.nn.Module, args: tuple) -> None:
        t0 = perf_counter()
        if not self._live or threading.get_ident() != self._tid:
            return
        stack = self._stack
        try:
            if self._mute:
                self._mute += 1
                stack.append(_MUTED)
                return
            if stack:
                top = stack[-1]
                pinfo = top.info if top.__class__ is Call else top
            else:
                pinfo = None
            info = self._by_id.get(id(module))
            if info is None or info.ref() is not module:
                info = self._registry.lookup(module, pinfo)
            if pinfo is None and not self._root_call(info, module, t0):
                self._mute = 1
                stack.append(_MUTED)
                return
            if info.transparent or not info.selected:
                stack.append(info)
                return
            index = self._index.get(info.id, 0)
            self._index[info.id] = index + 1
            call = Call(self._next_call, info, index, self._open, t0 - self._ovh)
            self._next_call += 1
            self._calls.append(call)
            self._module_calls.setdefault(info.id, []).append(call)
            stack.append(call)
            self._open = call
            self._observe_inputs(call, module, args)
        except Exception:
            self._internal_error()
        finally:
            self._ovh += perf_counter() - t0
        if self._alerts:
            self._act()

    def _post(
        self, module: torch.nn.Module, args: tuple, kwargs: dict, result: object = _RAISED
    ) -> None:
        t0 = perf_counter()
        if not self._live or threading.get_ident() != self._tid or not self._stack:
            return
        try:
            frame = self._stack.pop()
            if frame.__class__ is not Call:
                if frame is _MUTED:
                    self._mute -= 1
                return
            call: Call = frame
            total = call.total = t0 - self._ovh - call.vstart
            parent = self._open = call.parent
            if parent is not None:
                parent.child_time += total
            if result is not _RAISED:
                self._observe_outputs(call, module, args, kwargs, result)
            if call.tainted and parent is not None:
                parent.tainted = True
            self._rows.setdefault("calls", []).append(
                call_row(
                    call.id,
                    _FWD,
                    self._step,
                    call.info.id,
                    call.index,
                    -1 if parent is None else parent.id,
                    call.depth,
                    call.vstart - self._v0,
                    total,
                    total - call.child_time,
                )
            )
            self.calls_recorded += 1
            if t0 - self._last_handoff > self._handoff_every:
                self._handoff()
        except Exception:
            self._internal_error()
        finally:
            self._ovh += perf_counter() - t0
        if self._alerts:
            self._act()

    def _root_call(self, info: ModuleInfo, module: torch.nn.Module, t0: float) -> bool:
        """A call with no module around it: maybe a new step. True if it is recorded."""
        if _graph_task_id() != -1:  # a forward re-run inside backward (checkpointing)
            return False
        steps = self._steps
        inference = not torch.is_grad_enabled() or not module.training
        if steps.starts_step(info.root, inference):
            now = t0 - self._ovh
            if self._step >= 0:
                self._end_step(now)
            steps.begin(inference)
            self._begin_step(steps.step, now)
        steps.root_seen(info.root)
        return self._recording

    # -- tensors ---------------------------------------------------------------------

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
            return seen
        summary = None
        base = t._base
        if base is not None:  # a view (flatten, transpose) of a tensor seen: same numbers
            of = self._memo.get(id(base))
            if (
                of is not None
                and of.summary is not None
                and of.ref() is base
                and (of.version == version and base.numel() == t.numel() and base.dtype == t.dtype)
            ):
                summary = stats.reshaped(of.summary, t)
        if summary is None and self._summary is not None:
            summary = self._summary(t)
        finite = not self._check or summary is None or stats.is_finite(summary)
        seen = Seen(t, version, summary, finite, self._step)
        self._memo[id(t)] = seen
        if t.requires_grad and not t.is_leaf:
            t.register_hook(partial(self._on_grad, seen))
        return seen

    def _observe_inputs(self, call: Call, module: torch.nn.Module, args: tuple) -> None:
        grad_mode = torch.is_grad_enabled()
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
        self._keep(call, _FWD, _INPUT, path, t, seen)
        if not seen.finite:
            alert = self.detector.forward_input(call, path, seen, self._step, self._now())
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
                self._keep(call, _FWD, _OUTPUT, path, t, seen)
                if not seen.finite:
                    alert = self.detector.forward_output(
                        call, path, seen, module, self._step, self._now()
                    )
                    self._alert(alert, module=module, inputs=args, output=result)
                    call.tainted = True
        finally:
            _set_grad_enabled(grad_mode)

    def _keep(
        self, call: Call, phase: int, slot: int, path: str, t: torch.Tensor, seen: Seen | None
    ) -> None:
        """Row, capture and flight-recorder entry for one tensor of one call."""
        summary = seen.summary if seen is not None else self._summarise(t)
        if self._emit_tensors:
            self._rows.setdefault("tensors", []).append(
                (call.id, self._step, call.info.id, phase, slot, path, summary)
            )
        if self._flight is not None:
            self._flight.keep(call, phase, slot, path, t)
        if self._capturing and call.info.capture:
            row = self._capturer.take(self._step, call, call.info.id, phase, slot, path, t)
            if row is not None:
                self._rows.setdefault("captures", []).append(row)
            self._capturing = self._capturer.active(self._step)

    def _on_grad(self, seen: Seen, grad: torch.Tensor) -> None:
        t0 = perf_counter()
        if not self._live or seen.step != self._step:
            return
        try:
            self._steps.backward_ran()
            v = t0 - self._ovh
            summary = self._summarise(grad)
            for call, slot, path in seen.grad_slots:
                if slot == _GRAD_OUTPUT:
                    if call.bwd_start is None or v < call.bwd_start:
                        call.bwd_start = v
                elif v > call.bwd_end:
                    call.bwd_end = v
                self._keep_grad(call, slot, path, grad, summary)
            if self._check and summary is not None and not stats.is_finite(summary):
                alert = self.detector.gradient(seen, summary, self._step, time.time())
                module = alert.module.ref() if alert is not None else None
                self._alert(alert, module=module, grad=grad, output=seen.ref())
        except Exception:
            self._internal_error()
        finally:
            self._ovh += perf_counter() - t0
        if self._alerts:
            self._act()

    def _keep_grad(
        self, call: Call, slot: int, path: str, grad: torch.Tensor, summary: tuple | None
    ) -> None:
        if self._emit_tensors:
            self._rows.setdefault("tensors", []).append(
                (call.id, self._step, call.info.id, _BWD, slot, path, summary)
            )
        if self._flight is not None:
            self._flight.keep(call, _BWD, slot, path, grad)
        if self._capturing and call.info.capture:
            row = self._capturer.take(self._step, call, call.info.id, _BWD, slot, path, grad)
            if row is not None:
                self._rows.setdefault("captures", []).append(row)
            self._capturing = self._capturer.active(self._step)

    def _on_param_grad(self, info: ModuleInfo, name: str, param: torch.Tensor) -> None:
        t0 = perf_counter()
        if not self._live or not self._recording or param.grad is None:
            return
        try:
            v = t0 - self._ovh
            calls = self._module_calls.get(info.id, [])
            for call in calls:
                call.param_end = max(call.param_end, v)
            summary = self._summarise(param.grad)
            if calls:
                self._keep_grad(calls[-1], int(Slot.PARAM_GRAD), name, param.grad, summary)
            elif self._emit_tensors:
                self._rows.setdefault("tensors", []).append(
                    (-1, self._step, info.id, _BWD, int(Slot.PARAM_GRAD), name, summary)
                )
            if self._check and summary is not None:
                finite = stats.is_finite(summary)
                self._grad_finite[id(param)] = finite
                if not finite:
                    alert = self.detector.param_grad(
                        info, calls, name, summary, self._step, time.time()
                    )
                    self._alert(alert, module=info.ref(), grad=param.grad)
        except Exception:
            self._internal_error()
        finally:
            self._ovh += perf_counter() - t0
        if self._alerts:
            self._act()

    def _summarise(self, t: torch.Tensor) -> tuple | None:
        if self._summary is None:
            return None
        grad_mode = torch.is_grad_enabled()
        _set_grad_enabled(False)
        try:
            return self._summary(t) if t.layout is torch.strided else stats.shape_only(t)
        finally:
            _set_grad_enabled(grad_mode)

    # -- optimizer hooks -------------------------------------------------------------

    def _opt_pre(self, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        t0 = perf_counter()
        if not self._live:
            return
        self._steps.optimizer_begin()
        self._opt_start[id(opt)] = t0 - self._ovh
        if self._distributed and self._recording and self._level == Level.STATS:
            try:
                self._step_grads(opt)
            except Exception:
                self._internal_error()
        self._ovh += perf_counter() - t0
        if self._alerts:
            self._act()

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

    def _opt_post(self, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        t0 = perf_counter()
        if not self._live:
            return
        try:
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
        except Exception:
            self._internal_error()
        finally:
            self._ovh += perf_counter() - t0
        if self._alerts:
            self._act()

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

    # -- steps, rows, alerts ---------------------------------------------------------

    def _begin_step(self, step: int, now: float) -> None:
        if not self._distributed:
            self._learn_distributed()
        self._step = step
        self._recording = self.options.records_step(step)
        self._capturing = (
            self._capturer is not None and self._recording and (self._capturer.active(step))
        )
        if self._flight is not None:
            self._flight.new_step(step)
        self.detector.new_step()
        self._step_start = now
        self._memo = {}
        self._index = {}
        self._calls = []
        self._module_calls = {}
        self._grad_finite = {}

    def _end_step(self, now: float) -> None:
        if self._recording:
            self._rows.setdefault("calls", []).extend(
                backward_rows(self._calls, self._step, self._v0)
            )
            self.steps_recorded += 1
        self._rows.setdefault("steps", []).append(
            (
                self._step,
                self._step_start - self._v0,
                now - self._v0,
                len(self._calls),
                self._steps.optimizer_steps,
                int(self._steps.saw_backward),
                int(self._recording),
            )
        )
        self._memo = {}  # drop references to this step's tensors now, not at the next step

    def _learn_distributed(self) -> None:
        """torch.distributed is set up by the script after recording starts: note its
        backend and world in the ``info`` table once it is (file attributes are fixed
        once SWMR starts)."""
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            self._distributed = dist.get_world_size() > 1
            now = time.time()
            self._rows.setdefault("info", []).extend(
                [
                    (now, "backend", str(dist.get_backend())),
                    (now, "rank", str(dist.get_rank())),
                    (now, "world_size", str(dist.get_world_size())),
                ]
            )

    def _handoff(self) -> None:
        self._last_handoff = perf_counter()
        if self._rows and self._writer is not None:
            rows, self._rows = self._rows, {}
            self._writer.submit(rows)

    def _now(self) -> float:
        """Wall-clock time of an alert: comparable across the ranks of a distributed run."""
        return time.time()

    def _on_new_module(self, info: ModuleInfo, obj: object) -> None:
        self._rows.setdefault("modules", []).append(info.row())
        if info.kind != ModuleKind.MODULE or not info.selected:
            return
        if self._capturer is not None:
            info.capture = self._capturer.select(info.name, info.path)
        for name, p in obj._parameters.items():  # type: ignore[attr-defined]
            if p is None or id(p) in self._param_owner:
                continue
            self._param_owner[id(p)] = (info, name)
            if p.requires_grad:
                self._hooks.add(
                    p.register_post_accumulate_grad_hook, partial(self._on_param_grad, info, name)
                )

    def _alert(self, alert: Alert | None, **context: object) -> None:
        """Queue an origin found by a hook, with the live objects a debugger would want."""
        if alert is not None:
            alert.context = context
            self._alerts.append(alert)

    def _act(self) -> None:
        """Record the alerts a hook found, warn once per origin, write the flight
        recorder's tensors, then do what --on-nan asks. Runs after the hook's error
        guard, so that an action may raise into the training code."""
        alerts, self._alerts = self._alerts, []
        new_origin = None
        for alert in alerts:
            new = self.detector.is_new_origin(alert)
            self._rows.setdefault("alerts", []).append(alert.row())
            if new:
                new_origin = new_origin or alert
                self.warn(alert.message())
                self._fly(alert)
        action = self.options.on_nan
        if action == "warn":
            return
        self._handoff()  # what led here is on its way to disk before anything else
        if action == "raise":
            raise NonFiniteError(alerts[0])
        if action == "break" and new_origin is not None:
            if interactive():
                nan_breakpoint(new_origin)
                return
            self.warn(
                "--on-nan break needs a terminal to type into (stdin is not one); stopping instead"
            )
            raise NonFiniteStop(new_origin)
        if action == "stop":
            raise NonFiniteStop(alerts[0])

    def _fly(self, alert: Alert) -> None:
        """Write the flight recorder's tensors around a new origin."""
        if self._flight is None or alert.origin is None:
            return
        rows, stale = self._flight.dump(alert.origin)
        if rows:
            self._rows.setdefault("captures", []).extend(rows)
            steps = sorted({r[0] for r in rows})
            span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
            note = f"; {stale} changed in place since were left out" if stale else ""
            self.warn(
                f"flight recorder: wrote {len(rows)} tensors of {alert.module.name} and "
                f"its neighbours ({span}) to {self.path}{note}"
            )

    def _internal_error(self) -> None:
        """A bug in hookdbg must never break training: stop recording, say so, go on."""
        self._live = False
        print("hookdbg: internal error, recording stopped (training continues):", file=sys.stderr)
        traceback.print_exc(file=sys.stderr)


def _summary_function(level: Level, check: bool):
    """How a tensor is summarised at this level (None: not at all)."""
    if level == Level.STATS:
        return stats.summarise
    if check:
        return stats.check_finite
    return stats.shape_only if level == Level.SHAPES else None
