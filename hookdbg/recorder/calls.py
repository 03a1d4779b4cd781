"""The recorder's per-step bookkeeping: one ``Call`` per recorded module call and one
``Seen`` per distinct tensor (object and version) seen in the step.

Plain ``__slots__`` classes: thousands are made per step on the training thread.
"""

from __future__ import annotations

import weakref

from hookdbg.recorder.naming import ModuleInfo

NEVER = float("-inf")


class Call:
    """A recorded module call: its place in the call tree, timings, NaN bookkeeping."""

    __slots__ = (
        "bad_grad",
        "bwd_end",
        "bwd_start",
        "child_time",
        "depth",
        "id",
        "index",
        "info",
        "inputs_finite",
        "param_end",
        "parent",
        "tainted",
        "total",
        "vstart",
    )

    def __init__(
        self, id: int, info: ModuleInfo, index: int, parent: Call | None, vstart: float
    ) -> None:
        self.id = id
        self.info = info
        self.index = index
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.vstart = vstart
        self.total = 0.0
        self.child_time = 0.0
        self.bwd_start: float | None = None  # first gradient w.r.t. an output arrived
        self.bwd_end = NEVER  # last gradient w.r.t. an input arrived
        self.param_end = NEVER  # last own parameter gradient was accumulated
        self.inputs_finite = True
        self.tainted = False  # a non-finite tensor was seen in this call or below
        self.bad_grad = False  # a gradient w.r.t. one of its outputs was non-finite


class Seen:
    """A tensor (object + version) seen in this step, summarised once.

    ``grad_slots`` lists where its gradient belongs: ``(call, Slot.GRAD_OUTPUT, path)``
    for the calls that produced it, ``(call, Slot.GRAD_INPUT, path)`` for those that
    consumed it, so one gradient hook serves all of them.
    """

    __slots__ = (
        "alerted",
        "finite",
        "grad_slots",
        "producer",
        "ref",
        "step",
        "summary",
        "version",
    )

    def __init__(
        self, tensor: object, version: int, summary: tuple | None, finite: bool, step: int
    ) -> None:
        self.ref = weakref.ref(tensor)
        self.version = version
        self.summary = summary
        self.finite = finite
        self.producer: Call | None = None
        self.grad_slots: list[tuple[Call, int, str]] = []
        self.step = step
        self.alerted = False
