"""Room under the recursion limit for the frames hookdbg adds to the script's stack.

While any global module hook is installed, torch's ``Module._call_impl`` runs each
call's forward inside a closure of its own (``inner``): one more frame for every level
of nested module calls (measured on Python 3.11: 4 units of the recursion limit per
level without hooks, 5 with them, on the C and the Python per-call path alike). The
runner adds its frames under the script, and the hooks theirs above the deepest call.
So a model nested as deep as the script's limit allows without hookdbg would hit
RecursionError with it.

While recording, the limit is raised by what hookdbg may add: a frame for each level
of nesting the script's limit leaves room for (a level takes at least 3 frames without
hooks: ``__call__``, ``_call_impl`` and ``forward``), and a fixed allowance for
hookdbg's own frames. A limit the script sets while recording (deep models set one at
their start) gets the same room at the next segment boundary or backward pass, before
the model runs again. At the end the script's limit is put back.

``sys.setrecursionlimit`` and ``sys.getrecursionlimit`` themselves are left alone:
torch.compile keys its own stand-in on the real ``getrecursionlimit``, and anything
imported before recording holds the real functions anyway.
"""

from __future__ import annotations

import contextlib
import sys
from types import CodeType, FrameType

from torch.nn import Module

FRAMES_PER_LEVEL = 3  # the fewest frames a nested module call takes without hooks
OWN_FRAMES = 100  # the runner's frames and a hook's at the deepest call, and to spare
_C_INT_MAX = 2**31 - 1  # the largest limit sys.setrecursionlimit takes
_CALL_IMPL: CodeType = Module._call_impl.__code__


def room(limit: int) -> int:
    """The recursion limit to record under, for a script whose own limit is ``limit``."""
    levels = -(-limit // FRAMES_PER_LEVEL)
    return min(limit + levels + OWN_FRAMES, _C_INT_MAX)


class RecursionRoom:
    """Raises the recursion limit while recording; ``remove`` puts back the script's.

    The limit stays raised if the recording ends inside a module call (``hookdbg ctl
    stop``): the script goes on with the frames hookdbg added still under it."""

    def __init__(self) -> None:
        self.limit = sys.getrecursionlimit()  # the script's own
        self.raised = room(self.limit)
        sys.setrecursionlimit(self.raised)

    def follow(self) -> None:
        """A limit the script set since gets the room too (one getrecursionlimit)."""
        now = sys.getrecursionlimit()
        if now != self.raised:
            self.limit = now
            self.raised = room(now)
            sys.setrecursionlimit(self.raised)

    def remove(self) -> None:
        if sys.getrecursionlimit() != self.raised:  # the script set its own since: kept
            return
        if _inside_module_call(sys._getframe(1)):
            return
        # closed deeper than the script's own limit allows: the frames under it need it
        with contextlib.suppress(RecursionError):
            sys.setrecursionlimit(self.limit)


def _inside_module_call(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code is _CALL_IMPL:
            return True
        frame = frame.f_back
    return False
