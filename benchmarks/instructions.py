"""Instructions per module call: hookdbg's cost counted by callgrind, not timed.

On a shared machine wall and CPU times move by 10-30% from one minute to the next;
instruction counts do not. Each configuration runs the tiny-MLP benchmark under
``valgrind --tool=callgrind`` in its own process, counting only the training thread
and only its steady loop (a few steps after the recording started; the count is reset
before the loop and taken after it through callgrind's client requests, which a tiny C
library compiled here issues). The table gives instructions per module call above the
unrecorded run. The writer thread is not counted: it runs beside the training thread.
``floor`` is overhead.py's minimal forward and backward timing hooks, in Python: what
timing each call costs with PyTorch's hooks and nothing else, the floor under
``--level timing``.

    python benchmarks/instructions.py                      # every configuration
    python benchmarks/instructions.py --only timing,stats  # a few
    python benchmarks/instructions.py --steps 60           # more steps (slower)

Needs valgrind (with its headers) and a C compiler; each run takes a minute or two.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import ctypes
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FLOOR = "floor"  # overhead.py's minimal forward and backward timing hooks: under --level timing
CONTROL = r"""
#include <valgrind/callgrind.h>
void hookdbg_zero(void) { CALLGRIND_ZERO_STATS; }
void hookdbg_dump(void) { CALLGRIND_DUMP_STATS_AT("loop"); }
"""


def configs() -> dict[str, dict[str, object]]:
    """versus.py's configurations, and ``idle`` (``record --idle``: no step recorded, the
    loss watched), which older revisions lack."""
    from versus import CONFIGS

    return {
        **CONFIGS,
        "idle": {"idle": True},
        "idle-unchecked": {"idle": True, "nan_check": False},
    }


def child(config: str, steps: int, control: str) -> None:
    """Run inside callgrind: warm up, count ``steps`` steps of the MLP, dump."""
    import torch
    from overhead import fwd_bwd_timing_hooks, mlp

    import hookdbg

    lib = ctypes.CDLL(control)
    torch.set_num_threads(1)
    step, _ = mlp()
    with tempfile.TemporaryDirectory() as tmp:
        recording: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
        if config == FLOOR:
            recording = fwd_bwd_timing_hooks(Path(tmp))
        elif config != "none":
            recording = hookdbg.record(
                Path(tmp) / "run.h5", quiet=True, force=True, **configs()[config]
            )
        with recording:
            for _ in range(5):
                step()
            lib.hookdbg_zero()
            for _ in range(steps):
                step()
            lib.hookdbg_dump()


def count(config: str, steps: int, control: Path, workdir: Path) -> int:
    """The training thread's instructions over the counted loop of one configuration."""
    out = workdir / f"callgrind.{config}"
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--separate-threads=yes",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--child",
            config,
            "--steps",
            str(steps),
            "--control",
            str(control),
        ],
        check=True,
        capture_output=True,
    )
    dumps = sorted(workdir.glob(f"callgrind.{config}.*-01"))  # the dump at the loop's end
    if not dumps:
        raise SystemExit(f"callgrind wrote no dump for {config}")
    found = re.search(r"^summary: (\d+)$", dumps[-1].read_text(), re.MULTILINE)
    if found is None:
        raise SystemExit(f"no summary line in {dumps[-1]}")
    return int(found.group(1))


def main() -> None:
    from overhead import mlp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    choices = [FLOOR, *configs()]
    parser.add_argument("--only", default=",".join(choices), help="configurations, comma-separated")
    parser.add_argument("--steps", type=int, default=30, help="steps counted per configuration")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--control", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps, args.control)
        return
    names = args.only.split(",")
    unknown = [n for n in names if n not in choices]
    if unknown:
        parser.error(f"unknown configuration {unknown[0]!r}; choose from {', '.join(choices)}")
    for tool in ("valgrind", "cc"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed (not found on PATH)")
    _, calls = mlp()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        source = workdir / "control.c"
        source.write_text(CONTROL)
        control = workdir / "libcontrol.so"
        subprocess.run(
            ["cc", "-shared", "-fPIC", "-O1", str(source), "-o", str(control)], check=True
        )
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            futures = {
                c: pool.submit(count, c, args.steps, control, workdir) for c in ["none", *names]
            }
            totals = {c: f.result() for c, f in futures.items()}
    per_call = {c: totals[c] / (args.steps * calls) for c in totals}
    print(f"tiny MLP, {calls} module calls a step, {args.steps} steps counted: instructions")
    print(f"per module call on the training thread (unrecorded: {per_call['none']:,.0f})")
    for name in names:
        print(f"  {name:8s} {per_call[name] - per_call['none']:+10,.0f}")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
