"""How reading a distributed run's N rank files compares with reading one.

Records `samples/numnet_mlp.py --steps 300` once and copies it as N ranks (run.rank0.h5
... with rank and world size rewritten), and once more as N ranks without the copy of
their small tables (as a hookdbg before it wrote them: every column read). Then times
what a user runs: `hookdbg summary` and `hookdbg alerts` as subprocesses (median and
best of --repeat runs, with Python's bytecode cache as an installed package has it), opening
in-process (`open_recording` of one file, `open_run` of all N), and the TUI until its
replay screen is drawn (headless, in-process). Target (issue: sharded training): N
ranks in about the time of one.

    python benchmarks/ranks.py [--ranks 8] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
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
from hookdbg.store import schema

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "numnet_mlp.py"
STEPS = ["--steps", "300"]


def make_run(folder: Path, ranks: int, name: str = "run", small: bool = True) -> Path:
    """One recording (``one.h5``, made once), copied as ``ranks`` ranks of one run;
    the run's name. ``small``: keep the copy of the small tables."""
    one = folder / "one.h5"
    if not one.exists():
        argv = [sys.executable, "-m", "hookdbg", "record", "-q", "-o", str(one), str(SAMPLE)]
        subprocess.run([*argv, *STEPS], check=True, stdout=subprocess.DEVNULL)
    for rank in range(ranks):
        copy = folder / f"{name}.rank{rank}.h5"
        shutil.copy(one, copy)
        with h5py.File(copy, "r+") as f:
            f.attrs["rank"], f.attrs["local_rank"], f.attrs["world_size"] = rank, rank, ranks
            if not small:
                del f[schema.SMALL]
    return folder / f"{name}.h5"


def timings(run: Callable[[], object], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


# as an installed package runs: its modules' bytecode cached (a first run writes it)
_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def command(*args: str) -> Callable[[], object]:
    argv = [sys.executable, "-m", "hookdbg", *args]
    return lambda: subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=_ENV)


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
        columns = make_run(Path(tmp), args.ranks, "columns", small=False)
        one = Path(tmp) / "one.h5"
        command("summary", str(one))()  # Python writes the bytecode cache
        n = f"{args.ranks} ranks"
        rows = [
            ("summary", *(command("summary", str(p)) for p in (one, columns, run))),
            ("alerts", *(command("alerts", str(p)) for p in (one, columns, run))),
            ("open (in process)", opened(one, False), opened(columns, True), opened(run, True)),
            (
                "tui drawn (in process)",
                tui_opened(one, False),
                tui_opened(columns, True),
                tui_opened(run, True),
            ),
        ]
        measured = [(what, [timings(f, args.repeat) for f in fs]) for what, *fs in rows]
        # the TUI's times are bimodal (Textual's frames and timers): the best says more
        for name, statistic in (("median", statistics.median), ("best", min)):
            print(f"\n{name:<22} {'one rank':>9} {n + ', columns':>17} {n:>17}")
            for what, (a, b, c) in measured:
                a, b, c = statistic(a), statistic(b), statistic(c)
                cells = [f"{t * 1e3:7.0f}ms ({t / a:4.2f}x)" for t in (b, c)]
                print(f"{what:<22} {a * 1e3:7.0f}ms {cells[0]:>17} {cells[1]:>17}")


if __name__ == "__main__":
    main()
