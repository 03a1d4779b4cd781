"""Call timings, and the time model every report adds up with.

**The time model.** A segment's wall time is ``end - start + overhead`` (the steps
table): ``overhead`` is hookdbg's own time on the training thread (its hooks, alerts,
a ``--on-nan break`` prompt), which every other time leaves out, because the recorder's
clock stops while a hook runs. The rest, ``end - start``, is split so that each second
counts once:

* **forward self time** of each recorded module call: its own span (pre-hook to forward
  hook) less those of the calls inside it and of backward passes run inside it;
* **backward self time** of each recorded call: the intervals of the backward pass
  attributed to it (below);
* **loss sites** (backward.py): each backward pass is a call of the place in the script
  that started it, whose self time is what the pass spent outside recorded modules
  (the loss computation's backward, tensor code between modules, autograd itself);
* **optimizer self time**: an optimizer step's span less the forwards and backward
  passes run inside it (LBFGS's closure);
* **outside**: whatever is left: data loading, the forward of tensor code between
  modules, the script's own work. Reports derive it; it is never negative.

A call's *total* is its self time plus its children's totals, so ``self <= total`` and
the totals of the calls at the top never add to more than the segment.

**Backward intervals.** A backward pass is a run of events, each a gradient arriving
where hookdbg listens: at a tensor a module saw, just before the autograd node that made
the tensor runs (its pre-hook), or at a parameter, once it is accumulated. The interval
from one event to the next is the work of the node that was about to run: that of the
innermost call that *produced* the tensor (its output), or, after a parameter's event,
still that of the parameter's module. The interval before the first event (the loss
computation's backward) and after a tensor no module produced (tensor code between
modules) stay with the pass, and so does the last one, up to the pass's end (the rest of
autograd's work, a DDP all-reduce waited for at the end). So a module called many times
in one step (an unrolled LSTM cell, a siamese network) is never counted twice, however
the engine interleaves its calls' nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from hookdbg.recorder.calls.calls import LATER, Call
from hookdbg.store.rows import RowSink
from hookdbg.store.schema import Phase

_BWD = int(Phase.BWD)

STARTED = -2  # the mark's pass began (backward.py) and its graph task is not known yet
NO_PASS = -3  # no pass holds the mark


class Mark(Protocol):
    """Where the current backward pass stands: what ``attribute`` reads and moves (the
    tensor observer, or its C twin)."""

    bwd_mark: float  # when the last event (or the pass) was, on the recorder's clock
    bwd_mark_task: int  # its autograd graph task (STARTED, NO_PASS)
    bwd_attributed: float  # seconds given to calls since the pass began
    bwd_current: Call | None  # whose work the interval since the mark is (None: the pass's)
    bwd_last: Call | None  # the last call whose work an interval ended, in this pass
    # while timing on a GPU, told of each event and the call given the interval it ends
    # (recorder/hooks/devicetime.py)
    device_mark: Callable[[Call | None], None] | None


def attribute(mark: Mark, v: float, task: int, then: Call | None) -> None:
    """An event at ``v`` of graph task ``task``: the interval since the last one goes to
    the call whose work it was; the next one will be ``then``'s (None: the pass's)."""
    held = mark.bwd_mark_task
    receiver = None
    if held in (task, STARTED):
        dt = v - mark.bwd_mark
        call = receiver = mark.bwd_current
        if call is not None:
            mark.bwd_last = call
            if dt > 0.0:
                call.bwd_self += dt
                mark.bwd_attributed += dt
                if v - dt < call.bwd_first:
                    call.bwd_first = v - dt
    else:
        mark.bwd_last = None  # a pass that began without hookdbg hearing of it
    if mark.device_mark is not None:
        mark.device_mark(receiver)
    mark.bwd_current = then
    mark.bwd_mark = v
    mark.bwd_mark_task = task


# backward_rows here, or the same in C (hookdbg/recorder/_hot.c)
BackwardRows = Callable[[list[Call], int, int, float, RowSink], None]


def backward_rows(calls: list[Call], step: int, segment: int, origin: float, into: RowSink) -> None:
    """A backward row for each call that backward time was attributed to, itself or
    inside it: its total (its own intervals and its children's totals), its self time,
    and its start, the first of those intervals. ``calls`` are in creation order (parents
    before children); ``origin`` is the recording's start; the rows go to ``into``."""
    totals: dict[int, float] = {}  # call id -> its children's totals so far
    firsts: dict[int, float] = {}  # call id -> the first interval below it
    add = into.append
    bwd = _BWD
    for call in reversed(calls):  # children before parents
        total = call.bwd_self + totals.get(call.id, 0.0)
        first = call.bwd_first
        below = firsts.get(call.id, LATER)
        if below < first:
            first = below
        parent = call.parent
        pid = -1 if parent is None else parent.id
        if total <= 0.0:
            continue
        if parent is not None:
            totals[pid] = totals.get(pid, 0.0) + total
            if first < firsts.get(pid, LATER):
                firsts[pid] = first
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
                first - origin,
                total,
                call.bwd_self,
            )
        )
