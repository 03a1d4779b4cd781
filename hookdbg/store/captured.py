"""Captured tensors on their way into the file, behind the rows that describe the steps.

A step can capture more bytes than the writer compresses and writes in a flush interval
(measured on a busy 2-core machine: gzip takes in 12-18 MB/s, and a 512-1024-512 MLP on
batches of 256 captures 15 MB a step with ``--capture '*'``). Written in the order they
came, with the rows, they would hold every row behind them until their last byte was
in, and a ``kill -9`` would lose every step since the captures began. So the writer
takes the captured tensors out of each hand-over and queues them here
(``CapturedQueue``); it commits the other rows at once, then writes queued bytes for at
most half a flush interval (``store``), commits what it wrote with the rows that came
meanwhile, and so on until the queue is empty.

A tensor too large for one slice is written in pieces that end on chunk boundaries, so
a commit between two pieces writes whole chunks only: under SWMR a chunk rewritten
after a commit would leave its old copy in the file. Its ``captures`` row goes in with
its last piece; a row is committed only when all its bytes are in.
"""

from __future__ import annotations

import collections
import time

import h5py
import numpy as np

from hookdbg.store import retention, schema


class CapturedQueue:
    """Capture rows, each (fields..., payload bytes), waiting for their bytes to be
    written; counts of those taken and handled, for the writer's drains and backlog."""

    def __init__(self, row_bytes: int) -> None:
        self._queue: collections.deque[tuple] = collections.deque()
        self._row_bytes = row_bytes  # a waiting row's cost beside its payload
        self._next: int | None = None  # where the next payload goes on, None: a new chunk
        self._head = 0  # payload bytes of the first row written so far
        self._head_at = 0  # where the first row's payload starts
        # rows whose bytes are in, and what they held, until ``store`` hands them back
        self._done: list[tuple] = []
        self._done_cost = 0
        self.taken = 0  # rows queued so far
        self.handled = 0  # rows whose bytes are all written, or that go in no more

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def partial(self) -> bool:
        """Whether the first row's bytes are partly written (the file must stay the
        same until they are all in: no --keep-last rewrite meanwhile)."""
        return self._head > 0

    def cost(self, row: tuple) -> int:
        """What ``row`` holds in memory while it waits (as ``writer.batch_bytes`` counts)."""
        return self._row_bytes + len(row[-1])

    def add(self, rows: list) -> None:
        self._queue.extend(rows)
        self.taken += len(rows)

    def committed(self) -> None:
        """A commit flushed the last chunk written, whole or not: the next payload starts
        a new chunk (a compressed chunk is written once and never again)."""
        self._next = None

    def store(self, ds: h5py.Dataset, until: float) -> tuple[list[tuple], int]:
        """Payloads from the queue into ``ds`` until ``time.monotonic()`` passes
        ``until`` (at least one piece) or the queue is empty: the rows whose bytes are
        all in, each as (fields..., offset, nbytes, reason), and what they held."""
        chunk = schema.CAPTURE_CHUNK
        done = self._done  # kept until returned: if a write fails, ``drop`` counts them
        while self._queue:
            *fields, data = self._queue[0]
            if self._head == 0:
                at = self._next
                if at is None:
                    at = -(-ds.shape[0] // chunk) * chunk
                self._head_at = at
                ds.resize((at + len(data),))
            start = self._head_at
            pos = start + self._head
            end = min(start + len(data), (pos // chunk + 1) * chunk)
            view = memoryview(data)[pos - start : end - start]
            if end > pos:  # one tensor at a time, no copy of it
                ds[pos:end] = np.frombuffer(view, dtype="u1")
            self._head = end - start
            if self._head == len(data):
                self._done_cost += self.cost(self._queue.popleft())
                self._head = 0
                self._next = end
                self.handled += 1
                done.append((*fields[:-1], start, len(data), fields[-1]))
            if time.monotonic() >= until:
                break
        cost, self._done, self._done_cost = self._done_cost, [], 0
        return done, cost

    def shed(self, size: int) -> tuple[int, int]:
        """Forget waiting rows, the latest first, until they held ``size`` bytes or only
        the first is left (its bytes may be partly written): how many, and what they
        held."""
        rows = freed = 0
        while freed < size and len(self._queue) > 1:
            freed += self.cost(self._queue.pop())
            rows += 1
        self.handled += rows
        return rows, freed

    def drop(self) -> tuple[int, int]:
        """Forget every row not handed back by ``store`` (writing failed): how many, and
        what they held in memory."""
        size = sum(self.cost(row) for row in self._queue) + self._done_cost
        rows = len(self._queue) + len(self._done)
        self._queue.clear()
        self._done, self._done_cost = [], 0
        self._head = 0
        self.handled = self.taken
        return rows, size

    def keep_from(self, first: int) -> int:
        """Forget the waiting rows of segments whose detail --keep-last no longer keeps
        (the file was written anew from segment ``first``): what they held in memory."""
        assert not self.partial, "a tensor's bytes are half in the file being replaced"
        kept = [row for row in self._queue if retention.keeps_capture(row[1], row[-2], first)]
        size = sum(self.cost(row) for row in self._queue) - sum(self.cost(row) for row in kept)
        self.handled += len(self._queue) - len(kept)
        self._queue = collections.deque(kept)
        return size
