"""SIGTERM and SIGHUP while recording: close the recording, then end as without hookdbg.

Schedulers (SLURM, Kubernetes, ``timeout``) send SIGTERM before they kill. Where the
script has no handler of its own, the process would die at once and the recording would
be cut short; hookdbg closes it properly first (status ``terminated``), then lets the
signal do what it would have done (the process dies by it: same exit status). A handler
the script installed before recording started is called instead and decides; one it
installs later replaces hookdbg's, as it would replace the default.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class TerminationSignals:
    """Installs the handlers (from the main thread only); ``remove`` puts back the old."""

    def __init__(self, close: Callable[[signal.Signals], None]) -> None:
        self._close = close
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for sig in SIGNALS:
            previous = signal.getsignal(sig)
            if previous in (signal.SIG_IGN, None):
                continue  # ignored on purpose, or set outside Python: leave it
            self._previous[sig] = previous
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)  # the script's own handler decides what happens
            return
        self.remove()
        self._close(signal.Signals(signum))
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # die by the signal, as without hookdbg

    def remove(self) -> None:
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, previous)
        self._previous = {}
