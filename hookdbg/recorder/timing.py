"""Call timings: rows for the ``calls`` table, and backward spans.

Forward times are measured directly (pre-hook to forward hook). Backward times are
reconstructed at the end of a step from the moments gradients arrived, see
``backward_rows``.
"""

from __future__ import annotations

from hookdbg.recorder.calls import NEVER, Call
from hookdbg.store.schema import Phase


def call_row(
    call_id: int,
    phase: int,
    step: int,
    segment: int,
    module: int,
    index: int,
    parent: int,
    depth: int,
    start: float,
    total: float,
    self_time: float,
) -> tuple:
    """A ``calls`` row, in schema order."""
    return (call_id, phase, step, segment, module, index, parent, depth, start, total, self_time)


def backward_rows(calls: list[Call], step: int, segment: int, origin: float) -> list[tuple]:
    """Backward span of each call, from the first gradient at its outputs to its end.

    Each call's events are those of the backward pass (autograd graph task) that first
    reached it, so a module called again later in the step (a second micro-batch, a
    GAN's discriminator on real then fake data) does not stretch an earlier call's span.
    A call without recorded children ends at its earliest own end event (an input's
    gradient arrived, or its parameters' gradients were accumulated): a gradient
    w.r.t. an input shared with other modules (a residual path) only completes after
    them, and a shared module's parameters after all its calls. A call with children
    ends with its last child (or its own parameters). Self time excludes recorded
    children. ``calls`` are in creation order; ``origin`` is the recording's start.
    """
    ends: dict[int, float] = {}  # call id -> latest end among its children
    totals: dict[int, float] = {}
    rows = []
    for call in reversed(calls):  # children before parents
        start = call.bwd_start
        child_end = ends.get(call.id)
        if child_end is not None:
            end = max(child_end, call.param_end)
        else:
            own = [e for e in (call.bwd_end, call.param_end) if start is not None and e > start]
            end = min(own) if own else NEVER
        parent = call.parent
        if parent is not None and end > NEVER:
            ends[parent.id] = max(ends.get(parent.id, NEVER), end)
        if start is None or end <= start:
            continue
        total = end - start
        if parent is not None:
            totals[parent.id] = totals.get(parent.id, 0.0) + total
        rows.append(
            call_row(
                call.id,
                int(Phase.BWD),
                step,
                segment,
                call.info.id,
                call.index,
                -1 if parent is None else parent.id,
                call.depth,
                start - origin,
                total,
                max(total - totals.get(call.id, 0.0), 0.0),
            )
        )
    return rows
