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

The hooks share per-step state and run on every module call, so they are methods of
one object (attribute lookups stay local), written in four modules: module hooks and
the recording's lifecycle here, tensor hooks (tensor_hooks.py), optimizer hooks
(optimizer_hooks.py), what an alert does (actions.py). The rest is delegated:
statistics (stats), naming, steps, NaN/inf origins (nonfinite), what an origin does
(actions), full tensors (capture), backward spans (timing), the file (store.writer).
"""

from __future__ import annotations

import collections
import contextlib
import gc
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from functools import partial
from pathlib import Path
from time import perf_counter

import torch
from torch.nn.modules import module as module_hooks
from torch.optim import optimizer as optimizer_hooks

from hookdbg.options import Level, RecordOptions
from hookdbg.recorder.actions import AlertActions, NonFiniteStop
from hookdbg.recorder.calls import Call, Seen, Segment
from hookdbg.recorder.capture import Capturer, FlightRecorder
from hookdbg.recorder.compiled import InPlaceCompiled, compiled_in_place
from hookdbg.recorder.deferred import StepBatch
from hookdbg.recorder.envelope import hook
from hookdbg.recorder.hookset import HookSet
from hookdbg.recorder.meta import run_metadata
from hookdbg.recorder.naming import ModuleInfo, ModuleRegistry, compiled_model
from hookdbg.recorder.nonfinite import Alert, OriginDetector
from hookdbg.recorder.optimizer_hooks import OptimizerHooks
from hookdbg.recorder.recompute import Recompute, RecomputeIndex
from hookdbg.recorder.rows import CONVERTERS
from hookdbg.recorder.signals import TerminationSignals
from hookdbg.recorder.steps import RootKind, StepTracker, root_kind
from hookdbg.recorder.tensor_hooks import TensorHooks, summary_function
from hookdbg.recorder.tensors import iter_args
from hookdbg.recorder.timing import backward_rows, call_row
from hookdbg.store.schema import ModuleKind, Phase, Slot, StepKind
from hookdbg.store.writer import Writer, WriterError

_RAISED = object()  # forward raised: torch calls always_call hooks without kwargs
_MUTED = object()  # a call in a muted subtree (step not recorded, or inside backward)
_INPUT, _OUTPUT = int(Slot.INPUT), int(Slot.OUTPUT)
_GRAD_OUTPUT, _GRAD_INPUT = int(Slot.GRAD_OUTPUT), int(Slot.GRAD_INPUT)
_FWD, _BWD, _OPT = int(Phase.FWD), int(Phase.BWD), int(Phase.OPT)
_set_grad_enabled = torch._C._set_grad_enabled
_graph_task_id = torch._C._current_graph_task_id

_active: Recorder | None = None
_COMPILE_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"


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


class Recorder(TensorHooks, OptimizerHooks, AlertActions):
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
        self.options = options or RecordOptions()
        self.path = Path(path)
        if self.path.is_dir():
            raise RecordError(f"{self.path} is a directory; give a file name like run.h5")
        if self.path.exists() and not force:
            raise RecordError(f"{self.path} already exists; pass --force to overwrite it")
        self._argv = list(sys.argv if argv is None else argv)
        self._level = int(self.options.level)
        self._emit_tensors = self.options.level >= Level.SHAPES  # tensor rows in the file
        self._check_nan = self.options.checks_nan
        self._summary = summary_function(self.options.level, self._check_nan)
        # device tensors' statistics are read back a step later (recorder/deferred.py),
        # unless an action must happen inside the hook; defer_cpu does it on CPU too
        self._defer = self.options.on_nan in ("warn", "stop") and self._check_nan
        self._defer_all = defer_cpu
        self._batch: StepBatch | None = None
        self._inflight: collections.deque[StepBatch] = collections.deque()
        self._warned_device = False
        self._capturer = Capturer(self.options, self.warn) if self.options.capture else None
        self._capturing = False
        self._flight = (
            FlightRecorder(self.options.flight_budget)
            if (self.options.flight_budget and self._check_nan)
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
        self._started = False
        # held by every hook body, and by the writer while it takes the rows (_pull)
        self._lock = threading.RLock()
        self._warning_filter: tuple | None = None
        self._distributed = False  # torch.distributed initialised with several ranks
        # per-call state
        self._stack: list = []
        self._open: Call | None = None
        self._mute = 0
        self._ovh = 0.0  # seconds spent inside hookdbg's hooks so far
        self._next_call = 0
        # per-segment state (a training step or an eval batch: recorder/steps.py)
        self._seg = Segment(-1, 0, True, 0)
        self._step = 0  # the segment's step number, as written in rows
        self._segment = -1  # the segment's id, as written in rows
        self._recording = False
        self._step_start = 0.0
        self._memo: dict[int, Seen] = {}
        self._index: dict[int, int] = {}
        self._calls: list[Call] = []
        self._module_calls: dict[int, list[Call]] = {}
        self._recompute = RecomputeIndex(self._calls)
        self._grad_finite: dict[int, bool] = {}
        self._opt_start: dict[int, float] = {}
        self._param_owner: dict[int, tuple[ModuleInfo, str]] = {}
        self._alerts: list[Alert] = []
        # rows waiting to be handed to the writer
        self._rows: dict[str, list] = {}
        self._last_handoff = 0.0
        self._pending_capture = 0  # bytes of captured tensors not handed over yet
        self._handoff_every = min(0.5, self.options.flush_interval / 2)
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
                converters=CONVERTERS,
                flush_interval=self.options.flush_interval,
                max_backlog_bytes=self.options.max_backlog_bytes,
                warn=self.warn,
                pull=self._pull,
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
        hooks.add(InPlaceCompiled, self._pre, self._post)
        hooks.add(TerminationSignals, self._terminated)
        # torch.compile(model) warns that global hooks fire for its wrapper too: they
        # are hookdbg's, which expects that (recorder/naming.py), not the script's
        warnings.filterwarnings("ignore", message=_COMPILE_WARNING, category=UserWarning)
        self._warning_filter = warnings.filters[0]
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
            with contextlib.suppress(ValueError):
                warnings.filters.remove(self._warning_filter)
                warnings._filters_mutated()  # type: ignore[attr-defined]
            if _active is self:
                _active = None
            if self._froze:
                gc.unfreeze()
            with self._lock:
                now = perf_counter() - self._ovh
                if self._segment >= 0:
                    self._end_step(now, cut=status != "complete")
                self._read_batches(wait=True)
                if self._alerts:
                    self._act(actions=False)  # the script is over: nothing left to stop
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

    def _terminated(self, signum: signal.Signals) -> None:
        """SIGTERM or SIGHUP that would end the process: close the recording first."""
        self.close("terminated", 128 + int(signum), signum.name)
        self.warn(f"{signum.name}: the recording is closed (status terminated) -> {self.path}")

    def _pull(self) -> None:
        """Hand over what the hooks gathered, asked by the writer on its own timer, so
        rows do not wait for the training thread to call a hook again. Not if a hook
        holds the lock for long (a signal handler closing the recording inside one):
        what it gathered is handed over when it is done."""
        if self._lock.acquire(timeout=0.2):
            try:
                self._handoff()
            finally:
                self._lock.release()

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

    @hook
    def _pre(self, t0: float, module: torch.nn.Module, args: tuple) -> None:
        if threading.get_ident() != self._tid:
            return
        stack = self._stack
        if self._mute:
            self._mute += 1
            stack.append(_MUTED)
            return
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
        index = self._index.get(info.id, 0)
        self._index[info.id] = index + 1
        call = Call(self._next_call, info, index, self._open, t0 - self._ovh)
        self._next_call += 1
        self._calls.append(call)
        self._module_calls.setdefault(info.id, []).append(call)
        stack.append(call)
        self._open = call
        self._observe_inputs(call, module, args)

    def _recompute_outer(self, info: ModuleInfo, module: torch.nn.Module, args: tuple) -> None:
        """A module called with no other around it inside backward: a checkpointed block
        run again (recorder/recompute.py), or user code in a hook (not recorded)."""
        calls = self._module_calls.get(info.id)
        frame = None
        if calls and self._recording:
            inputs = {id(t) for _, t in iter_args(args)}
            frame = self._recompute.outer(calls, inputs)
        if frame is None:
            self._mute = 1
            self._stack.append(_MUTED)
        else:
            self._stack.append(frame)

    def _recompute_inner(self, parent: Recompute, module: torch.nn.Module, args: tuple) -> None:
        info = self._by_id.get(id(module))
        frame = None if info is None else self._recompute.inner(parent, info)
        if frame is None:
            self._mute = 1
            self._stack.append(_MUTED)
            return
        self._stack.append(frame)
        self._observe_recomputed(frame, args, _GRAD_INPUT)

    @hook
    def _post(
        self,
        t0: float,
        module: torch.nn.Module,
        args: tuple,
        kwargs: dict,
        result: object = _RAISED,
    ) -> None:
        if threading.get_ident() != self._tid or not self._stack:
            return
        frame = self._stack.pop()
        if frame.__class__ is not Call:
            if frame is _MUTED:
                self._mute -= 1
            elif frame.__class__ is Recompute and result is not _RAISED:
                if frame.outer:  # its own output's gradient reports for the calls inside
                    self._forget_recomputed(result)
                else:
                    self._observe_recomputed(frame, (result,), _GRAD_OUTPUT)
            return
        call: Call = frame
        total = call.total = t0 - self._ovh - call.vstart
        parent = self._open = call.parent
        if parent is not None:
            parent.child_time += total
        if result is not _RAISED:
            self._observe_outputs(call, module, args, kwargs, result)
        if self._batch is not None:
            self._check(self._taint_parent, call)
        elif call.tainted and parent is not None:
            parent.tainted = True
        self._rows.setdefault("calls", []).append(
            call_row(
                call.id,
                _FWD,
                self._step,
                self._segment,
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
            now = t0 - self._ovh
            if steps.segment >= 0:
                self._end_step(now)
            steps.begin()
            self._begin_step(now, _on_device(module))
            self._read_batches(wait=False)
        steps.root_ran(info.id, kind)
        if self._seg.training is None:  # what messages call it until it ends
            if steps.is_training:
                self._seg.training = True
            elif steps.effective(kind) == RootKind.EVAL:
                self._seg.training = False
        return self._recording

    # -- steps, rows, alerts ---------------------------------------------------------

    def _begin_step(self, now: float, on_device: bool = False) -> None:
        if not self._distributed:
            self._learn_distributed()
        steps = self._steps
        self._step, self._segment = steps.step, steps.segment
        self._seg = Segment(steps.segment, steps.step, None, steps.evals)
        self._recording = self.options.records_step(self._step)
        deferring = self._recording and self._defer and (self._defer_all or on_device)
        self._batch = StepBatch(self._segment) if deferring else None
        if on_device and not self._warned_device:
            self._warned_device = True
            self.warn(
                "the model runs on an accelerator: module times are measured on the host "
                "(kernel launches, and any waits), not on the device"
            )
            if not self._defer and self._check_nan:
                self.warn(
                    f"--on-nan {self.options.on_nan} checks every tensor inside its hook, "
                    "which waits for the device each time; warn and stop do not"
                )
        self._capturing = (
            self._capturer is not None and self._recording and self._capturer.active(self._step)
        )
        if self._flight is not None:
            self._flight.new_step(self._seg)
        self.detector.new_step()
        self._step_start = now
        self._memo = {}
        self._index = {}
        self._calls = []
        self._module_calls = {}
        self._recompute = RecomputeIndex(self._calls)
        self._grad_finite = {} if self._batch is None else self._batch.grad_finite

    def _end_step(self, now: float, cut: bool = False) -> None:
        seg = self._seg
        seg.training = training = self._steps.end(cut)
        if self._recording:
            self._rows.setdefault("calls", []).extend(
                backward_rows(self._calls, self._step, self._segment, self._v0)
            )
            if training:
                self.steps_recorded += 1
            else:
                self.evals_recorded += 1
        self._rows.setdefault("steps", []).append(
            (
                self._step,
                self._segment,
                int(StepKind.TRAIN if training else StepKind.EVAL),
                self._step_start - self._v0,
                now - self._v0,
                len(self._calls),
                self._steps.optimizer_steps,
                int(self._steps.saw_backward),
                int(self._recording),
            )
        )
        self._memo = {}  # drop references to this step's tensors now, not at the next step
        if self._batch is not None:
            self._batch.launch()
            self._inflight.append(self._batch)
            self._batch = None
        self._handoff()  # a finished step is on its way to disk at once
        if self._segment == 0:
            self._check_globs()

    def _read_batches(self, wait: bool) -> None:
        """Complete the steps whose device statistics have reached the host: rows to the
        writer, NaN/inf checks replayed in order (their alerts acted on by the hook)."""
        while self._inflight and (wait or self._inflight[0].ready()):
            batch = self._inflight.popleft()
            batch.read()
            self._rows.setdefault("tensors", []).extend(batch.finished_rows())
            self.detector.new_step()
            for check, args in batch.checks:
                check(*args)

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
        self._pending_capture = 0
        if self._rows and self._writer is not None:
            rows, self._rows = self._rows, {}
            self._writer.submit(rows)

    def _now(self) -> float:
        """Wall-clock time of an alert: comparable across the ranks of a distributed run."""
        return time.time()

    def _on_new_module(self, info: ModuleInfo, obj: object) -> None:
        self._rows.setdefault("modules", []).append(info.row())
        if info.kind == ModuleKind.MODULE and (compiled_model(obj) or compiled_in_place(obj)):
            self._rows.setdefault("info", []).append((time.time(), "compiled", info.name))
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

    def _internal_error(self) -> None:
        """A bug in hookdbg must never break training: stop recording, say so, go on."""
        self._live = False
        print("hookdbg: internal error, recording stopped (training continues):", file=sys.stderr)
        traceback.print_exc(file=sys.stderr)


def _on_device(module: torch.nn.Module) -> bool:
    """Whether a model computes on an accelerator (judged by its first parameter)."""
    for p in module.parameters():
        return not p.is_cpu
    return False
