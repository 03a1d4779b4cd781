"""The recorder: PyTorch's global hooks in, rows for the background writer out.

Hooks installed (all owned by one ``HookSet`` and removed together):

* global forward pre-hook: names the module, decides segments (steps, eval batches) at
  root calls, summarises positional inputs *before* forward runs (in-place ops would
  change them after);
* global forward hook (``with_kwargs``, ``always_call``): timing, keyword inputs,
  outputs; also runs when forward raises, so the call stack never goes out of step;
* a pre-hook on the autograd node of each new tensor that needs a gradient
  (gradients.py): one gradient summary serves every call that produced or consumed the
  tensor. (A global full backward hook would be simpler but crashes on in-place ReLU,
  see docs/design.md);
* a post-accumulate-grad hook on each parameter of a recorded module (gradients.py);
* global optimizer step pre/post hooks (optimizer.py): step boundaries, parameter values;
* a wrapper around models compiled in place (compiled.py), and SIGTERM/SIGHUP handlers
  (signals.py).

The module hooks run on every module call, so they live here with the per-call state
(the call stack) as plain attributes. Everything else is a part this object owns and
hands the shared pieces to: the ``Guard`` every hook reads first (envelope.py), the
segment's ``StepState`` (calls.py), the ``Rows`` for the writer (store/rows.py), the
tensor observer, the optimizer observer, what an alert does (actions.py), names
(naming.py), segments (steps.py), NaN/inf origins (nonfinite.py), full tensors
(capture.py), backward spans (timing.py) and the file (store/writer.py).
"""

from __future__ import annotations

import collections
import contextlib
import gc
import itertools
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from time import perf_counter

import torch
from torch.compiler import is_compiling
from torch.nn.modules import module as module_hooks
from torch.optim import optimizer as optimizer_hooks

from hookdbg.options import RecordOptions
from hookdbg.ranks import placement
from hookdbg.recorder.actions import Actions, NonFiniteStop
from hookdbg.recorder.calls import Call, Segment, StepState
from hookdbg.recorder.capture import Capturer, FlightRecorder
from hookdbg.recorder.compiled import InPlaceCompiled, compiled_in_place
from hookdbg.recorder.deferred import StepBatch
from hookdbg.recorder.envelope import Guard, hook
from hookdbg.recorder.gradscaler import Decision, ScalerWatch, step_columns
from hookdbg.recorder.histograms import writer_layout
from hookdbg.recorder.hookset import HookSet
from hookdbg.recorder.meta import run_metadata
from hookdbg.recorder.naming import ModuleInfo, ModuleRegistry, compiled_model
from hookdbg.recorder.nonfinite import OriginDetector
from hookdbg.recorder.observe import TensorObserver
from hookdbg.recorder.optimizer import OptimizerObserver
from hookdbg.recorder.recompute import Recompute
from hookdbg.recorder.signals import TerminationSignals
from hookdbg.recorder.steps import RootKind, StepTracker, root_kind
from hookdbg.recorder.tensors import iter_tensors
from hookdbg.recorder.timing import backward_rows
from hookdbg.store.rows import Rows
from hookdbg.store.schema import ModuleKind, Phase, Slot, StepKind
from hookdbg.store.writer import Writer, WriterError

_RAISED = object()  # forward raised: torch calls always_call hooks without kwargs
_MUTED = object()  # a call in a muted subtree (step not recorded, or inside backward)
_GRAD_OUTPUT, _GRAD_INPUT = int(Slot.GRAD_OUTPUT), int(Slot.GRAD_INPUT)
_FWD = int(Phase.FWD)
_graph_task_id = torch._C._current_graph_task_id
_grad_enabled = torch.is_grad_enabled
_get_ident = threading.get_ident

_active: Recorder | None = None
_COMPILE_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"


def status_prefix() -> str:
    """'hookdbg: ', or 'hookdbg[rank 1]: ' as one of several torch.distributed ranks."""
    return placement().prefix


class RecordError(Exception):
    """A recording cannot start; the message is one line meant for the user."""


