"""What every recorder hook is wrapped in, stated once."""

from __future__ import annotations

import functools
from collections.abc import Callable
from time import perf_counter
from typing import Any

from torch.compiler import is_compiling


def hook(body: Callable[..., None]) -> Callable[..., None]:
    """Wrap a recorder hook ``body(self, t0, *args)`` so that:

    * the time it takes counts as hookdbg's overhead, which module timings leave out
      (``t0`` is when the hook was entered);
    * a bug in hookdbg stops the recording (with a message) instead of the training;
    * the body runs under the recorder's lock, which the writer thread also takes to
      collect the rows the hooks gathered;
    * the NaN/inf origins the body found are acted on after that guard, so that
      ``--on-nan raise`` can raise into the training code;
    * the hook returns None: hookdbg never changes what a module or tensor passes on;
    * while torch.compile traces a model it does nothing at all, first thing, so that
      dynamo traces nothing of hookdbg into the graph: the compiled code is what it
      would be without hookdbg (see recorder/compiled.py).
    """

    @functools.wraps(body)
    def guarded(self: Any, *args: Any) -> None:
        if is_compiling():
            return
        t0 = perf_counter()
        if not self._live:
            return
        with self._lock:  # the writer takes the rows under it
            try:
                body(self, t0, *args)
            except Exception:
                self._internal_error()
            finally:
                self._ovh += perf_counter() - t0
        if self._alerts:
            self._act()

    return guarded
