"""Statistics of device tensors without waiting for the device.

On a GPU any ``.item()`` in a hook makes the CPU wait for every kernel queued so far,
so hookdbg leaves each device tensor's statistics on the device as a short vector
(stats.device_stats: min, max, mean, variance, sum of squares, nonzero count, NaN, +inf
and -inf counts), and at the end of each step copies the step's vectors to pinned host memory
in one non-blocking copy with an event behind it. The batch is read when that event
has completed, normally a step later, so the training thread never waits; then the
step's rows are complete and its NaN/inf checks are replayed in the order the hooks
saw them. At the end of the recording the last batches are waited for.

What this costs: rows and alerts reach the file a step later, and an alert cannot stop
the script inside the hook that saw it. That is why ``--on-nan break`` and ``raise``
check each tensor at once instead (waiting on the device), and say so.
"""

from __future__ import annotations

import torch

from hookdbg.recorder import stats


class Pending:
    """A summary still on the device; ``value`` is the summary tuple once read back."""

    __slots__ = ("index", "meta", "value")

    def __init__(self, index: int, meta: tuple) -> None:
        self.index = index
        self.meta = meta
        self.value: tuple | None = None


def resolved(summary: tuple | Pending | None) -> tuple | None:
    """The summary itself, whether it was computed at once or read back later."""
    return summary.value if summary.__class__ is Pending else summary  # type: ignore[union-attr]


class StepBatch:
    """One step's device statistics, the rows waiting for them, and the checks to
    replay once they are read."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.vectors: list[torch.Tensor] = []
        self.pending: list[Pending] = []
        self.rows: list[tuple] = []  # tensor rows holding Pending summaries
        self.checks: list[tuple] = []  # (function, args) in the order the hooks ran
        self.grad_finite: dict[int, bool] = {}  # this step's parameter gradients
        self._host: torch.Tensor | None = None
        self._keep: torch.Tensor | None = None
        self._event: torch.cuda.Event | None = None

    def add(self, t: torch.Tensor) -> Pending:
        """Queue ``t``'s statistics on its device; no wait."""
        pending = Pending(
            len(self.pending),
            (tuple(t.shape), stats.dtype_name(t.dtype), stats.device_name(t), t.numel()),
        )
        self.vectors.append(
            stats.device_stats(t).to(self.vectors[0].device)
            if self.vectors
            else stats.device_stats(t)
        )
        self.pending.append(pending)
        return pending

    def launch(self) -> None:
        """Start copying the step's statistics to the host, without waiting."""
        if not self.vectors:
            return
        stacked = torch.stack(self.vectors)
        self.vectors = []
        if stacked.is_cuda:
            self._host = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=True)
            self._host.copy_(stacked, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
            self._keep = stacked  # alive until the copy is done
        else:
            self._host = stacked

    def ready(self) -> bool:
        return self._event is None or self._event.query()

    def read(self) -> None:
        """Fill in every Pending summary (waits for the copy if it is not done)."""
        if self._event is not None:
            self._event.synchronize()
        if self._host is not None:
            for pending, raw in zip(self.pending, self._host.tolist(), strict=True):
                pending.value = stats.from_device_stats(pending.meta, raw)
        self._host = self._keep = self._event = None

    def finished_rows(self) -> list[tuple]:
        """The step's tensor rows, with their summaries read back."""
        return [(*row[:-1], resolved(row[-1])) for row in self.rows]
