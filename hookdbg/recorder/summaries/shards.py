"""DTensors: where a summarised shard lies in its global tensor.

Sharded training (FSDP2's ``fully_shard``, tensor parallel, DTensor) puts DTensors in
parameters, gradients and activations. hookdbg summarises a DTensor's local shard
(reading it whole would run collectives: stats.local), and keeps, once per tensor
place, how the tensor is placed on its device mesh, so that readers can merge the ranks'
shard summaries into the global tensor's (hookdbg/read/shards.py): the ``shards`` table.
"""

from __future__ import annotations

import json

import torch

from hookdbg.recorder.summaries.stats import local
from hookdbg.store.rows import Rows


class ShardPlaces:
    """The tensor places seen holding a DTensor, and their placements."""

    def __init__(self, rows: Rows) -> None:
        self.rows = rows  # its shards sink is a new list after each hand-over
        self._seen: dict[tuple[int, int, int, str], str] = {}

    def note(self, module: int, phase: int, slot: int, path: str, t: torch.Tensor) -> bool:
        """``t`` seen at (module, phase, slot, path): a row for the place the first time
        it holds a DTensor, or a DTensor placed otherwise. Whether ``t`` is a partial
        sum (a collective will reduce it)."""
        spec = getattr(t, "_spec", None)
        if spec is None or local(t) is t:  # not a DTensor
            return False
        placements = ",".join(str(p) for p in spec.placements)
        partial = any(p.is_partial() for p in spec.placements)
        key = (module, phase, slot, path)
        if self._seen.get(key) == placements:
            return partial
        self._seen[key] = placements
        mesh = spec.mesh
        coordinate = mesh.get_coordinate() or []
        self.rows.shards.append(
            (
                module,
                phase,
                slot,
                path,
                placements,
                json.dumps(mesh.mesh.tolist(), separators=(",", ":")),
                ",".join(mesh.mesh_dim_names or ()),
                ",".join(map(str, coordinate)),
                ",".join(map(str, t.shape)),
            )
        )
        return partial
