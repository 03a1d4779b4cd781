"""Which rank this process is, and the one naming rule for per-rank recordings.

Under torchrun each rank of a distributed run writes its own file (no cross-rank
locking on one HDF5 file): ``run.h5`` becomes ``run.rank0.h5``, ``run.rank1.h5``, ...,
and readers given ``run.h5`` find them by the same rule. The CLI, ``hookdbg.record``,
the framework callbacks, the run metadata and the readers all go through this module,
so the rule lives in one place. It imports nothing heavy (no torch), so the readers can
use it.
"""

from __future__ import annotations

import glob
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_MARK = ".rank"


@dataclass(frozen=True)
class Placement:
    """Where this process sits in a distributed run (``world_size`` 1: not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def prefix(self) -> str:
        """'hookdbg: ', or 'hookdbg[rank 1]: ' on one of several ranks: status lines of
        several ranks interleave on one terminal."""
        return f"hookdbg[rank {self.rank}]: " if self.distributed else "hookdbg: "


def placement(env: Mapping[str, str] | None = None) -> Placement:
    """This process's placement: torch.distributed's own, once the script has set it up,
    else what the launcher put in the environment (torchrun: ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``). Lightning's launcher sets ``WORLD_SIZE`` and ``LOCAL_RANK`` but no
    ``RANK``: on one node the local rank is the rank."""
    live = initialized_process_group()
    env = os.environ if env is None else env
    local = _int(env.get("LOCAL_RANK"), 0)
    if live is not None:
        return Placement(live[0], live[1], local)
    world = max(_int(env.get("WORLD_SIZE"), 1), 1)
    fallback = local if _int(env.get("NODE_RANK", env.get("GROUP_RANK")), 0) == 0 else 0
    rank = _int(env.get("RANK"), fallback)
    return Placement(rank if 0 <= rank < world else 0, world, local)


def initialized_process_group() -> tuple[int, int] | None:
    """(rank, world size) of torch.distributed's default group, if the script has set one
    up; torch is not imported for this (if it is not loaded, nothing was set up)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except (RuntimeError, ValueError):  # a group being torn down
        return None
    return None


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def rank_file(path: str | os.PathLike[str], rank: int) -> Path:
    """``run.h5`` -> ``run.rank3.h5``: rank ``rank``'s file of the run named ``path``."""
    p = Path(path)
    return p.with_name(f"{p.stem}{_MARK}{rank}{p.suffix}")


def rank_path(path: str | os.PathLike[str], where: Placement | None = None) -> Path:
    """The file this process records into when asked for ``path``: ``path`` itself in a
    single process, its rank file (``run.rank1.h5``) on one of several ranks."""
    where = placement() if where is None else where
    return rank_file(path, where.rank) if where.distributed else Path(path)


def rank_of(path: str | os.PathLike[str], candidate: str | os.PathLike[str]) -> int | None:
    """The rank whose file of ``path``'s run ``candidate`` is, or None if it is none."""
    p = Path(path)
    pattern = rf"{re.escape(p.stem)}{re.escape(_MARK)}(\d+){re.escape(p.suffix)}"
    m = re.fullmatch(pattern, Path(candidate).name)
    return int(m.group(1)) if m else None


def run_of(candidate: str | os.PathLike[str]) -> Path | None:
    """``run.rank1.h5`` -> ``run.h5``: the run a rank's file belongs to (None: it is
    no rank's file)."""
    p = Path(candidate)
    run = p.with_name(p.stem.rpartition(_MARK)[0] + p.suffix)
    return run if run.stem and rank_of(run, p) is not None else None


def rank_files(path: str | os.PathLike[str]) -> dict[int, Path]:
    """``{rank: file}`` of the per-rank recordings that ``path`` names, by rank."""
    p = Path(path)
    found = {}
    for candidate in p.parent.glob(f"{glob.escape(p.stem)}{_MARK}*{glob.escape(p.suffix)}"):
        rank = rank_of(p, candidate)
        if rank is not None:
            found[rank] = candidate
    return dict(sorted(found.items()))
