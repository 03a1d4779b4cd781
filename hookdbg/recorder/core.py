"""The recorder: PyTorch's global hooks in, rows for the background writer out.

Hooks installed (all owned by one ``HookSet`` and removed together):

* global forward pre-hook and forward hook (modulehooks.py), run on every module call:
  names, segments (steps, eval batches) at root calls, timing, inputs (positional ones
  *before* forward runs: in-place ops would change them after), keyword inputs and
  outputs;
* a pre-hook on the autograd node of each new tensor that needs a gradient
  (gradients.py): one gradient summary serves every call that produced or consumed the
  tensor. (A global full backward hook would be simpler but crashes on in-place ReLU,
  see docs/design.md);
* a post-accumulate-grad hook on each parameter of a recorded module (gradients.py);
* global optimizer step pre/post hooks (optimizer.py): step boundaries, parameter values;
* a wrapper around models compiled in place (compiled.py), around torch.distributed's
  reductions and gathers (collectives.py), and SIGTERM/SIGHUP handlers (signals.py).

``Recorder`` is the lifecycle: it makes what the hooks share, opens the file, installs
the hooks, and at the end removes them, writes what is pending and closes the file.
Everything else is a part it owns and hands the shared pieces to: the ``Guard`` every
hook reads first (envelope.py), the ``Rows`` for the writer (store/rows.py) and their
hand-over (handoff.py), the module hooks, the segments' beginnings and ends
(segments.py, with steps.py deciding them), the tensor observer (observe.py), the
optimizer observer, what an alert does (actions.py), names (naming.py), NaN/inf origins
(nonfinite.py), full tensors (capture.py) and the file (store/writer.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import json
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from time import perf_counter

from torch.nn.modules import module as module_hooks
from torch.optim import optimizer as optimizer_hooks

from hookdbg.control import ANSWER, CHANNEL, REFUSED, Command, control_path
from hookdbg.options import ModuleFilter, OptionError, RecordOptions, StepRange
from hookdbg.ranks import placement
from hookdbg.recorder import accelerated
from hookdbg.recorder.alerts.actions import Actions, NonFiniteStop
from hookdbg.recorder.alerts.alert import Alert
from hookdbg.recorder.alerts.capture import Capturer, FlightRecorder
from hookdbg.recorder.alerts.headroom import HeadroomWatch
from hookdbg.recorder.alerts.nonfinite import OriginDetector, nonfinite_weights
from hookdbg.recorder.alerts.pinpoint import Pinpointer
from hookdbg.recorder.alerts.sentinel import ZOOM, Sentinel
from hookdbg.recorder.calls.calls import StepState
from hookdbg.recorder.calls.handoff import Handoff
from hookdbg.recorder.calls.naming import ModuleInfo, ModuleRegistry, compiled_model
from hookdbg.recorder.hooks.backward import BackwardWatch
from hookdbg.recorder.hooks.collectives import CollectiveWatch
from hookdbg.recorder.hooks.compiled import InPlaceCompiled, compiled_in_place
from hookdbg.recorder.hooks.elsewhere import Elsewhere, unrecorded_processes, unrecorded_threads
from hookdbg.recorder.hooks.gradscaler import ScalerWatch
from hookdbg.recorder.hooks.hookset import HookSet
from hookdbg.recorder.hooks.optimizer import OptimizerObserver
from hookdbg.recorder.hooks.recursion import RecursionRoom
from hookdbg.recorder.hooks.shared import Shared
from hookdbg.recorder.signals import TerminationSignals
from hookdbg.recorder.steps.inbox import Refused
from hookdbg.recorder.steps.meta import run_metadata
from hookdbg.recorder.steps.segments import Segments
from hookdbg.recorder.steps.steering import AnswerEcho, Plan, Steering
from hookdbg.recorder.steps.steps import StepTracker
from hookdbg.recorder.summaries.histograms import writer_layout
from hookdbg.store import owner, schema
from hookdbg.store.rows import Rows
from hookdbg.store.schema import ModuleKind
from hookdbg.store.writer import Writer, WriterError
from hookdbg.text import plural, printable_lines

_active: Recorder | None = None  # the recording of this process, from its start
_starting = threading.Lock()  # claiming ``_active``: one start at a time
_HOOKDBG_DIR = str(Path(__file__).resolve().parent.parent)
_COMPILE_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"


def status_prefix() -> str:
    """'hookdbg: ', or 'hookdbg[rank 1]: ' as one of several torch.distributed ranks."""
    return placement().prefix


class RecordError(Exception):
    """A recording cannot start; the message is one line meant for the user."""


def _where(exc: BaseException) -> str:
    """The innermost frame of hookdbg's in a traceback: ``recorder/summaries/stats.py:197``."""
    found = "?"
    tb = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename.startswith(_HOOKDBG_DIR):
            found = f"{os.path.relpath(filename, _HOOKDBG_DIR)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


