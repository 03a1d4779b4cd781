"""Stored full tensors (``record --capture``, the flight recorder) as ``hookdbg tensor``
looks them up: which modules hold some, the stored calls of one slot of a module, and
where a tensor's non-finite values are."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hookdbg.read.captures import Capture
from hookdbg.read.recording import Recording
from hookdbg.store.schema import Slot


@dataclass(frozen=True)
class NonFinite:
    """The NaN and inf values of a floating-point tensor."""

    nan: int
    inf: int
    first: tuple[int, ...] | None  # the index of the first of either, in C order


def modules_stored(rec: Recording) -> list[str]:
    """The names of the modules a recording holds full tensors of, sorted."""
    return sorted({rec.modules.name(int(m)) for m in rec.captures["module"]})


def stored_calls(stored: list[Capture], slot: Slot, path: str) -> list[Capture]:
    """The stored tensors of one slot (``output``, ``input[0]``...), one per stored call
    of its module (the first stored), in step and call order: ``--call K`` is the Kth."""
    first: dict[tuple[int, int], Capture] = {}
    for c in stored:
        if c.slot == slot and c.path == path:
            first.setdefault((c.step, c.call), c)
    return [first[key] for key in sorted(first)]


def nonfinite(values: np.ndarray) -> NonFinite | None:
    """What of a floating-point tensor is NaN or inf; None for an integer, boolean or
    empty tensor, which cannot hold any."""
    if not (np.issubdtype(values.dtype, np.floating) and values.size):
        return None
    bad = ~np.isfinite(values)
    first = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.any() else None
    return NonFinite(int(np.isnan(values).sum()), int(np.isinf(values).sum()), first)
