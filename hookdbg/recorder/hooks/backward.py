"""Backward passes: the loss each one starts from, and the time each one takes.

Most losses are computed by tensor code after the model (``F.cross_entropy``, a VAE's
KL term, a custom expression), where no module hook sees them; but every training loop
hands its loss to ``backward()``. So while recording, ``torch.autograd.backward`` and
``torch.autograd.grad`` are wrapped (``Tensor.backward``, a GradScaler's scaled loss,
Lightning's ``manual_backward`` and the Hugging Face Trainer all go through them), and
each *pass* a script starts (one not run inside another pass) is recorded:

* **its loss**: what the pass starts from, summarised into the ``losses`` table (on a
  device read back with the step's statistics, without waiting for it), divided by the
  scale where a GradScaler scaled it. Each place in the script that starts passes is a
  *loss site*, a modules row named after what it is called on (``loss``, ``errD``,
  ``loss_d``: read from the source line) whose type is the file and line;
* **a NaN/inf check** of that loss: non-finite while nothing non-finite was seen in
  the step so far (every module output was finite) is an origin, born in the loss
  computation after the model that ran last (recorder/alerts/nonfinite.py);
* **its time**: a backward call of the loss site, whose self time is what the pass spent
  outside recorded modules; the gradient hooks attribute the rest (recorder/hooks/timing.py).
  A pass run inside a module's forward or an optimizer step is left out of that call's
  or step's self time.

Passes are recorded on the thread that records, outside torch.compile's tracing;
others (a pass inside another pass's hooks, reentrant checkpointing's inner pass) go
through untouched.
"""

from __future__ import annotations

import functools
import linecache
import os
import re
import sys
import threading
import types
from collections.abc import Callable, Iterator
from time import perf_counter, time
from typing import TYPE_CHECKING, Any

import torch
from torch.compiler import is_compiling

from hookdbg.recorder.alerts.alert import checked
from hookdbg.recorder.alerts.nonfinite import nonfinite_weights
from hookdbg.recorder.calls.calls import Call, Segment
from hookdbg.recorder.calls.envelope import inner_hook, run_eagerly
from hookdbg.recorder.calls.labels import HOOKDBG_DIR, TORCH_DIR
from hookdbg.recorder.calls.naming import ModuleInfo, recordable
from hookdbg.recorder.calls.tensors import iter_tensors
from hookdbg.recorder.hooks.timing import NO_PASS, STARTED
from hookdbg.recorder.summaries import stats
from hookdbg.recorder.summaries.deferred import Pending, resolved
from hookdbg.store.schema import Phase

if TYPE_CHECKING:
    from hookdbg.recorder.hooks.gradscaler import ScalerWatch
    from hookdbg.recorder.hooks.modulehooks import ModuleHooks

_BWD = int(Phase.BWD)
_graph_task_id = torch._C._current_graph_task_id
_get_ident = threading.get_ident
_LIBRARIES = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")

# what a backward call is on, read from its source line, first match wins
_NAMES = [
    re.compile(p)
    for p in (
        r"scale\(\s*([A-Za-z_][\w.]*)",  # scaler.scale(loss).backward()
        r"([A-Za-z_][\w.]*)(?:\[[^\]]*\])?\s*\.backward\(",  # loss.backward()
        r"\(\s*([A-Za-z_][\w.]*)[^()]*\)\s*\.backward\(",  # (loss / accum).backward()
        r"backward\(\s*(?:tensors\s*=\s*)?\[?\s*([A-Za-z_][\w.]*)",  # manual_backward(errD)
        r"grad\(\s*(?:outputs\s*=\s*)?[\[(]?\s*([A-Za-z_][\w.]*)",  # autograd.grad(loss, ...)
    )
]


class LossSite:
    """A place in the script that starts backward passes (what its modules row names)."""

    __slots__ = ("__weakref__", "info")

    def __init__(self) -> None:
        self.info: ModuleInfo | None = None


class Pass:
    """One backward pass being recorded."""

    __slots__ = ("call", "index", "recording", "segment", "site", "start")

    def __init__(self, call: int, site: ModuleInfo, index: int, segment: int, recording: bool):
        self.call = call
        self.site = site
        self.index = index
        self.segment = segment
        self.recording = recording  # its step is recorded: its loss is checked too
        self.start = 0.0  # on the recorder's clock, once it runs


