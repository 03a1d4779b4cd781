"""A distributed run: one recording per rank (run.rank0.h5, run.rank1.h5, ...) read as
one run. Under torchrun each rank writes its own file (no cross-rank locking on one
HDF5 file); this module opens them from the name the user gave (run.h5), found by the
naming rule of hookdbg/ranks.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hookdbg.ranks import rank_file, rank_files
from hookdbg.read.recording import Recording, RecordingError, open_recording
from hookdbg.read.resolve import read_rows, resolve
from hookdbg.read.shards import GLOBAL, Place, merge
from hookdbg.text import utf8

if TYPE_CHECKING:  # pandas is optional: to_pandas imports it
    import pandas as pd  # type: ignore[import-untyped, unused-ignore]

__all__ = ["RankSet", "open_run", "rank_files"]


class RankSet:
    """The per-rank recordings of one distributed run, opened and validated."""

    def __init__(self, path: Path, recordings: dict[int, Recording]) -> None:
        self.path = path
        self.recordings = recordings
        sizes = {r.info.world_size for r in recordings.values()}
        self.world_size = max(sizes)
        self.missing = [r for r in range(self.world_size) if r not in recordings]

    @property
    def ranks(self) -> list[int]:
        return list(self.recordings)

    def __getitem__(self, rank: int) -> Recording:
        return self.recordings[rank]

    def global_tensors(self, rank: int, rows: np.ndarray) -> np.ndarray:
        """``rows`` of ``rank``'s tensors table (all its columns), each summary of a
        DTensor's shard replaced by the global tensor's, merged from the ranks that hold
        its other shards (hookdbg/read/shards.py): ``ranks`` names them and
        ``placement`` how the tensor lies; a partial sum (or a placement this version
        does not know) and a replica stay this rank's, with ``ranks`` empty. Rows of
        plain tensors are as they were."""
        out = np.zeros(len(rows), dtype=GLOBAL)
        for name in rows.dtype.names or ():
            out[name] = rows[name]
        mine = self[rank]
        places = mine.shards
        if not places or not len(rows):
            return out
        wanted = [_place(r) for r in rows]
        sharded = [i for i, p in enumerate(wanted) if p in places]
        if not sharded:
            return out
        keys = _keys(mine, rows)
        steps = rows["step"][sharded]
        lo, hi = int(steps.min()), int(steps.max())
        names = {mine.modules.name(int(rows["module"][i])) for i in sharded}
        others: dict[int, dict[tuple, np.void]] = {}
        for i in sharded:
            shard = places[wanted[i]]
            out["placement"][i] = shard.text.encode()
            if shard.partial or not shard.sharded:  # no global values yet; a replica
                continue
            holders = [q for q in shard.holders() if q in self.recordings]
            if len(holders) < len(shard.holders()):
                continue  # a rank's file is missing: no whole tensor
            pieces = []
            for q in holders:
                if q == rank:
                    pieces.append(rows[i])
                    continue
                if q not in others:
                    others[q] = _rows_by_key(self[q], lo, hi, names)
                piece = others[q].get(keys[i])
                if piece is not None:
                    pieces.append(piece)
            if len(pieces) < len(holders):
                continue
            for column, value in merge(pieces).items():
                out[column][i] = value
            out["shape"][i] = shard.shape.encode()
            out["ranks"][i] = ",".join(map(str, holders)).encode()
        return out

    def to_pandas(
        self,
        table: str,
        rank: int | None = None,
        first: int | None = None,
        last: int | None = None,
        merged: bool = False,
    ) -> pd.DataFrame:
        """``Recording.to_pandas`` of one rank (the first by default); with ``merged``,
        the tensors table's summaries of DTensor shards as their global tensors'
        (``global_tensors``), with the columns ``ranks`` and ``placement``."""
        rec = self[self.ranks[0] if rank is None else rank]
        if not merged:
            return rec.to_pandas(table, first, last)
        if table != "tensors":
            raise ValueError("merged= applies to the tensors table")
        rows = read_rows(rec, "tensors", first, last)
        return resolve(rec, "tensors", self.global_tensors(rec.info.rank, rows)).to_pandas()

    def check(self) -> None:
        """Check every rank's file whole now (``Recording.check``)."""
        for rec in self.recordings.values():
            rec.check()

    def close(self) -> None:
        for rec in self.recordings.values():
            rec.close()

    def __enter__(self) -> RankSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _place(row: np.void) -> Place:
    return (int(row["module"]), int(row["phase"]), int(row["slot"]), utf8(row["path"]))


def _keys(rec: Recording, rows: np.ndarray) -> list[tuple]:
    """A key for each row that names the same tensor on every rank: its step and
    segment, module name, phase, slot, path, and which occurrence of those it is."""
    seen: dict[tuple, int] = {}
    out = []
    for r in rows:
        base = (
            int(r["step"]),
            int(r["segment"]),
            rec.modules.name(int(r["module"])),
            int(r["phase"]),
            int(r["slot"]),
            bytes(r["path"]),
        )
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.append((*base, n))
    return out


def _rows_by_key(rec: Recording, lo: int, hi: int, names: set[str]) -> dict[tuple, np.void]:
    """One rank's tensor rows of modules ``names`` in steps ``lo``..``hi``, by key."""
    ids = [m.id for m in rec.modules if m.name in names]
    rows = rec.tensors(lo, hi, kind=None)
    rows = rows[np.isin(rows["module"], ids)]
    return dict(zip(_keys(rec, rows), rows, strict=True))


def open_run(path: str | os.PathLike[str]) -> Recording | RankSet:
    """A recording file, or, if ``path`` does not exist but ``path.rankN`` files do, the
    set of them. Raises RecordingError (one line) for anything unreadable."""
    p = Path(path)
    if p.exists():
        return open_recording(p)
    files = rank_files(p)
    if not files:
        pattern = rank_file(p, 0).name.replace(".rank0", ".rankN")
        raise RecordingError(f"{p}: no such file (nor per-rank files {pattern})")
    opened: dict[int, Recording] = {}
    try:
        for rank, file in files.items():
            opened[rank] = open_recording(file)
            if opened[rank].info.rank != rank:
                raise RecordingError(
                    f"{file} says it is rank {opened[rank].info.rank}, its name says rank {rank}"
                )
    except BaseException:
        for rec in opened.values():
            rec.close()
        raise
    return RankSet(p, opened)
