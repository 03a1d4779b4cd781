"""Hugging Face Trainer: ``Trainer(..., callbacks=[HookdbgCallback("run.h5")])``.

Records ``trainer.train()`` from ``on_train_begin`` to ``on_train_end``: its steps are
the trainer's global steps (found by hookdbg itself, as under ``hookdbg record``,
gradient accumulation included) and its evaluations eval batches. ``on_nan="stop"``
sets ``control.should_training_stop`` at the first step or micro-batch end after a
NaN/inf origin. The Trainer calls no callback when training raises: a recording left
open that way is closed by the next ``train()`` or when the process exits (status
``exception``), or at once with ``callback.close()``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hookdbg.integrations.session import RecordingSession

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError:
    raise ImportError(
        "hookdbg.integrations.transformers needs transformers: pip install 'hookdbg[transformers]'"
    ) from None

__all__ = ["HookdbgCallback"]


class HookdbgCallback(TrainerCallback):  # type: ignore[misc]
    """Record ``trainer.train()`` into ``path`` (``run.rankN.h5`` per process under
    torchrun or accelerate). ``on_nan``: record[=N], warn, break, raise, or stop (the trainer stops
    cleanly). ``ranks``: record only these process indexes (default: all). Other
    keywords are those of ``hookdbg.record`` (``level``, ``modules``, ``every``,
    ``steps``, ``capture``, ``force``, ``quiet``, ...)."""

    def __init__(
        self,
        path: str = "hookdbg.h5",
        *,
        on_nan: str = "record",
        ranks: Iterable[int] | None = None,
        **options: Any,
    ) -> None:
        self.session = RecordingSession(path, on_nan, ranks, options)

    @property
    def recorder(self) -> Any:
        """The recording in progress (a ``hookdbg.recorder.Recorder``), or None."""
        return self.session.recorder

    def close(self, status: str = "exception", message: str = "") -> None:
        """Close a recording that ``Trainer.train`` left open by raising."""
        self.session.close(status, 0 if status == "complete" else 1, message)

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.session.start(args.process_index, state.global_step)

    def _check(self, args: TrainingArguments, state: TrainerState, control: TrainerControl) -> None:
        if self.session.should_stop(state.global_step, args.device):
            control.should_training_stop = True

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._check(args, state, control)

    def on_substep_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._check(args, state, control)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.session.end()
