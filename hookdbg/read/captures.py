"""Full tensors stored in a recording (``--capture`` and the flight recorder)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hookdbg.read.checks import RecordingError
from hookdbg.read.modules import Module, ModuleTable
from hookdbg.store.schema import CaptureReason, Phase, Slot, slot_label
from hookdbg.text import utf8


@dataclass(frozen=True)
class Capture:
    """Where a stored tensor came from, and where its bytes are."""

    step: int
    segment: int  # the training step or eval batch (a steps.segment)
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


def captures_from(rows: np.ndarray, modules: ModuleTable, path: Path) -> list[Capture]:
    """Capture rows as Captures, each checked: a dtype numpy can hold without running
    code (numbers only), a shape of whole numbers whose size matches ``nbytes``."""
    out = []
    for r in rows:
        shape_text, dtype_text = utf8(r["shape"]), utf8(r["dtype"])
        where = f"{path} is damaged: a stored tensor of step {int(r['step'])}"
        try:
            shape = tuple(int(x) for x in shape_text.split(",")) if shape_text else ()
        except ValueError:
            raise RecordingError(f"{where} has shape {shape_text!r}") from None
        dtype = _dtype(dtype_text)
        if dtype is None:
            raise RecordingError(f"{where} has type {dtype_text!r}, which is no tensor type")
        offset, nbytes = int(r["offset"]), int(r["nbytes"])
        if min(shape, default=0) < 0:
            raise RecordingError(f"{where} has shape {shape}")
        if nbytes != math.prod(shape) * dtype.itemsize:
            raise RecordingError(
                f"{where} has shape {shape} of {dtype_text} but claims {nbytes:,} bytes"
            )
        if offset < 0:
            raise RecordingError(f"{where} starts at byte {offset:,}")
        out.append(
            Capture(
                step=int(r["step"]),
                segment=int(r["segment"]),
                call=int(r["call"]),
                module=modules[int(r["module"])],
                phase=Phase(int(r["phase"])),
                slot=Slot(int(r["slot"])),
                path=utf8(r["path"]),
                dtype=dtype_text,
                shape=shape,
                reason=CaptureReason(int(r["reason"])),
                offset=offset,
                nbytes=nbytes,
            )
        )
    return out


def _dtype(name: str) -> np.dtype | None:
    """numpy's dtype for a tensor type name, if it is a plain number type."""
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError, SyntaxError):
        return None
    return dtype if dtype.kind in "biufc" and dtype.names is None and not dtype.shape else None


def to_array(capture: Capture, data: bytes) -> np.ndarray:
    """The stored bytes as the array they came from (a copy: safe to keep)."""
    return np.frombuffer(data, dtype=np.dtype(capture.dtype)).reshape(capture.shape).copy()
