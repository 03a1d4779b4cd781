"""Helpers shared by the tests: running hookdbg for real and reading files with h5py alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"


def hookdbg(
    *args: str | os.PathLike[str],
    cwd: str | os.PathLike[str] | None = None,
    timeout: float = 180,
    env: dict[str, str] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the real ``hookdbg`` command line in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "hookdbg", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
        env={**os.environ, **(env or {})},
    )


def tables(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every table of a recording as a structured array, read with h5py alone (as any
    user could): each table is a group of equal-length columns."""
    out = {}
    with h5py.File(path, "r", swmr=True) as f:
        for name, group in f.items():
            if isinstance(group, h5py.Group):
                columns = {c: group[c][()] for c in group}
                n = min(len(c) for c in columns.values())
                out[name] = np.rec.fromarrays(
                    [c[:n] for c in columns.values()], names=list(columns)
                )
    return out


def module_names(t: dict[str, np.ndarray]) -> dict[int, str]:
    return {int(r["id"]): r["name"].decode() for r in t["modules"]}


def module_id(t: dict[str, np.ndarray], name: str) -> int:
    ids = [i for i, n in module_names(t).items() if n == name]
    assert ids, f"no module {name!r} in {sorted(module_names(t).values())}"
    return ids[0]
