"""Collectives that bring other ranks' values into a module's forward.

A NaN that reaches a rank through a collective was not born there. hookdbg sees most of
them from the tensors: DDP's all-reduced gradients at the optimizer step
(optimizer.py), FSDP2's gathered weights (their local shard, nonfinite.py), and a
child's output that is a partial sum (a ``Partial`` DTensor, reduced after its hook:
observe.py). A module may also reduce or gather inside its own forward, where no hook
sees the partial values: torchtitan's row-parallel ``w2`` wraps its forward so that
the all-reduce runs inside it, sequence parallel gathers its input there. So while
recording, the reductions and gathers of ``torch.distributed`` and of its functional
collectives (which DTensor's redistribution calls) note the innermost recorded call
open when they run: what that call returns may hold another rank's values, and the
NaN/inf rules (nonfinite.py) say so instead of naming it an origin.

FSDP's own collectives gather weights and reduce gradients, which the weights' rule
already reads: they mark nothing. Neither does a collective in a backward pass (no
forward is open) or one compiled into a graph (the wrapper keeps out of Dynamo's way).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch.compiler import is_compiling

if TYPE_CHECKING:
    from hookdbg.recorder.calls.envelope import Guard
    from hookdbg.recorder.hooks.modulehooks import ModuleHooks
    from hookdbg.recorder.hooks.observe import TensorObserver

# the collectives that combine or gather values of several ranks, by where they live
_REDUCING = (
    "all_reduce",
    "all_reduce_coalesced",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "reduce_scatter_tensor_coalesced",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_tensor",
    "all_gather_single",
    "all_gather_into_tensor_coalesced",
    "all_to_all",
    "all_to_all_single",
)
_FSDP_DIR = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "distributed", "fsdp")
_graph_task_id = torch._C._current_graph_task_id


def _places() -> list[ModuleType]:
    """The modules the collectives are looked up in by the code that calls them."""
    if not torch.distributed.is_available():
        return []
    from torch.distributed import _functional_collectives, distributed_c10d

    return [torch.distributed, distributed_c10d, _functional_collectives]


class CollectiveWatch:
    """Wraps the collectives for the recording's duration; ``remove`` puts them back."""

    def __init__(self, guard: Guard, calls: ModuleHooks, observer: TensorObserver) -> None:
        self._guard = guard
        self._calls = calls
        self._observer = observer  # its segment's calls that received are noted there
        self._wrapped: list[tuple[ModuleType, str, Callable[..., Any], Callable[..., Any]]] = []
        for place in _places():
            for name in _REDUCING:
                original = place.__dict__.get(name)
                if callable(original):
                    wrapper = self._wrap(original)
                    setattr(place, name, wrapper)
                    self._wrapped.append((place, name, original, wrapper))

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        note = self._note

        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            if not is_compiling():
                note(sys._getframe(1))
            return original(*args, **kwargs)

        return collective

    def _note(self, caller: Any) -> None:
        """A collective is called from ``caller``: mark the forward it runs in."""
        if not self._guard.live or _graph_task_id() != -1:
            return
        calls = self._calls
        call = calls._open
        if (
            call is None
            or calls.on_other_thread()
            or caller.f_code.co_filename.startswith(_FSDP_DIR)
        ):
            return
        self._observer.state.seg.reduced.add(call.id)

    def remove(self) -> None:
        """Put back what was wrapped (unless something replaced it since)."""
        for place, name, original, wrapper in reversed(self._wrapped):
            if place.__dict__.get(name) is wrapper:
                setattr(place, name, original)
        self._wrapped = []
