"""PyTorch Lightning: ``Trainer(callbacks=[HookdbgCallback("run.h5")])``.

Records ``trainer.fit`` from ``on_fit_start`` (so the sanity-check validation is in
it, as eval batches) to the end of training. Steps are the trainer's optimizer steps
(``trainer.global_step`` with one optimizer), found by hookdbg itself as under
``hookdbg record``, gradient accumulation and validation included. ``on_nan="stop"``
sets ``trainer.should_stop`` at the first batch end after a NaN/inf origin.
``validate``, ``test`` and ``predict`` are not recorded.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hookdbg.integrations.session import RecordingSession

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
except ImportError:  # the older package name
    try:
        from pytorch_lightning import (  # type: ignore[no-redef, assignment]
            Callback,
            LightningModule,
            Trainer,
        )
    except ImportError:
        raise ImportError(
            "hookdbg.integrations.lightning needs PyTorch Lightning: "
            "pip install 'hookdbg[lightning]'"
        ) from None

__all__ = ["HookdbgCallback"]


class HookdbgCallback(Callback):  # type: ignore[misc]
    """Record ``trainer.fit`` into ``path`` (``run.rankN.h5`` per rank under a
    multi-process strategy). ``on_nan``: record[=N], warn, break, raise, or stop (the trainer
    stops cleanly at the end of the batch). ``ranks``: record only these ranks
    (default: all). Other keywords are those of ``hookdbg.record`` (``level``,
    ``modules``, ``every``, ``steps``, ``capture``, ``force``, ``quiet``, ...)."""

    def __init__(
        self,
        path: str = "hookdbg.h5",
        *,
        on_nan: str = "record",
        ranks: Iterable[int] | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        self.session = RecordingSession(path, on_nan, ranks, options)

    @property
    def recorder(self) -> Any:
        """The recording in progress (a ``hookdbg.recorder.Recorder``), or None."""
        return self.session.recorder

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.session.start(trainer.global_rank, trainer.global_step)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        if self.session.should_stop(trainer.global_step, pl_module.device):
            trainer.should_stop = True

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.session.end()

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.session.end()  # when training never ran (max_steps=0); else closed already

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        self.session.failed(exception)
