"""A long run left idle and steered: what idling costs, how soon a command takes
effect, and how large the file ends.

1. Cost: the tiny MLP and resnet18 of benchmarks/overhead.py, unrecorded and under
   ``hookdbg.record(idle=True)`` (no step recorded; the loss of each step recorded and
   checked; the control file looked at), interleaved in rounds in one process; the
   median step's CPU time, as a ratio and in microseconds per module call.
2. A real run: samples/long_run.py for 20,000 steps under ``hookdbg record --idle``,
   steered three times by ``hookdbg ctl FILE record --steps 5`` from this process;
   for each, the time from running ``ctl`` to the recorder taking the command (the
   answer's time in the file: the first recorded step begins then), and the file's size
   at the end.

    python benchmarks/steering.py
    python benchmarks/steering.py --rounds 3 --steps 20000
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from overhead import Costs, keep_freed_memory, measure, mlp, resnet18

from hookdbg.read import Status, open_recording
from hookdbg.recorder import record

ROOT = Path(__file__).resolve().parent.parent


def idle(workdir: Path) -> contextlib.AbstractContextManager[object]:
    return record(workdir / "idle.h5", idle=True, force=True, quiet=True)


def unrecorded_steps(workdir: Path) -> contextlib.AbstractContextManager[object]:
    """For reference: steps a recording skips (``--every``), the loss not watched."""
    return record(workdir / "every.h5", every=10**9, force=True, quiet=True)


def cost(rounds: int) -> None:
    for name, make, steps, warmup in (("mlp", mlp, 400, 20), ("resnet18", resnet18, 8, 4)):
        step, calls = make()
        contexts = {"unrecorded": None, "--every": unrecorded_steps, "idle": idle}
        runs: dict[str, list[Costs]] = {k: [] for k in contexts}
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(rounds):
                for key, context in contexts.items():
                    runs[key].append(measure(step, context, warmup, steps, Path(tmp)))
        base, skipped, steered = (statistics.median(c.per_step[1] for c in runs[k]) for k in runs)
        print(
            f"{name}: {calls} module calls per step, unrecorded {base * 1e3:.3f} ms CPU; "
            f"idle {steered / base:.3f}x, {(steered - base) / calls * 1e6:+.2f} us per call "
            f"(steps skipped by --every: {skipped / base:.3f}x, "
            f"{(skipped - base) / calls * 1e6:+.2f} us per call; median of {rounds} rounds "
            f"of {steps} steps, 1 thread)"
        )


def steered_run(total: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "long.h5"
        command = [sys.executable, "-m", "hookdbg", "record", "--idle", "-q", "-o", str(out)]
        script = [str(ROOT / "samples" / "long_run.py"), "--steps", str(total), "--pause", "0"]
        start = time.perf_counter()
        proc = subprocess.Popen([*command, *script], stdout=subprocess.PIPE, text=True)
        latencies = []
        for _ in range(3):
            time.sleep(1.5)
            rec = _live(out)
            sent = time.time()
            subprocess.run(
                [sys.executable, "-m", "hookdbg", "ctl", str(out), "record", "--steps", "5"],
                check=True,
                capture_output=True,
            )
            rec.refresh()
            latencies.append(rec.answers[-1][0] - sent)
        printed, _ = proc.communicate(timeout=600)
        seconds = time.perf_counter() - start
        rec = open_recording(out)
        windows = rec.recorded_steps.tolist()
        print(
            f"long run: {len(rec.steps):,} steps in {seconds:.1f} s, steered 3 times: "
            f"recorded steps {windows}; ctl to the first recorded step "
            + ", ".join(f"{s:.2f} s" for s in latencies)
            + f"; file {os.path.getsize(out) / 1e3:.1f} kB ({printed.strip()})"
        )


def _live(path: Path):  # type: ignore[no-untyped-def]
    deadline = time.time() + 60
    while time.time() < deadline:
        with contextlib.suppress(Exception):
            rec = open_recording(path)
            if rec.status is Status.LIVE:
                return rec
        time.sleep(0.1)
    raise RuntimeError(f"{path} never became live")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20_000, help="of the long run")
    args = parser.parse_args()
    keep_freed_memory()
    torch.set_num_threads(1)  # as benchmarks/overhead.py: less noise on a shared machine
    cost(args.rounds)
    steered_run(args.steps)


if __name__ == "__main__":
    main()
