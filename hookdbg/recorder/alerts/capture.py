"""Full tensors in the recording: explicit ``--capture``, and the flight recorder.

Summaries say *that* something went wrong; the actual values say *why*. Two ways to
keep them:

* ``--capture GLOB --capture-steps A:B`` copies every input, output and gradient of
  the matching modules in those steps into the file, until ``--capture-budget``.
* The flight recorder holds *references* (no copies, so it costs memory, not time) to
  the tensors of the last two steps, up to ``--flight-recorder`` MB, dropping the
  oldest first. When a NaN/inf origin fires, it writes the tensors of the origin call
  and its neighbours (parent, children, the calls just before and after) in this step
  and the same calls in the step before. A tensor changed in place since it was seen
  (the input of an in-place ReLU) has lost the values it had and is left out: the
  version counter says so.

Captured bytes are raw little-endian array data; ``captures`` rows say dtype and
shape. bfloat16 and other types numpy lacks are stored as float32.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import cast

import torch

from hookdbg.options import RecordOptions
from hookdbg.recorder.calls.calls import Call, Segment
from hookdbg.recorder.calls.cboundary import called_from_c
from hookdbg.recorder.summaries import stats
from hookdbg.store.schema import CaptureReason, slot_label
from hookdbg.text import human_bytes

_NUMPY_LACKS = frozenset({torch.bfloat16, torch.complex32})
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _NUMPY_LACKS = _NUMPY_LACKS | {getattr(torch, _name)}


def payload(t: torch.Tensor) -> tuple[str, str, bytes]:
    """(dtype, shape, bytes) of a tensor's values, as numpy would write them (under
    torch.func's transforms, those of the tensor under the wrappers: ``stats.physical``)."""
    with stats.outside_transforms():
        t = stats.physical(t).detach()
        if t.dtype in _NUMPY_LACKS:
            t = t.float()
        array = t.cpu().contiguous().numpy()
    return array.dtype.name, ",".join(map(str, array.shape)), array.tobytes()


def nbytes(t: torch.Tensor) -> int:
    """What ``payload`` will hold of ``t``."""
    t = stats.physical(t)
    return t.numel() * t.element_size()


class Capturer:
    """``--capture``: copies the tensors of chosen modules in chosen steps, to a budget."""

    def __init__(self, options: RecordOptions, warn: Callable[[str], None]) -> None:
        assert options.capture is not None
        self.select = options.capture.selects
        self.steps = options.capture_steps
        self.budget = options.capture_budget
        self.used = 0
        self.full = False
        self._warn = warn

    def active(self, step: int) -> bool:
        return not self.full and step in self.steps

    def take(
        self,
        seg: Segment,
        call: Call | None,
        module: int,
        phase: int,
        slot: int,
        path: str,
        t: torch.Tensor,
    ) -> tuple | None:
        """A ``captures`` row for ``t`` (with its bytes), or None once the budget is spent."""
        size = nbytes(t)
        if self.used + size > self.budget:
            self.full = True
            where = f"step {seg.step}, {slot_label(slot, path)}"
            budget = human_bytes(self.budget)
            if self.used == 0:
                self._warn(
                    f"--capture-budget ({budget}) cannot hold even one tensor ({where} "
                    f"needs {human_bytes(size)}); nothing was captured"
                )
            else:
                self._warn(
                    f"--capture-budget ({budget}) reached at {where}: later tensors "
                    "are not captured (raise the budget for more)"
                )
            return None
        self.used += size
        dtype, shape, data = payload(t)
        return (
            seg.step,
            seg.id,
            -1 if call is None else call.id,
            module,
            phase,
            slot,
            path,
            dtype,
            shape,
            int(CaptureReason.EXPLICIT),
            data,
        )


_ENTRY = 6  # values per flight-recorder entry: call, phase, slot, path, version, tensor
_Entry = tuple[Call, int, int, str, int, torch.Tensor]


def _calls(entries: list[object]) -> list[Call]:
    """The call of each entry in a step's flat list (the first of its values)."""
    return cast(list[Call], entries[::_ENTRY])


def _entry(entries: list[object], i: int) -> _Entry:
    """The values of the entry that starts at ``i``, in the order ``keep`` laid out."""
    return cast(_Entry, tuple(entries[i : i + _ENTRY]))


