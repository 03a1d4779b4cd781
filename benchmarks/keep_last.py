"""What a long run's file comes to under ``--keep-last N``, and what the rewrites cost.

samples/long_run.py (Linear 16-64-1) recorded at ``--level stats`` for every step, for
two run lengths, with and without ``--keep-last``: the closed file's size, and the run's
wall time (imports included). With ``--keep-last`` the size grows by each step's row and
loss, and older detail not yet dropped (the slope per step is printed).

    python benchmarks/keep_last.py
    python benchmarks/keep_last.py --keep 20 --steps 2000,8000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(steps: int, keep: int, out: Path) -> tuple[float, int]:
    command = [sys.executable, "-m", "hookdbg", "record", "-q", "-f", "-o", str(out)]
    if keep:
        command += ["--keep-last", str(keep)]
    script = [str(ROOT / "samples" / "long_run.py"), "--steps", str(steps), "--pause", "0"]
    start = time.perf_counter()
    subprocess.run([*command, *script], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start, os.path.getsize(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=int, default=10, help="--keep-last N")
    parser.add_argument("--steps", default="2000,8000", help="run lengths, comma-separated")
    args = parser.parse_args()
    lengths = [int(s) for s in args.steps.split(",")]
    print(f"samples/long_run.py at --level stats, every step recorded; --keep-last {args.keep}")
    print(f"{'steps':>7} {'all kept':>12} {'kept last':>12} {'time all':>9} {'time kept':>10}")
    sizes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for steps in lengths:
            t_all, s_all = run(steps, 0, Path(tmp) / "all.h5")
            t_kept, s_kept = run(steps, args.keep, Path(tmp) / "kept.h5")
            sizes[steps] = s_kept
            print(
                f"{steps:>7} {s_all / 1e3:>9.1f} kB {s_kept / 1e3:>9.1f} kB "
                f"{t_all:>8.1f}s {t_kept:>9.1f}s"
            )
    if len(lengths) > 1:
        a, b = lengths[0], lengths[-1]
        slope = (sizes[b] - sizes[a]) / (b - a)
        print(f"kept file grows by {slope:.1f} bytes per step")


if __name__ == "__main__":
    main()