class BackwardWatch:
    """Wraps ``torch.autograd.backward`` and ``torch.autograd.grad`` while recording;
    ``remove`` puts them back."""

    def __init__(
        self,
        calls: ModuleHooks,
        call_ids: Iterator[int],
        origin: float,
        scaler: ScalerWatch | None,
    ) -> None:
        self.calls = calls
        self.observer = observer = calls.observer
        self.guard = observer.guard
        self.call_ids = call_ids
        self.origin = origin
        self.scaler = scaler
        # once an internal error stopped the recording: passes counted, not recorded
        self.counting = False
        # asked as each pass begins (set by the recorder): False, the recording stopped
        self.going_on: Callable[[], bool] = lambda: True
        self.unrecorded = 0
        self._sites: dict[tuple[types.CodeType, int] | None, LossSite] = {}
        self._originals: dict[str, Callable[..., Any]] = {
            "backward": torch.autograd.backward,
            "grad": torch.autograd.grad,
        }
        self._wrappers = {n: self._wrap(f) for n, f in self._originals.items()}
        for name, wrapper in self._wrappers.items():
            setattr(torch.autograd, name, wrapper)

    def remove(self) -> None:
        for name, original in self._originals.items():
            if getattr(torch.autograd, name) is self._wrappers[name]:
                setattr(torch.autograd, name, original)

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            run = watch.begin(args[0] if args else next(iter(kwargs.values()), None))
            if run is None:
                return original(*args, **kwargs)
            watch.started(run)
            try:
                return original(*args, **kwargs)
            finally:
                watch.end(run)

        run_eagerly(wrapper.__code__)
        return functools.wraps(original)(wrapper)

    # -- what the wrappers do, under the recorder's guard ------------------------------

    def begin(self, tensors: object) -> Pass | None:
        """A pass is about to start from ``tensors``: record its loss (and act on an
        alert it raises, which may stop the script here). None: not a pass to record
        (one on another thread, or inside another pass)."""
        if is_compiling() or _get_ident() != self.calls._tid or _graph_task_id() != -1:
            return None
        if not self.guard.live:
            if self.counting:
                self.unrecorded += 1
            return None
        return self._begin(tensors)

    @inner_hook
    def _begin(self, t0: float, tensors: object) -> Pass | None:
        if not self.going_on():
            self.unrecorded += 1  # the first pass the recording misses
            return None
        now = t0 - self.guard.overhead
        observer = self.observer
        losses = [t for _, t in iter_tensors(tensors)]
        if not self.calls.stack:  # not inside a module call: it may begin a step
            self.calls.segments.pass_call(now, losses[0] if losses else None)
        state = observer.state
        if state.id < 0:  # no segment has begun (a pass inside a call not recorded)
            return None
        site = self._site()
        index = state.index.get(site.id, 0)
        state.index[site.id] = index + 1
        run = Pass(next(self.call_ids), site, index, state.id, state.recording)
        for t in losses[:1]:  # backward([a, b]) is rare: its first tensor stands for it
            scaled = self.scaler.unscaled(t) if self.scaler is not None else None
            scale, divide = None, False
            if scaled is not None:  # GradScaler: the loss it scaled, or this one divided
                loss, factor = scaled
                scale, divide = _value(observer, factor), loss is None
                t = t if loss is None else loss
            value = _value(observer, t)
            if value is None:
                continue
            observer.check(
                self._loss_check,
                state.seg,
                run,
                value,
                scale,
                divide,
                state.calls,
                len(state.calls),
                observer.context(t),
            )
        return run

    def started(self, run: Pass) -> None:
        """The pass starts now: backward intervals are measured from here."""
        guard = self.guard
        with guard.lock:
            observer = self.observer
            observer.bwd_mark_task = STARTED
            observer.bwd_attributed = 0.0
            observer.bwd_current = observer.bwd_last = None
            clock = self.calls.device_clock
            if clock is not None:
                clock.pass_started()
            run.start = observer.bwd_mark = perf_counter() - guard.overhead

    @inner_hook
    def end(self, t0: float, run: Pass) -> None:
        """The pass returned (or raised): its time, as a call of its loss site."""
        now = t0 - self.guard.overhead
        observer = self.observer
        state = observer.state
        wall = now - run.start
        outside = max(wall - observer.bwd_attributed, 0.0)
        observer.bwd_mark_task = NO_PASS  # its last interval stays the pass's own
        clock = self.calls.device_clock
        if clock is not None:
            clock.pass_ended(run.call)
        if state.batch is not None:  # gradients are final: summarised before clipping,
            state.batch.summarise_held()  # a GradScaler's unscale_ or zero_grad change them
        sentinel = self.calls.sentinel
        if sentinel is not None and state.id == run.segment:  # the same, where not checked
            sentinel.backward_ended(observer.registry, state.seg)
        if state.recording and (state.batch is not None or clock is not None):
            # the earlier steps' statistics and times, read while the device runs this
            # pass's kernels (at the next step's first call, it would wait for the host)
            self.calls.segments.read_batches(wait=False)
        observer.bwd_current = observer.bwd_last = None
        opened = self.calls._open
        if opened is not None:  # a pass inside a module's forward: not its own time
            opened.child_time += wall
        else:
            self.calls.root_time += wall
        if state.id == run.segment:
            state.done = now
        if state.recording and state.id == run.segment:
            observer.rows.calls.append(
                (
                    run.call,
                    _BWD,
                    state.step,
                    state.id,
                    run.site.id,
                    run.index,
                    -1,
                    0,
                    run.start - self.origin,
                    wall,
                    outside,
                )
            )

    def _loss_check(
        self,
        seg: Segment,
        run: Pass,
        value: stats.Summary | Pending,
        scale: stats.Summary | Pending | None,
        divide: bool,
        calls: list[Call],
        ran: int,
        loss: object,
    ) -> None:
        """The losses row, and the loss's NaN/inf check (at once, or replayed in order
        with the step's other checks once a device's statistics are read). ``scale``: a
        GradScaler's, by which ``value`` is to be divided where ``divide`` (the loss it
        scaled is gone: only the scaled one is known)."""
        summary = checked(value)
        factor = resolved(scale) if scale is not None else None
        divisor = factor[stats.MAX] if factor is not None else float("nan")
        mean = summary[stats.MEAN]
        self.observer.rows.losses.append(
            (
                seg.step,
                seg.id,
                run.site.id,
                run.index,
                summary[stats.NUMEL],
                mean / divisor if divide and divisor else mean,
                *(max(int(n), 0) for n in summary[stats.COUNTS]),
                divisor,
            )
        )
        observer = self.observer
        detector = observer.detector
        finite = stats.is_finite(summary)
        bad_before, detector.loss_bad = detector.loss_bad, not finite
        if not (run.recording and observer.check_nan):  # its modules were not checked
            if finite or not detector.watch_loss or bad_before or detector.step_tainted:
                return  # the same problem, or one the sentinel found in this step
            weights = nonfinite_weights(observer.registry)
            observer.alert(detector.unrecorded_loss(run.site, summary, seg, weights, time()))
            return
        if not observer.check_nan or finite:
            return
        model = _model_before(calls, ran)
        alert = observer.detector.loss(run.site, summary, seg, model, time())
        module = model.info.ref() if model is not None else None
        observer.alert(alert, module=module, output=loss)

    def _site(self) -> ModuleInfo:
        """The loss site of the calling code: the first frame outside torch and hookdbg,
        preferring the script's own code to a library's (a trainer's ``loss.backward()``
        stands for the script's ``training_step`` only when no frame of the script is
        there)."""
        frame: types.FrameType | None = sys._getframe(1)
        first = unnamed = None  # (code without a file: ``python -c``, exec'd strings)
        while frame is not None:
            filename = frame.f_code.co_filename
            if not filename.startswith((TORCH_DIR, HOOKDBG_DIR)):
                if filename[:1] == "<":
                    unnamed = unnamed or frame
                else:
                    if first is None:
                        first = frame
                    if not any(lib in filename for lib in _LIBRARIES):
                        break
            frame = frame.f_back
        frame = frame or first or unnamed
        key = (frame.f_code, frame.f_lineno) if frame is not None else None
        site = self._sites.get(key)
        if site is None:  # one site per place, however often it runs
            site = LossSite()
            name, where = _describe(frame)
            source = ("", 0)
            if frame is not None and frame.f_code.co_filename[:1] != "<":
                source = recordable(frame.f_code.co_filename, frame.f_lineno)
            site.info = self.observer.registry.loss_site(site, name, where, source)
            self._sites[key] = site
        assert site.info is not None
        return site.info


