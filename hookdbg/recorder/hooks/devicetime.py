"""Module times on the device: CUDA events, read back a step later without waiting.

On a GPU a module's forward returns once its kernels are queued, so the host's span of
a call (recorder/hooks/timing.py) is the time to launch them, not to run them. So while a
recorded segment's model runs on CUDA, the same points the host clock reads are also
marked on the device, by a CUDA event recorded on the current stream:

Events are recorded on the stream that was current when the segment began.

* **forward**: one event as a call starts (after its pre-hook) and one as it ends
  (before its forward hook's work), so that hookdbg's own work in the hooks falls
  outside the call. A call's device total is the time between them; its self time is
  that less its children's totals, as on the host.
* **backward**: one event at each point where the host attributes an interval of the
  backward pass (timing.attribute: a gradient arriving at a tensor or a parameter).
  The device time from the previous event to this one goes to the call the host gives
  that interval to; a call's backward total is its own and its children's, as on the
  host. Each backward pass gets events at its start and end: the loss site's device
  self time is the pass less what its calls were given.

Nothing waits: at the end of a segment its events are queued for reading, and a
segment's rows (the ``device_times`` table: call, phase, device total and self, in
seconds) are computed once its last event has completed, normally a step later; the
recorder's close waits for the last. Events are reused from a pool, so a step records
about two events per module call and one per gradient, and creates none.

Device times are wall time on the device between two points of one stream: where the
host falls behind (a model too small to keep the GPU busy) they include the device's
idle time, and work a call queued on another stream is not in them.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

import torch

from hookdbg.store.schema import Phase

if TYPE_CHECKING:
    from hookdbg.recorder.calls.calls import Call
    from hookdbg.store.rows import Rows

_FWD, _BWD = int(Phase.FWD), int(Phase.BWD)
_MS = 1e-3  # CUDA events measure milliseconds


class SegmentTimes:
    """One recorded segment's events."""

    __slots__ = ("backward", "calls", "events", "forward", "last", "passes", "segment", "step")

    def __init__(self, step: int, segment: int, calls: list[Call]) -> None:
        self.step = step
        self.segment = segment
        self.calls = calls  # the segment's calls, in creation order (parents first)
        self.forward: dict[Call, list] = {}  # call -> [start event, end event or None]
        self.backward: list[tuple] = []  # (event before, event after, call, pass index)
        self.passes: list[list] = []  # [loss site's call id (-1: running), start, end event]
        self.events: list[torch.cuda.Event] = []  # every event recorded: back to the pool
        self.last: torch.cuda.Event | None = None  # recorded at the segment's end


class DeviceClock:
    """The events of the segments being recorded and of those not read back yet."""

    def __init__(self, rows: Rows) -> None:
        self.rows = rows  # rows.device_times is a new list after each hand-over
        self.current: SegmentTimes | None = None
        self.waiting: collections.deque[SegmentTimes] = collections.deque()
        self._pool: list[torch.cuda.Event] = []
        self._previous: torch.cuda.Event | None = None  # the backward pass's last event
        # where events are recorded: the stream current when the segment began (asking
        # for each event would cost the host more than the event)
        self._stream: torch.cuda.Stream | None = None

    def _event(self, seg: SegmentTimes) -> torch.cuda.Event:
        pool = self._pool
        event = pool.pop() if pool else torch.cuda.Event(enable_timing=True)
        event.record(self._stream)
        seg.events.append(event)
        return event

    # -- marks, from the hooks -------------------------------------------------------

    def begin(self, step: int, segment: int, calls: list[Call]) -> None:
        self.current = SegmentTimes(step, segment, calls)
        self._previous = None
        self._stream = torch.cuda.current_stream() if torch.cuda.is_available() else None

    def start(self, call: Call) -> None:
        current = self.current
        if current is not None:
            current.forward[call] = [self._event(current), None]

    def end(self, call: Call) -> None:
        current = self.current
        if current is not None:
            events = current.forward.get(call)
            if events is not None:
                events[1] = self._event(current)

    def pass_started(self) -> None:
        current = self.current
        if current is not None:
            self._previous = event = self._event(current)
            current.passes.append([-1, event, None])

    def pass_ended(self, call_id: int) -> None:
        current = self.current
        if current is not None and current.passes:
            run = current.passes[-1]
            if run[2] is None:
                run[0], run[2] = call_id, self._event(current)
        self._previous = None

    def mark(self, call: Call | None) -> None:
        """A backward event: the device time since the last one is ``call``'s (None:
        the pass's own)."""
        current = self.current
        if current is None:
            return
        event = self._event(current)
        previous, self._previous = self._previous, event
        if previous is not None and call is not None:
            current.backward.append((previous, event, call, len(current.passes) - 1))

    def end_segment(self) -> None:
        current, self.current = self.current, None
        if current is not None:
            current.last = self._event(current)
            self.waiting.append(current)

    # -- reading back ------------------------------------------------------------------

    def read(self, wait: bool) -> None:
        """The rows of the segments whose events have all completed (all of them,
        waiting for the device, with ``wait``)."""
        waiting = self.waiting
        while waiting:
            last = waiting[0].last
            assert last is not None
            if wait:
                last.synchronize()
            elif not last.query():
                return
            self._rows(waiting.popleft())

    def _rows(self, seg: SegmentTimes) -> None:
        fwd: dict[int, float] = {}  # call id -> device total
        below: dict[int, float] = {}  # call id -> its children's totals
        for call, (start, end) in seg.forward.items():
            total = None if end is None else _elapsed(start, end)
            if total is None:
                continue
            fwd[call.id] = total
            parent = call.parent
            if parent is not None:
                below[parent.id] = below.get(parent.id, 0.0) + total
        own: dict[int, float] = {}  # call id -> backward time given to it
        given = [0.0] * len(seg.passes)  # each pass's time given to calls
        for before, after, call, run in seg.backward:
            dt = _elapsed(before, after)
            if dt is not None:
                own[call.id] = own.get(call.id, 0.0) + dt
                if run >= 0:
                    given[run] += dt
        add = self.rows.device_times.append
        step, segment = seg.step, seg.segment
        for call in seg.calls:
            total = fwd.get(call.id)
            if total is not None:
                mine = max(total - below.get(call.id, 0.0), 0.0)
                add((call.id, _FWD, step, segment, total, mine))
        totals: dict[int, float] = {}  # backward: call id -> its children's totals so far
        for call in reversed(seg.calls):  # children before parents
            mine = own.get(call.id, 0.0)
            total = mine + totals.get(call.id, 0.0)
            if total <= 0.0:
                continue
            parent = call.parent
            if parent is not None:
                totals[parent.id] = totals.get(parent.id, 0.0) + total
            add((call.id, _BWD, step, segment, total, mine))
        for (call_id, start, end), calls_time in zip(seg.passes, given, strict=True):
            wall = None if end is None else _elapsed(start, end)
            if call_id >= 0 and wall is not None:
                add((call_id, _BWD, step, segment, wall, max(wall - calls_time, 0.0)))
        self._pool.extend(seg.events)


def _elapsed(start: torch.cuda.Event, end: torch.cuda.Event) -> float | None:
    """Seconds between two completed events; None where the device cannot say (events
    on streams that did not complete in order)."""
    try:
        return start.elapsed_time(end) * _MS
    except RuntimeError:
        return None