def _owned_by(lock: object) -> Callable[[], bool]:
    """Whether this thread holds ``lock`` (a hook of hookdbg's is running): threading's
    RLock and the C path's Lock both say it."""
    return lock._is_owned  # type: ignore[attr-defined, no-any-return]


def _disable_after_fork() -> None:
    """DataLoader workers fork with the hooks installed: they must not record, and they
    tell the recording that they ran modules (recorder/hooks/elsewhere.py)."""
    if _active is not None:
        _active.guard.live = False
        if _active._elsewhere is not None:
            _active._elsewhere.in_child()


os.register_at_fork(after_in_child=_disable_after_fork)


def _check_writable(path: Path, force: bool) -> Path:
    """``path`` if a recording may be written there, else why not (RecordError)."""
    refused = owner.not_writable(path, force)
    if refused is not None:
        raise RecordError(refused)
    return path


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
        steerable: bool = True,
    ) -> None:
        self.options = options = options or RecordOptions()
        self.path = _check_writable(Path(path), force)
        self._argv = list(sys.argv if argv is None else argv)
        self._make_shared(options, defer_cpu)
        self._make_segments(options, steerable, defer_cpu)
        self._writer: Writer | None = None
        self._elsewhere: Elsewhere | None = None  # forked children's word (from start)
        self._backward: BackwardWatch | None = None  # set by start
        self._room: RecursionRoom | None = None  # set by start
        self._signals: TerminationSignals | None = None  # set by start
        self.failure: str | None = None  # why recording stopped while the script went on
        self.guard.stopped = self._stopped
        self._closed = False
        self._started = False
        self._froze = False
        self._warning_filter: tuple | None = None
        self.thread = ""  # the name of the thread it records (set by start)

    def _make_shared(self, options: RecordOptions, defer_cpu: bool) -> None:
        """The pieces every hook shares (``Shared``): the guard, the rows, names, steps,
        NaN/inf origins and what an alert does."""
        # the per-call path, C where it is built and its names are there (accelerated.py)
        self._per_call = accelerated.chosen()
        self.guard = guard = self._per_call.guard()
        self.rows = rows = Rows(schema.tables(options.histograms))
        self.detector = detector = OriginDetector()
        detector.watch_loss = options.sentinel
        self._steps = steps = StepTracker()
        self._hooks = HookSet()
        self._registry = registry = ModuleRegistry(options.modules.selects, self._on_new_module)
        checks = options.checks_nan
        flight = (
            FlightRecorder(options.flight_budget) if (options.flight_budget and checks) else None
        )
        self._capturer = Capturer(options, self.warn) if options.capture else None
        self._handoff = handoff = Handoff(rows, min(0.5, options.flush_interval / 2))
        pinpoint = (
            Pinpointer(_owned_by(guard.lock), self._paused, self.report, self.warn, self._note)
            if options.sentinel
            else None
        )
        self.actions = Actions(
            guard,
            rows,
            detector,
            options.on_nan,
            self.warn,
            self.report,
            handoff,
            flight,
            self.path,
            pinpoint,
            options.on_headroom,
        )
        headroom = HeadroomWatch(options.headroom) if checks else None
        sentinel = (
            Sentinel(detector, self.actions.alert, partial(nonfinite_weights, registry))
            if options.sentinel
            else None
        )
        if sentinel is not None:
            sentinel.defer_all = defer_cpu
        self._shared = Shared(
            options,
            guard,
            rows,
            handoff,
            registry,
            steps,
            detector,
            flight,
            self.warn,
            pinpoint,
            headroom,
            sentinel,
        )
        if options.on_nan == "record":
            self.actions.zoom = self._zoom

    def _make_segments(self, options: RecordOptions, steerable: bool, defer_cpu: bool) -> None:
        """The tensor observer, the segments and the module hooks, and what steering
        (hookdbg ctl) may change of them."""
        shared, per_call, guard = self._shared, self._per_call, self.guard
        rows, handoff, registry = self.rows, self._handoff, self._registry
        self.observer = observer = per_call.observer(shared, self._capturer, self.actions.alert)
        observer.defer_all = defer_cpu
        # the segments (training steps and eval batches: recorder/steps/steps.py)
        self._segments = segments = Segments(shared, observer, defer_cpu)
        # what each step records, as launched and as steered since (hookdbg ctl)
        self.steering = Steering(options, control_path(self.path) if steerable else None)
        self._echo = AnswerEcho(self.warn)  # the answers said on stderr
        self._dumped = -1  # the last call whose flight recorder tensors ctl dump wrote
        # the step and words of a finding whose next steps go at stats (``_zoom``)
        self._zoom_after: tuple[int, str] | None = None
        self._plan = Plan(True, options.level, options.modules, options.capture)
        segments.plan = self._plan_step
        segments.boundary = self._boundary
        self._call_ids = itertools.count()
        segments.backward_rows = per_call.backward_rows
        self._calls = per_call.hooks(
            guard, registry, observer, segments, rows, handoff, self._call_ids
        )
        segments.hooks = self._calls
        self._calls.sentinel = shared.sentinel

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> Recorder:
        """Create the file and install the hooks: from here on this thread's module
        calls are recorded. One recording at a time per process (torch's hooks are
        global): a second ``start``, on any thread, is refused at once."""
        global _active
        with _starting:
            if self._started:
                raise RecordError(
                    f"this recorder already recorded to {self.path}; make a new one for "
                    "another recording (hookdbg.record(...))"
                )
            if _active is not None:
                raise RecordError(
                    "a hookdbg recording is already running in this process (to "
                    f"{_active.path}, started on thread {_active.thread!r}); it records "
                    "that thread only: record another in a process of its own"
                )
            self.thread = threading.current_thread().name
            _active = self
            self._started = True
        try:
            self._start()
        except BaseException as exc:
            if self._writer is None:  # nothing made: the process may record again
                with _starting:
                    _active = None
            else:
                self.close("exception", 1, f"{type(exc).__name__}: {exc}")
            raise
        return self

    def _start(self) -> None:
        self._open_writer()
        self.steering.listen(since=time.time())  # commands sent from now on
        self._elsewhere = Elsewhere()
        origin = self._handoff.last = perf_counter()
        self._calls.start(origin)
        opt = OptimizerObserver(self._shared, self.observer, self._call_ids, origin, self._calls)
        self._install_global_hooks(opt)
        # Full garbage collections scan every tracked object, ~300,000 of them torch's
        # own; the flight recorder makes them come sooner (it keeps tensors alive for
        # two steps). Objects from before the recording are frozen out of those scans
        # (NumNet MLP: 417 -> 28 us of collection per step) and unfrozen at close.
        self._froze = gc.isenabled()
        if self._froze:
            gc.freeze()
        scaler = self._install_watches(origin)
        self._signals = TerminationSignals(self._terminated)  # kept until closed
        self._segments.start(origin, opt, scaler)
        # torch.compile(model) warns that global hooks fire for its wrapper too: they
        # are hookdbg's, which expects that (recorder/calls/naming.py), not the script's
        warnings.filterwarnings("ignore", message=_COMPILE_WARNING, category=UserWarning)
        self._warning_filter = warnings.filters[0]
        self.guard.live = True

    def _open_writer(self) -> None:
        """The file created with the run's metadata, and its writer thread started."""
        meta = run_metadata(self._argv, self.options)
        meta["per_call_path"] = self._per_call.name
        if self._per_call.why_not_c is not None:
            self.warn(self._per_call.why_not_c)
        try:
            self._writer = Writer(
                self.path,
                meta,
                flush_interval=self.options.flush_interval,
                max_backlog_bytes=self.options.max_backlog_bytes,
                keep_last=self.options.keep_last or None,
                warn=self.warn,
                pull=self._pull,
                **writer_layout(self.options.histograms),  # converters, tables
            )
        except WriterError as exc:
            raise RecordError(str(exc)) from None
        self._handoff.writer = self._writer

    def _install_global_hooks(self, opt: OptimizerObserver) -> None:
        """torch's global module and optimizer hooks, owned by the hook set."""
        calls, hooks = self._calls, self._hooks
        self._room = hooks.add(RecursionRoom)  # for the frame torch adds per nested call
        hooks.add_global(
            module_hooks,
            "_global_forward_pre_hooks",
            module_hooks.register_module_forward_pre_hook,
            calls.pre,
        )
        hooks.add_global(
            module_hooks,
            "_global_forward_hooks",
            module_hooks.register_module_forward_hook,
            calls.post,
            with_kwargs=True,
            always_call=True,
        )
        hooks.add_global(
            optimizer_hooks,
            "_global_optimizer_pre_hooks",
            optimizer_hooks.register_optimizer_step_pre_hook,
            opt.pre,
        )
        hooks.add_global(
            optimizer_hooks,
            "_global_optimizer_post_hooks",
            optimizer_hooks.register_optimizer_step_post_hook,
            opt.post,
        )

    def _install_watches(self, origin: float) -> ScalerWatch:
        """The wrappers around what global hooks do not see: models compiled in place,
        torch.distributed's collectives, GradScaler and backward passes."""
        calls, hooks = self._calls, self._hooks
        hooks.add(InPlaceCompiled, calls.pre, calls.post)
        hooks.add(CollectiveWatch, self.guard, calls, self.observer)  # other ranks' values
        scaler = hooks.add(
            ScalerWatch,
            self.guard,
            self.observer,
            self._steps,
            self.actions.release,
            self.warn,
            calls.on_other_thread,
        )
        self._backward = hooks.add(BackwardWatch, calls, self._call_ids, origin, scaler)
        self._backward.going_on = self._pass_begins
        return scaler

    @contextlib.contextmanager
    def _paused(self) -> Iterator[None]:
        """hookdbg's hooks do nothing meanwhile (an origin run again: pinpoint.py)."""
        guard = self.guard
        live, guard.live = guard.live, False
        try:
            yield
        finally:
            guard.live = live and not self._closed

    def _note(self, key: str, value: str) -> None:
        """An info row: a fact learned during the run."""
        with self.guard.lock:
            self.rows.info.append((time.time(), key, value[: schema.MESSAGE_BYTES]))

    def close(self, status: str = "complete", exit_code: int = 0, message: str = "") -> None:
        """Remove every hook, write what is pending and the end row, close the file. A
        recording an internal error stopped ends with status ``failed``, saying why and
        what ran unrecorded after it, whatever ``status`` the script ended with."""
        signals = self._signals
        if signals is not None:  # SIGTERM from here on waits for the end row
            signals.hold()
        if self._closed:
            return
        self._closed = True
        try:
            self._close(status, exit_code, message)
        finally:
            if signals is not None:
                signals.release()  # a signal that came meanwhile ends the process now

    def _close(self, status: str, exit_code: int, message: str) -> None:
        global _active
        guard = self.guard
        if guard.live:  # removed since the last check: the file must not say complete
            with guard.lock:
                try:
                    self._unhooked()
                except Exception:
                    guard.broken()
        guard.live = False
        if self.actions.pinpoint is not None:
            with contextlib.suppress(Exception):
                self.actions.pinpoint.stop()
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
            try:
                with guard.lock:
                    self._finish_segments(status)
                    self._say_unrecorded()
                    self._say_steering(final=True)
                    try:
                        self._handoff()
                    except Exception:
                        guard.broken()
            finally:  # the file gets its end row whatever failed above
                arrived = self._signals.arrived if self._signals is not None else None
                if arrived is not None:  # torchrun ending a rank whose collective failed
                    message += f"{'; ' if message else ''}then {arrived.name} while it closed"
                if self.failure is not None:
                    status, message = "failed", self._failed_message(status, message)
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

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Write what was recorded so far into the file now and wait for it: for a reader
        in another process, or to time steps apart from the writer's later work. A step's
        backward timings (and its tensors' statistics, when they wait for a device) come
        when the next step begins. False on timeout, after the close, or once writing
        failed."""
        if self._writer is None or self._closed:
            return False
        lock = self.guard.lock  # here, not by the writer's pull: it gives up on a held lock
        if not lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            return False
        try:
            self._handoff()
        finally:
            lock.release()
        return self._writer.flush(timeout)

    # -- steering (recorder/steps/steering.py, hookdbg ctl) ---------------------------

    def record_next(
        self,
        steps: int,
        *,
        level: str | None = None,
        modules: str | list[str] | None = None,
        capture: str | list[str] | None = None,
    ) -> None:
        """Record the next ``steps`` steps, from the next one this process begins: at
        ``level`` (default: the recording's), of ``modules`` (globs), copying the full
        tensors of ``capture`` (globs). What ``hookdbg ctl FILE record`` asks."""
        self._submit("record", steps=steps, level=level, modules=modules, capture=capture)

    def set_level(self, level: str) -> None:
        """Record every step at ``level`` (timing, shapes, stats) from the next step on,
        or none (``idle``: the loss still watched). What ``hookdbg ctl FILE level`` asks."""
        self._submit("level", level=level)

    def _zoom(self, alert: Alert) -> None:
        """--on-nan record: the sentinel saw a NaN/inf where module calls were not
        checked, so the next steps are recorded at stats, where a NaN that comes again
        has its origin named (``_zoom_in``, as the next segment begins: never inside the
        step that found it, whose calls before it were not recorded)."""
        if self._zoom_after is None:  # what it found, in the words said then
            self._zoom_after = (alert.step, f"{alert.kind} {alert.segment.when} in {alert.where}")

    def _zoom_in(self, step: int) -> None:
        """At the beginning of ``step``: record it and the next at stats, as asked by
        the sentinel's finding. Said on stderr and in the recording (``zoom``)."""
        found, self._zoom_after = self._zoom_after, None
        if found is None:
            return
        seen, what = found
        steps = self.options.zoom
        command = Command(seq=0, op="record", steps=steps, level="stats", first=seen + 1)
        text = self.steering.apply(command, step)
        window = next(
            (w for w in self.steering.windows if w.first > seen and w.stop - w.first == steps),
            None,
        )
        fact: dict[str, object] = {"seen": seen, "found": what}
        if window is not None:
            fact.update(first=window.first, last=window.stop - 1)
        if text.startswith(REFUSED):
            line = f"not recording at stats after the {what}: {text.removeprefix(REFUSED)}"
        else:
            line = f"{text} to find where the {what} was born (--on-nan record)"
            weights = nonfinite_weights(self._registry)
            if weights:
                line += (
                    f"; since it was found, {plural(len(weights), 'weight')} came to hold "
                    f"NaN/inf (as {weights[0]}): what these steps find may spread from them"
                )
        self.warn(line)
        self._note(ZOOM, json.dumps({**fact, "text": line}))

    def _submit(self, op: str, **fields: object) -> None:
        if self._closed:
            raise RecordError(f"the recording to {self.path} has ended: there is nothing to steer")
        try:
            self.steering.submit(op, **fields)
        except OptionError as exc:
            raise exc.as_keywords() from None
        except TypeError as exc:  # a glob that is not text (modules=5)
            raise RecordError(f"modules and capture take globs (text): {exc}") from None

    # -- at step boundaries, never per call -------------------------------------------

    def _boundary(self, step: int) -> bool:
        """As a segment begins (of ``step``), on the thread that records: the recursion
        limit follows one the script set, the hooks are checked, steering commands are
        applied. True if the recording stopped."""
        if self._room is not None:
            self._room.follow()
        if self._unhooked(f"before step {step}"):
            return True
        return self._steer(step)

    def _pass_begins(self) -> bool:
        """As a backward pass begins, on the thread that records: the checks of
        ``_boundary`` where no module call may begin a segment (without the forward
        pre-hook none does). False: the recording stopped, the pass goes unrecorded;
        the segment open then ends now, not when the script does."""
        if self._room is not None:
            self._room.follow()
        if not self._unhooked():
            return True
        segments = self._segments
        if segments.open:
            segments.end(perf_counter() - self.guard.overhead, cut=True)
        return False

    def _unhooked(self, at: str | None = None) -> bool:
        """Whether a hook hookdbg put in torch's global registries is gone: the script,
        or a library it uses, emptied one (``_global_forward_hooks.clear()``). Without
        its forward pre-hook or forward hook, calls go unrecorded or never end (the
        stack of open calls growing with every call), so the recording stops, training
        goes on. A membership test per registry, asked at each segment's beginning and
        backward pass and on the writer's timer, never per call."""
        missing = self._hooks.missing()
        if not missing:
            return False
        if self.failure is None:
            if at is None:
                state = self._segments.state
                at = state.seg.when if state.id >= 0 else "before the first step"
            self._stop(
                f"{at}: hookdbg's hooks were removed from {' and '.join(missing)} "
                "(the script or a library it uses cleared them)"
            )
            self.report(
                f"{self.failure}; the recording stops here (status failed), training goes "
                "on unrecorded"
            )
        return True

    def _steer(self, step: int) -> bool:
        """At a step boundary (``step`` begins): apply the commands that arrived, answer
        each in the recording (one flight recorder dump however many asked for it).
        True if one stopped the recording."""
        steering = self.steering
        self._zoom_in(step)
        dumped = ""
        for command in steering.commands(time.monotonic()):
            if isinstance(command, Refused):
                what = f"command {command.seq}"
                self._answer(command.seq, command.sent, what, REFUSED + command.why)
                continue
            if command.op == "dump":
                text = dumped = dumped or self._dump_flight()
            else:
                text = steering.apply(command, step)
            if text and command.op == "record" and not text.startswith(REFUSED):
                text += self._unmatched(command)
            if text:
                self._answer(command.seq, command.sent, command.describe(), text)
            if steering.stop is not None and step >= steering.stop[0]:
                break  # the recording closes now: later lines are for no one
        self._say_steering()
        if steering.stop is not None and step >= steering.stop[0]:
            for command in steering.stop[1]:
                self._answer(
                    command.seq,
                    command.sent,
                    command.describe(),
                    f"stopped at step {step}: training goes on unrecorded",
                )
            self._say_steering()
            self.close("detached", 0, f"stopped by hookdbg ctl before step {step}")
            return True
        return False

    def _say_steering(self, final: bool = False) -> None:
        """What the control file itself called for (refused, bad lines), in the file
        and on stderr; and the count of answers a flood kept off stderr."""
        now = time.monotonic()
        for problem in self.steering.problems(now, final):
            self.rows.info.append((time.time(), CHANNEL, problem[: schema.MESSAGE_BYTES]))
            self.warn(problem)
        self._echo.flush(now, final)

    def _unmatched(self, command: Command) -> str:
        """A warning for a ``record --modules`` glob that matches no module seen so far
        (almost always a typo: the window would record nothing)."""
        if not command.modules:
            return ""
        seen = self._registry.module_names()
        globs = ModuleFilter.parse(list(command.modules)).unmatched(seen) if seen else []
        if not globs:
            return ""
        examples = ", ".join(repr(n) for n, _ in seen[1:3])
        return (
            f"; --modules {', '.join(map(repr, globs))} matched none of the {len(seen)} "
            f"modules (names look like {examples})"
        )

    def _answer(self, seq: int, sent: float | None, what: str, text: str) -> None:
        """What command ``seq`` (sent at ``sent``) did: in the file (``ctl`` reads it
        back) and on stderr (there, in a flood, a count instead)."""
        number = f"{seq}" if sent is None else f"{seq} {sent!r}"
        value = f"{number}: {text}"[: schema.MESSAGE_BYTES]
        self.rows.info.append((time.time(), ANSWER, value))
        self._echo(f"{what}: {text}")

    def _dump_flight(self) -> str:
        flight = self.actions.flight
        if flight is None:
            return "no flight recorder (it needs NaN checks and --flight-recorder above 0)"
        rows, stale = flight.dump_all(after=self._dumped)
        self.rows.captures.extend(rows)
        if not rows and self._dumped >= 0 and flight.held:
            return "the flight recorder holds nothing new since the dump before (written then)"
        if not rows:
            return "the flight recorder holds no tensors (it keeps those of recorded steps)"
        self._dumped = max(row[2] for row in rows)  # the last call whose tensors are written
        steps = sorted({r[0] for r in rows})
        span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
        left = f"; {plural(stale, 'tensor')} changed in place since, left out" if stale else ""
        return f"wrote the flight recorder's {plural(len(rows), 'tensor')} ({span}){left}"

    def _plan_step(self, step: int) -> bool:
        """Whether ``step`` is recorded; the level, modules and captures its plan asks
        are set up for it (only when they change)."""
        plan = self.steering.plan(step)
        if plan.recording and plan != self._plan:
            self._apply(plan)
        return plan.recording

    def _apply(self, plan: Plan) -> None:
        before, self._plan = self._plan, plan
        options = self.options
        if plan.level != before.level:
            self.observer.set_level(plan.level, options.nan_check, options.histograms)
        if plan.modules != before.modules:
            self._registry.reselect(plan.modules.selects)
            for info in self.modules:
                module = info.ref()
                if info.selected and module is not None:
                    self.observer.gradients.watch_params(info, module, self._hooks.add)
        if plan.capture != before.capture or plan.modules != before.modules:
            self._set_capture(plan.capture)

    def _set_capture(self, capture: ModuleFilter | None) -> None:
        """Copy the full tensors of the modules ``capture`` selects (None: none), in
        every step recorded, within the one --capture-budget of the recording."""
        if capture is not None and self._capturer is None:
            self._capturer = Capturer(dataclasses.replace(self.options, capture=capture), self.warn)
            self.observer.capturer = self._capturer
        capturer = self._capturer
        if capturer is None:
            return
        capturer.select = capture.selects if capture is not None else lambda name, path: False
        capturer.steps = StepRange()
        for info in self.modules:
            info.capture = info.selected and capturer.select(info.name, info.path)

    def _finish_segments(self, status: str) -> None:
        """End the last segment, read what is left on the device, act on the last
        alerts. A bug here says so and stops there: the file still gets what was
        gathered, and its end row."""
        guard = self.guard
        try:
            now = perf_counter() - guard.overhead
            segments = self._segments
            if segments.open:
                end = segments.last_end(now)
                segments.end(end, cut=end == now and status != "complete")
                trained = segments.trained_until
                if trained is not None and end < now:
                    # the script's work after its last training step (a final eval,
                    # checkpoints)
                    after = f"{now - trained:.6f}"
                    self.rows.info.append((time.time(), "after_training", after))
            segments.read_batches(wait=True)
            if self._shared.sentinel is not None:
                self._shared.sentinel.read()
            if guard.alerts:
                self.actions.act(actions=False)  # the script is over: nothing to stop
        except Exception:
            guard.broken()

    def _stopped(self) -> None:
        """An internal error stopped the recording (``Guard.broken``, while its exception
        is being handled): training goes on; say so with the traceback (to report it),
        keep why in the file at once (a reader of the live file sees it), and count from
        here what runs unrecorded."""
        exc = sys.exc_info()[1]
        if exc is None:
            return
        error = f"{type(exc).__name__}: {exc} ({_where(exc)})"
        if self.failure is not None:  # stopped already: the file keeps the first reason
            self.report(
                f"internal error after the recording stopped: {error}. Please report this "
                "with the traceback below:"
            )
            traceback.print_exc(file=sys.stderr)
            return
        state = self._segments.state
        at = state.seg.when if state.id >= 0 else "before the first step"
        self._stop(f"internal error {at}: {error}")
        self.report(
            f"{self.failure}; the recording stops here (status failed), training goes on "
            "unrecorded. Please report this with the traceback below:"
        )
        traceback.print_exc(file=sys.stderr)

    def _stop(self, failure: str) -> None:
        """Stop recording while the script goes on (status ``failed``): why, kept for
        the end row and in the file at once (a reader of the live file sees it), and
        from here a count of what runs unrecorded."""
        self.guard.live = False
        self.failure = failure
        self.rows.info.append((time.time(), "failed", failure[: schema.MESSAGE_BYTES]))
        if self._backward is not None:
            self._backward.counting = True

    def _failed_message(self, status: str, message: str) -> str:
        """The end row's message of a failed recording: why, what ran unrecorded after,
        and how the script ended if not normally."""
        assert self.failure is not None
        passes = self._backward.unrecorded if self._backward is not None else 0
        out = f"{self.failure}; {plural(passes, 'backward pass', 'backward passes')} ran after it"
        if status != "complete":
            out += f"; the script ended: {status}{f' ({message})' if message else ''}"
        return out

    def _say_unrecorded(self) -> None:
        """Name the work that ran unrecorded (other threads, forked children): in the
        file's facts and on stderr."""
        found = self._elsewhere
        if found is None:
            return
        self._elsewhere = None
        try:
            facts = {
                "other_threads": unrecorded_threads(self._calls.others, self.thread),
                "child_processes": unrecorded_processes(*found.children()),
            }
        finally:
            found.close()
        for key, text in facts.items():
            if text is not None:
                self.rows.info.append((time.time(), key, text))
                self.warn(text)

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
                if self.guard.live:  # where no step boundary or backward pass comes
                    self._unhooked()
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
    def state(self) -> StepState:
        """The current segment's (a training step or an eval batch: recorder/steps/steps.py)."""
        return self._segments.state

    @property
    def steps_recorded(self) -> int:
        """Training steps recorded so far."""
        return self._segments.steps_recorded

    @property
    def evals_recorded(self) -> int:
        """Eval batches recorded so far."""
        return self._segments.evals_recorded

    @property
    def calls_recorded(self) -> int:
        """Module calls recorded so far."""
        return self._calls.calls_recorded

    @property
    def unmatched_globs(self) -> list[str]:
        """The --modules globs that matched no module of the first step."""
        return self._segments.unmatched_globs

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
        """A status line on stderr; ``quiet`` hides it."""
        if not self.options.quiet:
            self.report(message)

    def report(self, message: str) -> None:
        """A line on stderr that ``quiet`` does not hide: what a NaN/inf origin says. It
        may name modules, whose names can hold anything (an ESC sequence): escaped, as
        every report writes them."""
        print(f"{status_prefix()}{printable_lines(message)}", file=sys.stderr, flush=True)

    def _on_new_module(self, info: ModuleInfo, obj: object) -> None:
        if info.kind == ModuleKind.OPTIMIZER:  # its row counts its own parameters
            self.observer.gradients.watch_own(info, obj, self._hooks.add)
        self.rows.modules.append(info.row())
        if info.kind == ModuleKind.MODULE and (compiled_model(obj) or compiled_in_place(obj)):
            self.rows.info.append((time.time(), "compiled", info.name))
            if self.actions.pinpoint is not None:
                self.actions.pinpoint.compiled = True
        if info.kind != ModuleKind.MODULE or not info.selected:
            return
        if self._capturer is not None:
            info.capture = self._capturer.select(info.name, info.path)
        self.observer.gradients.watch_params(info, obj, self._hooks.add)
