"""The hand-over of gathered rows from the training thread to the writer thread.

The hooks append plain tuples to ``Rows`` (hookdbg/store/rows.py); a ``Handoff`` passes
what they gathered to the writer (``Writer.submit``, a deque append: the training
thread never waits). It happens at the end of each segment, from the module hooks
every half flush interval (at most 0.5 s), when an alert is acted on, after large
captured tensors, and when the writer thread asks on its own timer.
"""

from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING

from hookdbg.store.rows import Rows

if TYPE_CHECKING:
    from hookdbg.store.writer import Writer


class Handoff:
    """Call it to hand the rows gathered so far to the writer; ``last`` says when that
    last happened, ``pending_capture`` how many bytes of captured tensors are gathered
    since."""

    __slots__ = ("every", "last", "pending_capture", "rows", "writer")

    def __init__(self, rows: Rows, every: float) -> None:
        self.rows = rows
        self.writer: Writer | None = None  # set when the recording starts
        self.every = every  # seconds between hand-overs asked for by the module hooks
        self.last = 0.0  # perf_counter() at the last hand-over
        self.pending_capture = 0  # bytes of captured tensors not handed over yet

    def __call__(self) -> None:
        self.last = perf_counter()
        self.pending_capture = 0
        if self.writer is not None:
            batch = self.rows.take()
            if batch:
                self.writer.submit(batch)

    def when_due(self) -> None:
        """Hand over only if the last hand-over is ``every`` seconds old (the writer
        also asks on its own timer): for rows that can wait that long."""
        if perf_counter() - self.last > self.every:
            self()
