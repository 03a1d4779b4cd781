"""Full tensors stored in a recording (``--capture`` and the flight recorder)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hookdbg.read.modules import Module
from hookdbg.store.schema import CaptureReason, Phase, Slot, slot_label
from hookdbg.text import utf8


@dataclass(frozen=True)
class Capture:
    """Where a stored tensor came from, and where its bytes are."""

    step: int
    call: int
    module: Module
    phase: Phase
    slot: Slot
    path: str
    dtype: str
    shape: tuple[int, ...]
    reason: CaptureReason
    offset: int
    nbytes: int

    @property
    def label(self) -> str:
        return slot_label(self.slot, self.path)

    @property
    def source(self) -> str:
        return "flight recorder" if self.reason == CaptureReason.FLIGHT else "--capture"


def captures_from(rows: np.ndarray, modules: object) -> list[Capture]:
    out = []
    for r in rows:
        shape = utf8(r["shape"])
        out.append(
            Capture(
                step=int(r["step"]),
                call=int(r["call"]),
                module=modules[int(r["module"])],  # type: ignore[index]
                phase=Phase(int(r["phase"])),
                slot=Slot(int(r["slot"])),
                path=utf8(r["path"]),
                dtype=utf8(r["dtype"]),
                shape=tuple(int(x) for x in shape.split(",")) if shape else (),
                reason=CaptureReason(int(r["reason"])),
                offset=int(r["offset"]),
                nbytes=int(r["nbytes"]),
            )
        )
    return out


def to_array(capture: Capture, data: bytes) -> np.ndarray:
    """The stored bytes as the array they came from (a copy: safe to keep)."""
    return np.frombuffer(data, dtype=np.dtype(capture.dtype)).reshape(capture.shape).copy()
