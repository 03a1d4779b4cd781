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
3. A flood (``--flood``): the tiny MLP trained idle while the control file receives
   100,000 lines (valid commands and bad lines mixed) in ten bursts; each burst's steps
   until it is drained against as many steps with nothing to read, interleaved; the CPU
   time per step (all threads) of each, how fast the lines drain, and whether every
   valid command was answered once, in order.

    python benchmarks/steering.py
    python benchmarks/steering.py --rounds 3 --steps 20000
    python benchmarks/steering.py --flood            # only the flood; minutes
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from overhead import Costs, hookdbg_idle, keep_freed_memory, measure, mlp, resnet18

from hookdbg.control import Command, control_path, send
from hookdbg.read import Status, open_recording
from hookdbg.recorder import record

ROOT = Path(__file__).resolve().parent.parent


def unrecorded_steps(workdir: Path) -> contextlib.AbstractContextManager[object]:
    """For reference: steps a recording skips (``--every``), the loss not watched."""
    return record(workdir / "every.h5", every=10**9, force=True, quiet=True)


def cost(rounds: int) -> None:
    for name, make, steps, warmup in (("mlp", mlp, 400, 20), ("resnet18", resnet18, 8, 4)):
        step, calls = make()
        contexts = {"unrecorded": None, "--every": unrecorded_steps, "idle": hookdbg_idle}
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


def flood(commands: int, bursts: int = 10) -> None:
    step, calls = mlp()
    per_burst = commands // bursts
    quiet: list[float] = []  # CPU seconds per step (all threads) with nothing to read
    flooded: list[float] = []  # ... while a burst is read
    looks: list[float] = []  # training-thread seconds a step spent reading and answering
    writing: list[float] = []  # writer-thread seconds a step, flooded minus quiet
    valid: list[int] = []
    drained = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "flood.h5"
        ctl = control_path(out)
        with record(out, idle=True, force=True, quiet=True) as rec:
            steer, looked = rec._steer, [0.0]

            def timed_steer(at: int) -> bool:
                begun = time.thread_time()
                try:
                    return steer(at)
                finally:
                    looked[0] += time.thread_time() - begun

            rec._steer = timed_steer  # type: ignore[method-assign]
            writer = _writer_clock(rec)
            for _ in range(20):
                step()
            seq = send(ctl, op="level", level="idle").seq
            for _ in range(bursts):
                lines = []
                for i in range(per_burst):
                    seq += 1
                    if i % 4 == 3:
                        lines.append(b"not a command\n")
                    elif i % 4 == 2:
                        lines.append(b'{"seq": %d, "op": "explode"}\n' % seq)  # refused
                    else:
                        op = {"op": "dump"} if i % 2 else {"op": "level", "level": "idle"}
                        lines.append(Command(seq=seq, **op).line())  # type: ignore[arg-type]
                        valid.append(seq)
                with open(ctl, "ab") as f:  # written before the timed steps begin
                    f.write(b"".join(lines))
                reader = rec.steering.reader
                assert reader is not None
                size = ctl.stat().st_size
                wall, cpu, n = time.perf_counter(), time.process_time(), 0
                looked[0], wrote = 0.0, time.clock_gettime(writer)
                while reader.offset < size:
                    step()
                    n += 1
                drained += time.perf_counter() - wall
                flooded.append((time.process_time() - cpu) / n)
                looks.append(looked[0] / n)
                wrote = time.clock_gettime(writer) - wrote
                cpu, quiet_wrote = time.process_time(), time.clock_gettime(writer)
                for _ in range(n):
                    step()
                quiet.append((time.process_time() - cpu) / n)
                writing.append((wrote - (time.clock_gettime(writer) - quiet_wrote)) / n)
            rec.flush()
        answered = [seq for _, seq, _, _ in open_recording(out).answers_from(0)[0]]
    answered_valid = [seq for seq in answered if seq in set(valid)]
    base, hit = statistics.median(quiet), statistics.median(flooded)
    spread = max(quiet) / min(quiet)
    look, wrote = statistics.median(looks), statistics.median(writing)
    print(
        f"flood: {bursts} bursts of {per_burst:,} lines (half valid commands, a quarter "
        f"numbered and refused, a quarter garbage) while the tiny MLP trains idle "
        f"({calls} module calls a step, {base * 1e3:.3f} ms CPU a step with nothing to "
        f"read, {spread:.3f}x between the fastest and slowest quiet stretch): "
        f"{hit / base:.3f}x CPU per step while a burst is read (median of bursts; each "
        f"burst against as many steps after it); the channel's own cost a step: "
        f"{look * 1e6:.1f} us reading and answering on the training thread "
        f"({look / base:.2%}), {wrote * 1e6:+.1f} us on the writer thread "
        f"({wrote / base:+.2%}); {commands / drained:,.0f} lines read a second; valid "
        f"commands answered once and in order: {answered_valid == valid} "
        f"({len(answered_valid):,} of {len(valid):,})"
    )


def _writer_clock(rec: object) -> int:
    """The CPU clock of the recording's writer thread."""
    for thread in threading.enumerate():
        if thread.name == "hookdbg-writer" and thread.ident is not None:
            return time.pthread_getcpuclockid(thread.ident)
    raise RuntimeError(f"{rec} has no writer thread")


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
    parser.add_argument("--flood", action="store_true", help="measure a flood only")
    parser.add_argument("--commands", type=int, default=100_000, help="lines of the flood")
    args = parser.parse_args()
    keep_freed_memory()
    torch.set_num_threads(1)  # as benchmarks/overhead.py: less noise on a shared machine
    if args.flood:
        flood(args.commands)
        return
    cost(args.rounds)
    steered_run(args.steps)


if __name__ == "__main__":
    main()
