"""Sharded tensors read whole: the global statistics of a DTensor from its ranks' shards.

Under FSDP2 or tensor parallel a rank's tensor rows summarise its local shard of each
DTensor, and its ``shards`` table says how the tensor lies on its device mesh
(hookdbg/recorder/summaries/shards.py). The shards that make up one global tensor are those of
the ranks of its mesh that differ from this one only along the mesh dimensions it is
sharded on (along a replicated dimension they hold copies; another data-parallel
group holds another tensor). Their statistics merge exactly: counts and sums add, the
minimum and maximum are those of the shards, the mean and the population std come from
each shard's mean and std weighted by its finite values (Chan's formula), the norm is
the root of the summed squared norms; a field declared a mean (``summary.Field.merge``)
is its shards' weighted by their finite values or elements, and any other field not
merged here reads as not measured. A tensor that is a partial sum on some dimension
(``P(sum)``: a row-parallel Linear's output before its all-reduce) has no global values
until it is reduced: it is not merged, and says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from hookdbg.store import schema, summary
from hookdbg.text import utf8

Place = tuple[int, int, int, str]  # module, phase, slot, path

# a merged row: the tensors table's columns, the shards it was merged from, and why not
GLOBAL = np.dtype([*schema.TENSORS.descr, ("ranks", "S64"), ("placement", "S64")])


@dataclass(frozen=True)
class Shard:
    """How a rank's tensor at one place lies on its device mesh."""

    placements: tuple[str, ...]  # per mesh dimension: 'S(0)', 'R', 'P(sum)', '_S(0, 2)'
    mesh: np.ndarray  # the mesh's ranks, one axis per mesh dimension
    coordinate: tuple[int, ...]  # this rank's place in it
    shape: str  # the global tensor's, as the shape column writes it

    @property
    def partial(self) -> bool:
        """Not a shard or a replica on some mesh dimension (a partial sum, ``P(sum)``,
        an embedding's masked partial, ``MaskP(...)``, or a placement this version does
        not know): it has no global values until reduced."""
        return not all(_sharded(p) or p == "R" for p in self.placements)

    @property
    def sharded(self) -> bool:
        """Split over some mesh dimension (not only replicated)."""
        return any(_sharded(p) for p in self.placements)

    def holders(self) -> list[int]:
        """The ranks whose shards make up the global tensor this rank holds a shard of:
        all along the sharded dimensions, this rank's coordinate along the others."""
        index = tuple(
            slice(None) if _sharded(p) else c
            for p, c in zip(self.placements, self.coordinate, strict=True)
        )
        return sorted(int(r) for r in np.asarray(self.mesh[index]).reshape(-1))

    @property
    def text(self) -> str:
        return ",".join(self.placements)


def _sharded(placement: str) -> bool:
    """``S(0)`` a shard of dim 0, ``_S(0, 2)`` a strided one (FSDP2 over tensor parallel)."""
    return placement.startswith(("S(", "_S("))


def shard_places(rows: np.ndarray) -> dict[Place, Shard]:
    """The ``shards`` table as a map from a tensor place to how it lies (the latest row
    of a place wins); rows that do not parse are left out."""
    out: dict[Place, Shard] = {}
    for r in rows:
        try:
            mesh = np.asarray(json.loads(utf8(r["mesh"])), dtype=np.int64)
            placements = tuple(p.strip() for p in _split(utf8(r["placements"])))
            coordinate = tuple(int(c) for c in utf8(r["coordinate"]).split(",") if c)
        except (ValueError, TypeError):
            continue
        if mesh.ndim != len(placements) or len(coordinate) != len(placements):
            continue
        place = (int(r["module"]), int(r["phase"]), int(r["slot"]), utf8(r["path"]))
        out[place] = Shard(placements, mesh, coordinate, utf8(r["shape"]))
    return out


