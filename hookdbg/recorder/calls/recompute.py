"""Forwards run again inside backward: activation checkpointing.

``torch.utils.checkpoint`` runs a block's forward without keeping its activations and,
in backward, runs it again to get them. With the reentrant variant the first forward
runs with gradients off, so the block's tensors get their gradients only in the second
run. hookdbg matches each call of that second run to the forward call it repeats and
lets the second run's tensors report their gradients (and backward times) for it; the
second run itself is not a call of its own and adds no rows. Its backward is a separate
autograd pass inside the first, so the calls inside the block take their gradient
events from both. (The non-reentrant variant keeps the first run's graph and only takes
saved values from the second, which hookdbg then ignores.)

Matching: the outermost call run again inside backward is the latest call of that module
in the step not yet matched (backward meets checkpointed blocks in reverse order);
inside it, calls are matched in order to the children of the call it repeats.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hookdbg.recorder.calls.calls import Call
    from hookdbg.recorder.calls.naming import ModuleInfo


class Recompute:
    """A call run again inside backward, standing for the forward ``call`` it repeats."""

    __slots__ = ("_children", "_next", "boundary", "call", "outer")

    def __init__(self, call: Call, outer: bool, children: list[Call], boundary: set[int]) -> None:
        self.call = call
        self.outer = outer  # the checkpointed block itself (its own gradients come anyway)
        # ids of the block's inputs as run again: their gradients are those of the
        # block's original inputs, which report them already
        self.boundary = boundary
        self._children = children
        self._next = 0

    @property
    def info(self) -> ModuleInfo:
        return self.call.info

    def child(self, info: ModuleInfo) -> Call | None:
        """The forward call that the next call of module ``info`` inside it repeats."""
        children = self._children
        for i in range(self._next, len(children)):
            if children[i].info is info:
                self._next = i + 1
                return children[i]
        return None


class RecomputeIndex:
    """Per step: which forward calls were already run again, and each call's children."""

    def __init__(self, calls: list[Call]) -> None:
        self._calls = calls
        self._children: dict[int, list[Call]] = {}
        self._indexed = 0  # calls indexed in _children so far
        self._matched: set[int] = set()

    def outer(self, module_calls: list[Call], inputs: set[int]) -> Recompute | None:
        """The outermost call run again: the latest unmatched call of its module. None if
        there is none, or if its first forward ran with gradients on: then (non-reentrant
        checkpointing) the first run's tensors get the gradients, and the second run only
        supplies saved values."""
        for call in reversed(module_calls):
            if call.id not in self._matched:
                self._matched.add(call.id)
                if call.grad_on:
                    return None
                return Recompute(call, True, self.children(call), inputs)
        return None

    def inner(self, parent: Recompute, info: ModuleInfo) -> Recompute | None:
        call = parent.child(info)
        if call is None:
            return None
        return Recompute(call, False, self.children(call), parent.boundary)

    def children(self, call: Call) -> list[Call]:
        calls = self._calls
        for c in calls[self._indexed :]:  # calls made since the last look
            if c.parent is not None:
                self._children.setdefault(c.parent.id, []).append(c)
        self._indexed = len(calls)
        return self._children.get(call.id, [])