def _disable_after_fork() -> None:
    # DataLoader workers fork with our hooks installed; they must not record.
    if _active is not None:
        _active.guard.live = False


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
        defer_cpu: bool = False,
    ) -> None:
        self.options = options = options or RecordOptions()
        self.path = Path(path)
        if self.path.is_dir():
            raise RecordError(f"{self.path} is a directory; give a file name like run.h5")
        if self.path.exists() and not force:
            raise RecordError(f"{self.path} already exists; pass --force to overwrite it")
        self._argv = list(sys.argv if argv is None else argv)
        self.guard = guard = Guard()
        self.rows = rows = Rows()
        self.detector = detector = OriginDetector()
        self._steps = steps = StepTracker()
        self._hooks = HookSet()
        self._registry = registry = ModuleRegistry(options.modules.selects, self._on_new_module)
        self._by_id = registry.by_id  # the per-call fast path reads it directly
        checks = options.checks_nan
        flight = (
            FlightRecorder(options.flight_budget) if (options.flight_budget and checks) else None
        )
        self._flight = flight
        self._capturer = Capturer(options, self.warn) if options.capture else None
        self.actions = Actions(
            guard, rows, detector, options.on_nan, self.warn, self._handoff, flight, self.path
        )
        self.observer = TensorObserver(
            guard,
            options,
            rows,
            detector,
            steps,
            registry,
            flight,
            self._capturer,
            self.actions.alert,
            self._handoff,
        )
        self.observer.defer_all = defer_cpu
        self._call_ids = itertools.count()
        self._optimizer: OptimizerObserver | None = None
        # device tensors' statistics are read back a step later (recorder/deferred.py),
        # unless an action must happen inside the hook; defer_cpu does it on CPU too
        self._defer = options.on_nan in ("warn", "stop") and checks
        self._defer_all = defer_cpu
        self._inflight: collections.deque[StepBatch] = collections.deque()
        # steps rows wait here, in order, until what a GradScaler found is known
        self._step_rows: collections.deque[tuple[tuple, list[Decision]]] = collections.deque()
        self._scaler: ScalerWatch | None = None
        self._warned_device = False
        self._writer: Writer | None = None
        self._closed = False
        self._started = False
        self._froze = False
        self._warning_filter: tuple | None = None
        # per-call state
        self._stack: list = []
        self._open: Call | None = None
        self._mute = 0
        # the segment (a training step or an eval batch: recorder/steps.py)
        self.state = StepState(Segment(-1, 0, None, 0), False, 0.0, None)
        self.observer.begin(self.state)
        self._last_handoff = 0.0
        self._handoff_every = min(0.5, options.flush_interval / 2)
        self.unmatched_globs: list[str] = []  # --modules globs said to match nothing
        self.steps_recorded = 0  # training steps
        self.evals_recorded = 0  # eval batches
        self.calls_recorded = 0

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> Recorder:
        global _active
        if self._started:
            raise RecordError(
                f"this recorder already recorded to {self.path}; make a new one for "
                "another recording (hookdbg.record(...))"
            )
        if _active is not None:
            raise RecordError("a hookdbg recording is already running in this process")
        self._started = True
        meta = run_metadata(self._argv, self.options)
        try:
            self._writer = Writer(
                self.path,
                meta,
                flush_interval=self.options.flush_interval,
                max_backlog_bytes=self.options.max_backlog_bytes,
                warn=self.warn,
                pull=self._pull,
                **writer_layout(self.options.histograms),  # converters, tables
            )
        except WriterError as exc:
            raise RecordError(str(exc)) from None
        self.observer.writer = self._writer
        self._v0 = self._last_handoff = perf_counter()
        self._tid = _get_ident()
        self._optimizer = opt = OptimizerObserver(
            self.guard,
            self.observer,
            self._steps,
            self._registry,
            self.rows,
            self._call_ids,
            self._v0,
        )
        hooks = self._hooks
        hooks.add(module_hooks.register_module_forward_pre_hook, self._pre)
        hooks.add(
            module_hooks.register_module_forward_hook,
            self._post,
            with_kwargs=True,
            always_call=True,
        )
        hooks.add(optimizer_hooks.register_optimizer_step_pre_hook, opt.pre)
        hooks.add(optimizer_hooks.register_optimizer_step_post_hook, opt.post)
        # Full garbage collections scan every tracked object, ~300,000 of them torch's
        # own; the flight recorder makes them come sooner (it keeps tensors alive for
        # two steps). Objects from before the recording are frozen out of those scans
        # (NumNet MLP: 417 -> 28 us of collection per step) and unfrozen at close.
        self._froze = gc.isenabled()
        if self._froze:
            gc.freeze()
        hooks.add(InPlaceCompiled, self._pre, self._post)
        self._scaler = hooks.add(
            ScalerWatch, self.guard, self.observer, self._steps, self.actions.release, self.warn
        )
        hooks.add(TerminationSignals, self._terminated)
        # torch.compile(model) warns that global hooks fire for its wrapper too: they
        # are hookdbg's, which expects that (recorder/naming.py), not the script's
        warnings.filterwarnings("ignore", message=_COMPILE_WARNING, category=UserWarning)
        self._warning_filter = warnings.filters[0]
        _active = self
        self.guard.live = True
        return self

    def close(self, status: str = "complete", exit_code: int = 0, message: str = "") -> None:
        """Remove every hook, write what is pending and the end row, close the file."""
        global _active
        if self._closed:
            return
        self._closed = True
        guard = self.guard
        guard.live = False
        try:
            self._hooks.remove()
        finally:
            with contextlib.suppress(ValueError):
                filters = warnings.filters
                if isinstance(filters, list):  # it is; typeshed declares a Sequence
                    filters.remove(self._warning_filter)
                warnings._filters_mutated()  # type: ignore[attr-defined]
            if _active is self:
                _active = None
            if self._froze:
                gc.unfreeze()
            with guard.lock:
                now = perf_counter() - guard.ovh
                if self.state.id >= 0:
                    self._end_step(now, cut=status != "complete")
                self._read_batches(wait=True)
                if guard.alerts:
                    self.actions.act(actions=False)  # the script is over: nothing to stop
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
            if self._writer is not None:  # not under the lock: the writer may want it
                self._writer.close(end)

    def _terminated(self, signum: signal.Signals) -> None:
        """SIGTERM or SIGHUP that would end the process: close the recording first."""
        self.close("terminated", 128 + int(signum), signum.name)
        self.warn(f"{signum.name}: the recording is closed (status terminated) -> {self.path}")

    def _pull(self) -> None:
        """Hand over what the hooks gathered, asked by the writer on its own timer, so
        rows do not wait for the training thread to call a hook again. Not if a hook
        holds the lock for long (a signal handler closing the recording inside one):
        what it gathered is handed over when it is done."""
        lock = self.guard.lock
        if lock.acquire(timeout=0.2):
            try:
                self._handoff()
            finally:
                lock.release()

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
        """Why the file stopped growing before the recording ended, if it did."""
        if self._writer is None:
            return None
        return self._writer.failed or self._writer.died

    @property
    def steps_written(self) -> int:
        """Steps and eval batches whose rows reached the file."""
        return self._writer.steps_written if self._writer else 0

    def warn(self, message: str) -> None:
        if not self.options.quiet:
            print(f"{status_prefix()}{message}", file=sys.stderr, flush=True)

    # -- module hooks ----------------------------------------------------------------

    def _pre(self, module: torch.nn.Module, args: tuple) -> None:
        """Inside a call that is not recorded (a step --every skips, an eval batch left
        out) a nested call only counts its depth: no clock, no lock."""
        if is_compiling():
            return
        if self._mute and _get_ident() == self._tid:
            self._mute += 1
            return
        self._pre_recorded(module, args)

    def _post(
        self, module: torch.nn.Module, args: tuple, kwargs: dict, result: object = _RAISED
    ) -> None:
        if is_compiling():
            return
        if self._mute > 1 and _get_ident() == self._tid:
            self._mute -= 1
            return
        self._post_recorded(module, args, kwargs, result)

    @hook
    def _pre_recorded(self, t0: float, module: torch.nn.Module, args: tuple) -> None:
        if _get_ident() != self._tid:
            return
        stack = self._stack
        if stack:
            top = stack[-1]
            cls = top.__class__
            if cls is Recompute:
                self._recompute_inner(top, module, args)
                return
            pinfo = top.info if cls is Call else top
        else:
            pinfo = None
        info = self._by_id.get(id(module))
        if info is None or info.ref() is not module:
            info = self._registry.lookup(module, pinfo)
        if pinfo is None:
            if _graph_task_id() != -1:  # a forward run again inside backward
                self._recompute_outer(info, module, args)
                return
            if not self._root_call(info, module, t0):
                self._mute = 1
                stack.append(_MUTED)
                return
        if info.transparent or not info.selected:
            stack.append(info)
            return
        state = self.state
        index = state.index.get(info.id, 0)
        state.index[info.id] = index + 1
        call = Call(next(self._call_ids), info, index, self._open, t0 - self.guard.ovh)
        call.grad_on = _grad_enabled()
        state.calls.append(call)
        calls = state.module_calls.get(info.id)
        if calls is None:
            state.module_calls[info.id] = [call]
        else:
            calls.append(call)
        stack.append(call)
        self._open = call
        if args:
            self.observer.inputs(call, module, args)

    def _recompute_outer(self, info: ModuleInfo, module: torch.nn.Module, args: tuple) -> None:
        """A module called with no other around it inside backward: a checkpointed block
        run again (recorder/recompute.py), or user code in a hook (not recorded)."""
        state = self.state
        calls = state.module_calls.get(info.id)
        frame = None
        if calls and state.recording:
            inputs = {id(t) for _, t in iter_tensors(args, "", 0)}
            frame = state.recompute.outer(calls, inputs)
        if frame is None:
            self._mute = 1
            self._stack.append(_MUTED)
        else:
            self._stack.append(frame)

    def _recompute_inner(self, parent: Recompute, module: torch.nn.Module, args: tuple) -> None:
        info = self._by_id.get(id(module))
        frame = None if info is None else self.state.recompute.inner(parent, info)
        if frame is None:
            self._mute = 1
            self._stack.append(_MUTED)
            return
        self._stack.append(frame)
        self.observer.recomputed(frame, args, _GRAD_INPUT)

    @hook
    def _post_recorded(
        self,
        t0: float,
        module: torch.nn.Module,
        args: tuple,
        kwargs: dict,
        result: object = _RAISED,
    ) -> None:
        if _get_ident() != self._tid or not self._stack:
            return
        frame = self._stack.pop()
        if frame.__class__ is not Call:
            if frame is _MUTED:
                self._mute -= 1
            elif frame.__class__ is Recompute and result is not _RAISED:
                if frame.outer:  # its own output's gradient reports for the calls inside
                    self.observer.forget_recomputed(result)
                else:
                    self.observer.recomputed(frame, (result,), _GRAD_OUTPUT)
            return
        call: Call = frame
        total = call.total = t0 - self.guard.ovh - call.vstart
        parent = self._open = call.parent
        if parent is not None:
            parent.child_time += total
        observer = self.observer
        if result is not _RAISED:
            observer.outputs(call, module, args, kwargs, result)
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
                call.vstart - self._v0,
                total,
                total - call.child_time,
            )
        )
        self.calls_recorded += 1
        if t0 - self._last_handoff > self._handoff_every:
            self._handoff()

    def _root_call(self, info: ModuleInfo, module: torch.nn.Module, t0: float) -> bool:
        """A call with no module around it: maybe a new segment. True if it is recorded."""
        kind = root_kind(module, info.has_params)
        steps = self._steps
        if steps.starts_segment(info.id, kind):
            now = t0 - self.guard.ovh
            if steps.segment >= 0:
                self._end_step(now)
            steps.begin()
            self._begin_step(now, _on_device(module))
            self._read_batches(wait=False)
        steps.root_ran(info.id, kind)
        seg = self.state.seg
        if seg.training is None:  # what messages call it until it ends
            if steps.is_training:
                seg.training = True
            elif steps.effective(kind) == RootKind.EVAL:
                seg.training = False
        return self.state.recording

    # -- segments, rows --------------------------------------------------------------

    def _begin_step(self, now: float, on_device: bool = False) -> None:
        gradients = self.observer.gradients
        if gradients.lazy:
            gradients.watch_lazy()
        optimizer = self._optimizer
        if optimizer is not None and not optimizer.distributed:
            self._learn_distributed(optimizer)
        steps = self._steps
        seg = Segment(steps.segment, steps.step, None, steps.evals)
        recording = self.options.records_step(seg.step)
        deferring = recording and self._defer and (self._defer_all or on_device)
        if on_device and not self._warned_device:
            self._warned_device = True
            self.warn(
                "the model runs on an accelerator: module times are measured on the host "
                "(kernel launches, and any waits), not on the device"
            )
            if not self._defer and self.options.checks_nan:
                self.warn(
                    f"--on-nan {self.options.on_nan} checks every tensor inside its hook, "
                    "which waits for the device each time; warn and stop do not"
                )
        self.state = state = StepState(
            seg, recording, now, StepBatch(seg.id, self.options.histograms) if deferring else None
        )
        self.observer.begin(state)
        if self._flight is not None:
            self._flight.new_step(seg)
        self.detector.new_step()

    def _end_step(self, now: float, cut: bool = False) -> None:
        state = self.state
        steps = self._steps
        state.seg.training = training = steps.end(cut)
        if state.recording:
            self.rows.calls.extend(backward_rows(state.calls, state.step, state.id, self._v0))
            if training:
                self.steps_recorded += 1
            else:
                self.evals_recorded += 1
        if state.seg.held is not None and self._scaler is not None:
            self.observer.check(self._scaler.release_held, state.seg)
        row = (
            state.step,
            state.id,
            int(StepKind.TRAIN if training else StepKind.EVAL),
            state.start - self._v0,
            now - self._v0,
            len(state.calls),
            steps.optimizer_steps,
            int(steps.saw_backward),
            int(state.recording),
        )
        self._step_rows.append((row, state.scaler))
        self._complete_step_rows()
        state.memo = {}  # drop references to this step's tensors now, not at the next step
        if state.batch is not None:
            state.batch.launch()
            self._inflight.append(state.batch)
        self._handoff()  # a finished step is on its way to disk at once
        if state.id == 0:
            self._check_globs()

    def _read_batches(self, wait: bool) -> None:
        """Complete the steps whose device statistics have reached the host: rows to the
        writer, NaN/inf checks replayed in order (their alerts acted on by the hook)."""
        while self._inflight and (wait or self._inflight[0].ready()):
            batch = self._inflight.popleft()
            batch.read()
            self.rows.tensors.extend(batch.finished_rows())
            self.detector.new_step()
            for check, args in batch.checks:
                check(*args)
        self._complete_step_rows()

    def _complete_step_rows(self) -> None:
        """Steps rows to the writer, in order, once their GradScaler columns are known."""
        waiting = self._step_rows
        while waiting:
            columns = step_columns(waiting[0][1])
            if columns is None:
                return
            self.rows.steps.append((*waiting.popleft()[0], *columns))

    def _check_globs(self) -> None:
        """Say at once, not when the run ends, that a --modules glob matched nothing in
        the first step (almost always a typo)."""
        seen = [(i.name, i.path) for i in self.modules]
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
                    (now, "backend", str(dist.get_backend())),
                    (now, "rank", str(dist.get_rank())),
                    (now, "world_size", str(dist.get_world_size())),
                ]
            )

    def _handoff(self) -> None:
        self._last_handoff = perf_counter()
        self.observer.pending_capture = 0
        if self._writer is not None:
            batch = self.rows.take()
            if batch:
                self._writer.submit(batch)

    def _on_new_module(self, info: ModuleInfo, obj: object) -> None:
        self.rows.modules.append(info.row())
        if info.kind == ModuleKind.MODULE and (compiled_model(obj) or compiled_in_place(obj)):
            self.rows.info.append((time.time(), "compiled", info.name))
        if info.kind != ModuleKind.MODULE or not info.selected:
            return
        if self._capturer is not None:
            info.capture = self._capturer.select(info.name, info.path)
        self.observer.gradients.watch_params(info, obj, self._hooks.add)


def _on_device(module: torch.nn.Module) -> bool:
    """Whether a model computes on an accelerator (judged by its first parameter)."""
    for p in module.parameters():
        return not p.is_cpu
    return False