def _split(text: str) -> list[str]:
    """'S(0),_S(0, 2),R' -> ['S(0)', '_S(0, 2)', 'R']: commas inside brackets stay."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        current += ch
    return [*parts, current] if current or parts else []


def merge(pieces: list[np.void]) -> dict[str, float | int]:
    """The statistics of the tensor whose shards ``pieces`` summarise (tensors rows).
    An empty shard (FSDP2 gives the last ranks none of a small tensor) adds nothing. A
    summary field not merged here reads as not measured, never as a shard's."""
    pieces = [p for p in pieces if int(p["numel"])] or pieces[:1]
    numel = sum(int(p["numel"]) for p in pieces)
    counted = all(int(p["nan"]) >= 0 for p in pieces)
    bad = {c: sum(int(p[c]) for p in pieces) if counted else -1 for c in _COUNTS}
    finite = [max(int(p["numel"]) - sum(max(int(p[c]), 0) for c in _COUNTS), 0) for p in pieces]
    total = sum(finite)
    means = np.array([float(p["mean"]) for p in pieces])
    stds = np.array([float(p["std"]) for p in pieces])
    weights = np.array(finite, dtype=np.float64)
    mean = std = float("nan")
    if total and np.isfinite(means[weights > 0]).all():
        mean = float((weights * means).sum() / total)
        if np.isfinite(stds[weights > 0]).all():
            m2 = (weights * stds**2).sum() + (weights * (means - mean) ** 2).sum()
            std = float(np.sqrt(m2 / total))
    lows = [float(p["min"]) for p in pieces if not np.isnan(p["min"])]
    highs = [float(p["max"]) for p in pieces if not np.isnan(p["max"])]
    norms = np.array([float(p["norm"]) for p in pieces])
    sizes = np.array([int(p["numel"]) for p in pieces], dtype=np.float64)
    merged: dict[str, float | int] = {
        "numel": numel,
        "min": min(lows) if len(lows) == len(pieces) else float("nan"),
        "max": max(highs) if len(highs) == len(pieces) else float("nan"),
        "mean": mean,
        "std": std,
        "norm": float(np.sqrt((norms**2).sum())),
        **bad,
    }
    names = pieces[0].dtype.names or ()
    if "sat_frac" in names:
        merged["sat_frac"] = _at_ends(pieces, merged["min"], merged["max"], numel)
    weighing = {summary.FINITE_MEAN: weights, summary.ELEMENT_MEAN: sizes}
    for f in summary.FIELDS[summary.VALUES]:
        if f.merge in weighing and f.name in names:
            merged[f.name] = _weighted(pieces, f.name, weighing[f.merge])
        merged.setdefault(f.name, f.missing)  # type: ignore[arg-type]
    return merged


def _weighted(pieces: list[np.void], name: str, weights: np.ndarray) -> float:
    """The mean of the shards' ``name`` weighted by ``weights`` (finite values or
    elements); NaN where a shard that has any is NaN, or none has any."""
    values = np.array([float(p[name]) for p in pieces])
    some = weights > 0
    if not some.any() or np.isnan(values[some]).any():
        return float("nan")
    return float((weights[some] * values[some]).sum() / weights[some].sum())


def _at_ends(pieces: list[np.void], lo: float, hi: float, numel: int) -> float:
    """The fraction of the whole tensor's values at its min or max. A shard whose own
    min and max are both the whole's (or neither) adds its values at its ends (or
    none); one holding a single end cannot tell how many of its values sit at which:
    NaN then."""
    count = 0
    for p in pieces:
        n, fraction = int(p["numel"]), float(p["sat_frac"])
        if not n:
            continue
        if np.isnan(fraction) or np.isnan(lo):
            return float("nan")
        ends = int(float(p["min"]) == lo) + int(float(p["max"]) == hi)
        if float(p["min"]) == float(p["max"]):  # a constant shard: all at one end or none
            ends = 2 if ends else 0
        if ends == 1:
            return float("nan")
        count += round(fraction * n) if ends else 0
    return count / numel if numel else float("nan")


_COUNTS = ("nan", "posinf", "neginf")
