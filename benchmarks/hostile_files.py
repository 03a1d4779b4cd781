"""What hostile files cost the readers: every file of the hostile-file suite
(tests/read/hostile.py: damaged attributes, datasets, tables, links, storage, filters,
values, and small files that claim or hold far more) through every reader command, each
file in its own process limited to ``--limit`` of address space; prints each family's
files, how they ended, the peak memory of its worst file and its slowest command, then
every file that expands.

    python benchmarks/hostile_files.py [--limit-gib 2] [--only expanding]

Run it from the repository root (it uses the test suite's files and runner).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import h5py

from hookdbg.store import schema
from tests.read import hostile

ROOT = Path(__file__).resolve().parent.parent
OLD = ROOT / "tests" / "data" / "nan_a.h5"  # schema 1: the suite damages it where it can
OTHER = ROOT / "tests" / "data" / "nan_b.h5"


def record(path: Path) -> Path:
    """A recording of today's schema (every table): samples/nan_blowup.py, 5 steps."""
    script = ROOT / "samples" / "nan_blowup.py"
    command = [sys.executable, "-m", "hookdbg", "record", "-q", "-o", str(path)]
    subprocess.run([*command, str(script), "--steps", "5"], check=True, capture_output=True)
    return path


def families(new: Path, tmp: Path) -> Iterator[tuple[str, Path, list[tuple[str, object]]]]:
    """(family, the recording it damages, its variants), as tests/read/test_hostile.py
    makes them."""
    with h5py.File(OLD, "r") as f:
        yield "attributes", OLD, list(hostile.attribute_variants(f))
    for table in [*schema.TABLES, schema.CAPTURE_DATA]:
        base = new if table in ("losses", "shards", "device_times") else OLD
        with h5py.File(base, "r") as f:
            yield f"columns of {table}", base, list(hostile.dataset_variants(f, table))
    yield "structure", OLD, list(hostile.structure_variants(OLD, OTHER, tmp))
    yield "structure (schema 6)", new, list(hostile.structure_variants(new, OTHER, tmp))
    yield "values", OLD, list(hostile.value_variants())
    yield "files that expand", new, list(hostile.expanding_variants(schema.TABLES))


def run(path: Path, tmp: Path, limit: int) -> tuple[list[dict], int, float]:
    """Every reader command on ``path`` in one process: its reports, peak RSS, wall time."""
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "tests.read.bounded", str(limit), path, OLD, tmp],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    *reports, peak = map(json.loads, out.stdout.splitlines())
    return reports, int(peak["peak_rss"]), time.perf_counter() - start


def outcome(reports: list[dict]) -> str:
    codes = {r["exit_code"] for r in reports}
    if any(r["exception"] for r in reports):
        return "RAISED"
    return "refused" if codes == {2} else "answered"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit-gib", type=float, default=2.0)
    parser.add_argument("--only", help="families whose name contains this")
    args = parser.parse_args()
    limit = int(args.limit_gib * (1 << 30))
    heads = ("files", "refused", "answered", "peak MB", "slowest")
    print(f"{'family':<26} " + " ".join(f"{h:>8}" for h in heads))
    total_files = total_commands = 0
    worst_peak, slowest = 0, 0.0
    expanding: list[tuple[str, int, str, int, float, str]] = []
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        new = record(tmp / "new.h5")
        for family, base, made in families(new, tmp):
            if args.only and args.only not in family:
                continue
            counts = {"refused": 0, "answered": 0, "RAISED": 0}
            peak_family, slow_family = 0, 0.0
            for i, (name, mutate) in enumerate(made):
                path = hostile.make(base, tmp / f"v{i}.h5", mutate)  # type: ignore[arg-type]
                reports, peak, _ = run(path, tmp, limit)
                ended = outcome(reports)
                counts[ended] += 1
                slow = max(reports, key=lambda r: r["seconds"])
                peak_family = max(peak_family, peak)
                slow_family = max(slow_family, slow["seconds"])
                total_commands += len(reports)
                if family == "files that expand":
                    expanding.append(
                        (name, path.stat().st_size, ended, peak, slow["seconds"], slow["args"][0])
                    )
            total_files += len(made)
            worst_peak, slowest = max(worst_peak, peak_family), max(slowest, slow_family)
            raised = f"  {counts['RAISED']} RAISED" if counts["RAISED"] else ""
            print(
                f"{family:<26} {len(made):>8} {counts['refused']:>8} {counts['answered']:>8} "
                f"{peak_family / 1e6:>8.0f} {slow_family:>7.2f}s{raised}",
                flush=True,
            )
    print(
        f"{total_files} files x {total_commands // max(total_files, 1)} commands: peak "
        f"{worst_peak / 1e6:.0f} MB, slowest command {slowest:.2f} s (limit {args.limit_gib} GiB)"
    )
    if expanding:
        print(f"\n{'file that expands':<42} {'on disk':>8} {'':>8} {'peak MB':>8} {'slowest':>16}")
        for name, size, ended, peak, seconds, command in expanding:
            print(
                f"{name:<42} {size / 1e6:>6.1f}MB {ended:>8} {peak / 1e6:>8.0f} "
                f"{seconds:>6.2f}s {command}"
            )


if __name__ == "__main__":
    main()
