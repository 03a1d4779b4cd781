"""How reading a distributed run's N rank files compares with reading one.

Records `samples/numnet_mlp.py --steps 300` once and copies it as N ranks (run.rank0.h5
... with rank and world size rewritten), then times what a user runs: `hookdbg summary`
and `hookdbg alerts` as subprocesses (median of --repeat runs, one rank's file against
the N-rank run), opening in-process (`open_recording` of one file, `open_run` of all
N), and the TUI until its replay screen is drawn (headless, in-process). Target
(issue: sharded training): N ranks in about the time of one.

    python benchmarks/ranks.py [--ranks 8] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import h5py

from hookdbg.read import RankSet, open_recording, open_run

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "numnet_mlp.py"
STEPS = ["--steps", "300"]


def make_run(folder: Path, ranks: int) -> Path:
    """One recording, copied as ``ranks`` ranks of one run; the run's name."""
    one = folder / "one.h5"
    subprocess.run(
        [sys.executable, "-m", "hookdbg", "record", "-q", "-o", str(one), str(SAMPLE), *STEPS],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    for rank in range(ranks):
        copy = folder / f"run.rank{rank}.h5"
        shutil.copy(one, copy)
        with h5py.File(copy, "r+") as f:
            f.attrs["rank"], f.attrs["local_rank"], f.attrs["world_size"] = rank, rank, ranks
    return folder / "run.h5"


def median_seconds(run: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def command(*args: str) -> Callable[[], object]:
    argv = [sys.executable, "-m", "hookdbg", *args]
    return lambda: subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)


def opened(path: Path, many: bool) -> Callable[[], object]:
    def run() -> None:
        if many:
            for rec in open_run(path).recordings.values():
                rec.close()
        else:
            open_recording(path).close()

    return run


def tui_opened(path: Path, many: bool) -> Callable[[], object]:
    """What ``hookdbg tui`` does before the user can act: open (every rank), check the
    shown rank's tables, and draw the replay screen with its workers done (Textual's
    headless pilot)."""
    from hookdbg.tui.app import HookdbgApp

    async def drawn() -> None:
        run = open_run(path) if many else open_recording(path)
        ranks = [run[r] for r in run.ranks] if isinstance(run, RankSet) else [run]
        ranks[0].check()
        app = HookdbgApp(ranks[0], more_ranks=ranks[1:])
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause(0.01)
            await app.workers.wait_for_complete()
        run.close()

    return lambda: asyncio.run(drawn())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = make_run(Path(tmp), args.ranks)
        one = Path(tmp) / "one.h5"
        print(f"{'what':<22} {'one rank':>9} {f'{args.ranks} ranks':>9} {'ratio':>6}")
        for what, single, many in [
            ("summary", command("summary", str(one)), command("summary", str(run))),
            ("alerts", command("alerts", str(one)), command("alerts", str(run))),
            ("open (in process)", opened(one, False), opened(run, True)),
            ("tui drawn (in process)", tui_opened(one, False), tui_opened(run, True)),
        ]:
            a, b = median_seconds(single, args.repeat), median_seconds(many, args.repeat)
            print(f"{what:<22} {a * 1e3:7.0f}ms {b * 1e3:7.0f}ms {b / a:5.2f}x")


if __name__ == "__main__":
    main()
