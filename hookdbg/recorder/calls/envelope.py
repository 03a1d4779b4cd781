"""What every recorder hook is wrapped in, stated once, and what all hooks share."""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import traceback
from collections.abc import Callable
from time import perf_counter
from types import CodeType
from typing import TYPE_CHECKING, Any, TypeVar

from torch.compiler import is_compiling

if TYPE_CHECKING:
    from hookdbg.recorder.alerts.alert import Alert
    from hookdbg.recorder.alerts.headroom import HeadroomWarning

R = TypeVar("R")


class Guard:
    """The state every hook reads first: whether recording is live, the lock the writer
    also takes to collect the rows, hookdbg's own time so far (module timings leave it
    out), and the NaN/inf origins found but not yet acted on. A recording on the C path
    has its twin, ``_hot.Guard`` (hookdbg/recorder/accelerated.py), for C to read."""

    __slots__ = ("actions", "alerts", "live", "lock", "overhead", "stopped")

    def __init__(self) -> None:
        self.live = False
        self.lock = threading.RLock()
        self.overhead = 0.0  # seconds spent inside hookdbg's hooks so far
        self.alerts: list[Alert | HeadroomWarning] = []
        # what acts on the alerts (set by the recorder: recorder/alerts/actions.py)
        self.actions: Callable[[], None] = lambda: None
        # what a stop says and records (set by the recorder: Recorder._stopped)
        self.stopped: Callable[[], None] | None = None

    def act(self) -> None:
        """Act on the alerts (a warning, the flight recorder's tensors, a debugger
        prompt; ``--on-nan raise`` raises into the script from here), the time it takes
        counted as hookdbg's, which module and step times leave out."""
        t0 = perf_counter()
        try:
            self.actions()
        finally:
            self.overhead += perf_counter() - t0

    def broken(self) -> None:
        """A bug in hookdbg must never break training: stop recording, say so, go on
        (``stopped`` runs while the exception is being handled)."""
        self.live = False
        if self.stopped is not None:
            self.stopped()
            return
        print("hookdbg: internal error, recording stopped (training continues):", file=sys.stderr)
        traceback.print_exc(file=sys.stderr)


def hook(body: Callable[..., R]) -> Callable[..., R | None]:
    """Wrap a recorder hook ``body(self, t0, *args)`` (``self.guard`` is its Guard) so that:

    * the time it takes counts as hookdbg's overhead, which module timings leave out
      (``t0`` is when the hook was entered);
    * a bug in hookdbg stops the recording (with a message) instead of the training;
    * the body runs under the guard's lock, which the writer thread also takes to
      collect the rows the hooks gathered;
    * the NaN/inf origins the body found are acted on after that guard, so that
      ``--on-nan raise`` can raise into the training code;
    * the hook returns what the body returns, None where it did not run or failed
      (a module's or tensor's hook body returns None: hookdbg never changes what a
      module or tensor passes on);
    * while torch.compile traces a model it does nothing at all, first thing, so that
      dynamo traces nothing of hookdbg into the graph: the compiled code is what it
      would be without hookdbg (see recorder/hooks/compiled.py).
    """

    return _guarded(body, compiling=True)


def inner_hook(body: Callable[..., R]) -> Callable[..., R | None]:
    """``hook`` for a body reached only from an entry that has already returned while
    torch.compile traces (the module hooks check that before their mute counter): the
    same guard, without checking again on every module call."""
    return _guarded(body, compiling=False)


def _guarded(body: Callable[..., R], compiling: bool) -> Callable[..., R | None]:
    @functools.wraps(body)
    def guarded(self: Any, *args: Any) -> R | None:
        if compiling and is_compiling():
            return None
        t0 = perf_counter()
        guard = self.guard
        if not guard.live:
            return None
        result = None
        with guard.lock:
            try:
                result = body(self, t0, *args)
            except Exception:
                guard.broken()
            finally:
                guard.overhead += perf_counter() - t0
        if guard.alerts:
            guard.act()
        return result

    return guarded


def run_eagerly(code: CodeType) -> None:
    """Tell torch.compile never to compile a frame of ``code``, nor the frames it calls, as
    frames of their own: it would compile a hook into a trivial graph guarded on the grad
    mode, recompiling as the mode changes (inlined into a model's graph, a hook already
    returns at once). Uses dynamo's C entry point, loaded with torch, rather than
    torch._dynamo, which takes seconds to import; without it (another torch), nothing
    changes but those recompiles."""
    try:
        from torch._C._dynamo import eval_frame
    except ImportError:
        return
    action = getattr(eval_frame, "_FrameAction", None)
    strategy = getattr(eval_frame, "_FrameExecStrategy", None)
    if action is None or strategy is None:
        return
    with contextlib.suppress(Exception):
        eval_frame.set_code_exec_strategy(code, strategy(action.SKIP, action.SKIP))


# every hook shares this code (compiled, by mypyc, a hook has none: no frame to skip)
_shared = getattr(hook(lambda self, t0: None), "__code__", None)
if _shared is not None:
    run_eagerly(_shared)