def _value(observer: Any, t: torch.Tensor) -> stats.Summary | Pending | None:
    """A loss's statistics: at once on the CPU, with the step's on a device (None where
    reading them now would wait for the device: a step that is not recorded). Inside
    torch.func's transforms (``torch.func.grad(loss_fn)``), those of the values under
    the wrappers."""
    t = stats.local(t)  # a DTensor's own shard
    if not isinstance(t, torch.Tensor) or t.layout is not torch.strided or t.is_meta:
        return None
    state = observer.state
    if not (t.is_cpu or state.batch is not None or (state.recording and observer.check_nan)):
        return None  # on a device with nothing to read it with (--on-nan break and raise
        # wait for the device anyway)
    if not stats.transforms_active():
        return observer.value(t)
    with stats.outside_transforms():
        return observer.value(stats.physical(t))


def _model_before(calls: list[Call], ran: int) -> Call | None:
    """The last top-level call with parameters among the first ``ran`` of a step's calls
    (the model the loss was computed from), else the last top-level call."""
    last = None
    for i in range(ran - 1, -1, -1):
        call = calls[i]
        if call.parent is None:
            if call.info.has_params:
                return call
            last = last or call
    return last


def _describe(frame: types.FrameType | None) -> tuple[str, str]:
    """A loss site's name (what backward is called on, read from its source line) and
    where it is (``train.py:42``)."""
    if frame is None:
        return "loss", "unknown"
    code = frame.f_code
    line = linecache.getline(code.co_filename, frame.f_lineno)
    where = f"{os.path.basename(code.co_filename)}:{frame.f_lineno}"
    for pattern in _NAMES:
        match = pattern.search(line)
        if match:
            return match.group(1).rsplit(".", 1)[-1], where
    return "loss", where
