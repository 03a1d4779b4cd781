"""A distributed run: one recording per rank (run.rank0.h5, run.rank1.h5, ...) read as
one run. Under torchrun each rank writes its own file (no cross-rank locking on one
HDF5 file); this module opens them from the name the user gave (run.h5), found by the
naming rule of hookdbg/ranks.py."""

from __future__ import annotations

import os
from pathlib import Path

from hookdbg.ranks import rank_file, rank_files
from hookdbg.read.recording import Recording, RecordingError, open_recording

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

    def close(self) -> None:
        for rec in self.recordings.values():
            rec.close()

    def __enter__(self) -> RankSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
