"""SIGTERM and SIGHUP while recording: close the recording, then end as without hookdbg.

Schedulers (SLURM, Kubernetes, ``timeout``) send SIGTERM before they kill, and so does
torchrun to the other ranks once one of them has failed. Where the script has no
handler of its own, the process would die at once and the recording would be cut
short; hookdbg closes it properly first (status ``terminated``), then lets the signal
do what it would have done (the process dies by it: same exit status). A handler the
script installed before recording started is called instead and decides; one it
installs later replaces hookdbg's, as it would replace the default.

The handlers stay until the recording is closed. A signal that arrives while it is
closing (torchrun's SIGTERM to a rank whose collective just failed because a peer
stopped or died) waits for the close to finish, is named in the end row if that is
not written yet, and then ends the process as it would have.
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
    """Installs the handlers (from the main thread only); ``hold`` as the recording
    begins to close, ``release`` once it is closed puts back the old ones (and ends the
    process by a signal that arrived in between)."""

    def __init__(self, close: Callable[[signal.Signals], None]) -> None:
        self._close = close
        self._previous: dict[int, Any] = {}
        self._holding = False
        self.arrived: signal.Signals | None = None  # while closing
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
        if self._holding:  # the recording is closing: it finishes, then the signal acts
            self.arrived = self.arrived or signal.Signals(signum)
            return
        self._close(signal.Signals(signum))  # holds, closes, releases: dies by it there
        self.arrived = self.arrived or signal.Signals(signum)
        self.release()

    def hold(self) -> None:
        """The recording begins to close: a signal from here on waits for ``release``."""
        self._holding = True

    def release(self) -> None:
        """The recording is closed: the old handlers back, and a signal that arrived
        while it closed ends the process now, by the signal, as without hookdbg."""
        self._holding = True  # a signal now would find the handler gone anyway
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, previous)
        self._previous = {}
        arrived, self.arrived = self.arrived, None
        if arrived is not None:
            signal.signal(arrived, signal.SIG_DFL)
            os.kill(os.getpid(), arrived)  # die by the signal, as without hookdbg

    def remove(self) -> None:
        """``release`` (the recorder's hook set removes everything it made)."""
        self.release()
