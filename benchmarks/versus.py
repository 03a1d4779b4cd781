"""Before and after in one process: hookdbg at a git revision against the working tree.

On a shared machine two runs of overhead.py minutes apart can differ by more than a
change does. This imports the older package under another name (``hookdbg_then``,
extracted from git, its imports renamed, its C extensions built), then, round after
round, records each configuration with the old and the new code in turn, each paired
with an unrecorded run just before it, the order swapped every round; a recorded run is
timed up to and including the recorder's close, as overhead.py times it. It prints the
median over the rounds and the interquartile range.

    python benchmarks/versus.py 45ec9d6                      # tiny MLP, microseconds per call
    python benchmarks/versus.py 45ec9d6 --workload resnet18 --only timing,shapes,stats
    git archive -o then.tar 45ec9d6 hookdbg                  # for a machine without the repo
    python benchmarks/versus.py then.tar --device cuda       # wall time there
"""

from __future__ import annotations

import argparse
import importlib
import io
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from types import ModuleType

import overhead
import torch
from overhead import mlp, resnet18

import hookdbg

ROOT = Path(__file__).resolve().parent.parent
THEN = "hookdbg_then"
CONFIGS: dict[str, dict[str, object]] = {
    "timing": {"level": "timing"},
    "timing-unchecked": {"level": "timing", "nan_check": False},  # without the sentinel
    "shapes": {"level": "shapes"},
    "stats": {"level": "stats"},
    "skip": {"level": "stats", "steps": f"{10**9}:"},  # steps not recorded
    "skip-unchecked": {"level": "stats", "steps": f"{10**9}:", "nan_check": False},
    "hist32": {"level": "stats", "histograms": 32},
}
WORKLOADS = {"mlp": (mlp, 200), "resnet18": (resnet18, 6)}


def package_at(revision: str, into: Path) -> ModuleType:
    """hookdbg as it was at ``revision`` (or in a ``git archive`` tar of it), importable as
    ``hookdbg_then``."""
    if Path(revision).is_file():
        archive = Path(revision).read_bytes()
    else:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", revision, "hookdbg"],
            check=True,
            capture_output=True,
        ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    package = into / THEN
    (into / "hookdbg").rename(package)
    for source in package.rglob("*.py"):
        text = source.read_text()
        text = re.sub(r"\b(from|import) hookdbg\b", rf"\1 {THEN}", text)
        source.write_text(text.replace('"hookdbg.', f'"{THEN}.'))
    for source in [*package.rglob("*.c"), *package.rglob("*.h")]:  # the capsule's module path
        source.write_text(source.read_text().replace('"hookdbg.', f'"{THEN}.'))
    _build_extensions(into)
    sys.path.insert(0, str(into))
    import hookdbg_then  # type: ignore[import-not-found]

    return hookdbg_then  # type: ignore[no-any-return]


def stats_of(package: str) -> ModuleType:
    """Its one-pass statistics module: recorder/summaries/stats.py, or recorder/stats.py
    in revisions from before the recorder had subpackages."""
    try:
        return importlib.import_module(f"{package}.recorder.summaries.stats")
    except ModuleNotFoundError:
        return importlib.import_module(f"{package}.recorder.stats")


def _build_extensions(where: Path) -> None:
    """Its C extensions, built next to its sources (without them it would measure the
    fallbacks)."""
    from setuptools import Distribution, Extension

    sources = sorted(where.glob(f"{THEN}/**/_*.c"))
    names = [".".join(s.relative_to(where).with_suffix("").parts) for s in sources]
    modules = [
        Extension(name, [str(s)], extra_compile_args=["-O3"])
        for name, s in zip(names, sources, strict=True)
    ]
    dist = Distribution({"ext_modules": modules, "script_args": ["-q"]})
    build = dist.get_command_obj("build_ext")
    build.build_temp = str(where / "build")
    build.build_lib = str(where)  # next to the sources
    build.ensure_finalized()
    build.run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "revision", help="the git revision (or a git archive tar of it) to compare with"
    )
    parser.add_argument("--workload", choices=list(WORKLOADS), default="mlp")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--only", default=",".join(CONFIGS), help="configurations, comma-separated")
    parser.add_argument("--device", default="cpu", help="where the model runs (cpu, cuda)")
    args = parser.parse_args()
    names = args.only.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration {unknown[0]!r}; choose from {', '.join(CONFIGS)}")
    torch.set_num_threads(1)
    overhead.keep_freed_memory()
    overhead.DEVICE = torch.device(args.device)
    clock = time.perf_counter if overhead.DEVICE.type == "cuda" else time.process_time
    then = package_at(args.revision, Path(tempfile.mkdtemp(prefix="hookdbg-versus-")))
    if stats_of(THEN)._one_pass is None:  # not a fair match
        sys.exit(f"hookdbg at {args.revision}: its C extensions did not load")
    make, steps = WORKLOADS[args.workload]
    step, calls = make()
    per_call = args.workload == "mlp"  # microseconds per module call; else a step ratio

    def run() -> float:
        t0 = clock()
        for _ in range(steps):
            step()
        return (clock() - t0) / steps

    for _ in range(3):
        step()
    label = Path(args.revision).name if Path(args.revision).is_file() else args.revision
    versions = [(label, then), ("now", hookdbg)]
    figures: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for r in range(args.rounds):
            for name in names:
                for label, package in versions if r % 2 == 0 else versions[::-1]:
                    base = run()
                    path = Path(workdir) / f"{name}.h5"
                    with package.record(path, quiet=True, force=True, **CONFIGS[name]):
                        step()
                        t0 = clock()
                        for _ in range(steps):
                            step()
                    # the close included, as in overhead.py: the writer writes every half
                    # second, so a shorter round's rows are written there (left out, the
                    # writer's work would not count at all)
                    recorded = (clock() - t0) / steps
                    value = (recorded - base) / calls * 1e6 if per_call else recorded / base
                    figures.setdefault((name, label), []).append(value)
            print(f"  round {r + 1}/{args.rounds}", file=sys.stderr)
    unit = "us per module call above unrecorded" if per_call else "step time / unrecorded"
    unit += ", wall time" if clock is time.perf_counter else ", CPU time"
    print(f"{args.workload} on {args.device}, {unit}: median over {args.rounds} rounds (IQR)")
    for name in names:
        cells = []
        for label, _ in versions:
            values = figures[(name, label)]
            q1, _, q3 = statistics.quantiles(values, n=4)
            cells.append(f"{label} {statistics.median(values):8.3f} ({q1:.3f}-{q3:.3f})")
        print(f"  {name:8s} " + "   ".join(cells))


if __name__ == "__main__":
    main()