class FlightRecorder:
    """References to the last two steps' tensors, within a memory budget: when the two
    hold more, the older step's go first; a step that alone fills the budget keeps its
    first tensors. Each distinct tensor counts once per step, however many calls keep it.
    Its attributes are slots: the recorder's C path (_hot.c) reads and writes them.
    """

    __slots__ = ("_entries", "_sizes", "_steps", "budget", "held")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        # per step: its segment, its entries, and the bytes of each distinct tensor
        self._steps: collections.deque[tuple[Segment, list[object], dict[int, int]]] = (
            collections.deque()
        )
        self._entries: list[object] = []
        self._sizes: dict[int, int] = {}
        self.held = 0

    def new_step(self, seg: Segment) -> None:
        self._entries, self._sizes = [], {}
        self._steps.append((seg, self._entries, self._sizes))
        while len(self._steps) > 2:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, _, sizes = self._steps.popleft()
        self.held -= sum(sizes.values())

    @called_from_c
    def keep(
        self, call: Call, phase: int, slot: int, path: str, t: torch.Tensor, version: int
    ) -> None:
        """Hold ``t`` (at ``version``, -1: an inference tensor) for this step. The entry's
        six values go into the step's one flat list: no object per entry for the garbage
        collector to count and scan while it is held. A sparse or nested tensor (no
        ``nbytes``, nothing a capture could store) is not held."""
        if t.layout != torch.strided:
            return
        sizes = self._sizes
        key = id(t)
        if key not in sizes:
            size = t.nbytes
            while self.held + size > self.budget:
                if len(self._steps) < 2:
                    return  # this step alone fills the budget
                self._drop_oldest()
            sizes[key] = size
            self.held += size
        self._entries.extend((call, phase, slot, path, version, t))

    def dump(self, origin: Call, seg: Segment) -> tuple[list[tuple], int]:
        """Capture rows for the origin call (of segment ``seg``) and its neighbours, in that
        segment and the one before; and how many kept tensors were left out, changed in
        place since."""
        held = {s.id: entries for s, entries, _ in self._steps}
        if seg.id not in held:
            return [], 0
        entries = held[seg.id]
        calls = sorted({*_calls(entries), origin}, key=lambda c: c.id)
        pos = calls.index(origin)
        chosen = {origin, *calls[max(pos - 1, 0) : pos + 2]}
        chosen |= {c for c in calls if c.parent is origin}
        if origin.parent is not None:
            chosen.add(origin.parent)
        wanted = {(c.info.id, c.index) for c in chosen}
        rows: list[tuple] = []
        stale = 0
        for entry_seg, step_entries, _ in self._steps:
            if entry_seg.id not in (seg.id - 1, seg.id):
                continue
            for i in range(0, len(step_entries), _ENTRY):
                call, phase, slot, path, version, t = _entry(step_entries, i)
                if (call.info.id, call.index) not in wanted:
                    continue
                if version != -1 and t._version != version:
                    stale += 1
                    continue
                rows.append(_capture_row(entry_seg, call, phase, slot, path, t))
        return rows, stale

    def dump_all(self, after: int = -1) -> tuple[list[tuple], int]:
        """Capture rows for every tensor held of calls after call ``after`` (``hookdbg
        ctl dump``: those before it were written by the dump before), each place once,
        and how many were left out, changed in place since they were seen."""
        rows: list[tuple] = []
        stale = 0
        seen: set[tuple[int, int, int, str]] = set()
        for seg, entries, _ in self._steps:
            for i in range(0, len(entries), _ENTRY):
                call, phase, slot, path, version, t = _entry(entries, i)
                place = (call.id, phase, slot, path)
                if call.id <= after or place in seen:
                    continue
                seen.add(place)
                if version != -1 and t._version != version:
                    stale += 1
                    continue
                rows.append(_capture_row(seg, call, phase, slot, path, t))
        return rows, stale

    def clear(self) -> None:
        self._steps.clear()
        self._entries, self._sizes = [], {}
        self.held = 0


def _capture_row(
    seg: Segment, call: Call, phase: int, slot: int, path: str, t: torch.Tensor
) -> tuple:
    """A ``captures`` row (with the tensor's bytes) for a tensor the flight recorder held."""
    dtype, shape, data = payload(t)
    return (
        seg.step,
        seg.id,
        call.id,
        call.info.id,
        phase,
        slot,
        path,
        dtype,
        shape,
        int(CaptureReason.FLIGHT),
        data,
    )
