"""Call timings: rows for the ``calls`` table, and backward spans.

Forward times are measured directly (pre-hook to forward hook). Backward times are
reconstructed at the end of a step from the moments gradients arrived, see
``backward_rows``.
"""

from __future__ import annotations

from collections.abc import Callable

from hookdbg.recorder.calls import NEVER, Call
from hookdbg.store.rows import RowSink
from hookdbg.store.schema import Phase

_BWD = int(Phase.BWD)
_LATER = float("inf")

# backward_rows here, or the same in C (hookdbg/recorder/_hot.c)
BackwardRows = Callable[[list[Call], int, int, float, RowSink], None]


def backward_rows(calls: list[Call], step: int, segment: int, origin: float, into: RowSink) -> None:
    """Backward span of each call, from the first gradient at its outputs to its end.

    Each call's events are those of the backward pass (autograd graph task) that first
    reached it, so a module called again later in the step (a second micro-batch, a
    GAN's discriminator on real then fake data) does not stretch an earlier call's span.
    A call without recorded children ends at its earliest own end event (an input's
    gradient arrived, or its parameters' gradients were accumulated): a gradient
    w.r.t. an input shared with other modules (a residual path) only completes after
    them, and a shared module's parameters after all its calls. A call with children
    ends with its last child (or its own parameters). Self time excludes recorded
    children. ``calls`` are in creation order; ``origin`` is the recording's start; the
    rows go to ``into``.
    """
    ends: dict[int, float] = {}  # call id -> latest end among its children
    totals: dict[int, float] = {}
    add = into.append
    bwd = _BWD
    for call in reversed(calls):  # children before parents
        start = call.bwd_start
        param_end = call.param_end
        child_end = ends.get(call.id)
        if child_end is not None:
            end = child_end if child_end > param_end else param_end
        elif start is None:
            end = NEVER
        else:  # the earliest own end event after its start
            input_end = call.bwd_end
            end = input_end if input_end > start else _LATER
            if start < param_end < end:
                end = param_end
            if end == _LATER:
                end = NEVER
        parent = call.parent
        pid = -1 if parent is None else parent.id
        if parent is not None and end > ends.get(pid, NEVER):
            ends[pid] = end
        if start is None or end <= start:
            continue
        total = end - start
        if parent is not None:
            totals[pid] = totals.get(pid, 0.0) + total
        self_time = total - totals.get(call.id, 0.0)
        add(
            (
                call.id,
                bwd,
                step,
                segment,
                call.info.id,
                call.index,
                pid,
                call.depth,
                start - origin,
                total,
                self_time if self_time > 0.0 else 0.0,
            )
        )
