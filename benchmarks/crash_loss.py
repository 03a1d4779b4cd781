"""How much finished work a ``kill -9`` loses: SIGKILL a recorded training run at random
moments and compare the steps it finished (it prints each as it finishes) with the
steps its recording holds.

    .venv/bin/python benchmarks/crash_loss.py --kills 20
    .venv/bin/python benchmarks/crash_loss.py --kills 20 --capture

The promise (README): at most ``--flush-interval`` seconds (default 1) of finished
work, whatever the training thread is doing; the script here alternates fast steps with
pauses, as data loading does. With ``--capture`` every tensor of every module is
captured (``--capture '*'``) on a wider model (512-1024-512 on batches of 256): some
15 MB a step, more than the writer compresses and writes in that time, so captured
bytes are always waiting when the kill comes.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = """
import sys, time, torch
from torch import nn
width, hidden, batch = map(int, sys.argv[2:5])
model = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, width))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
with open(sys.argv[1], "w") as done:
    done.write(f"start {time.time()}\\n")
    for step in range(100000):
        opt.zero_grad()
        model(torch.randn(batch, width)).pow(2).mean().backward()
        opt.step()
        done.write(f"{step} {time.time()}\\n")
        done.flush()  # in the page cache: a kill -9 of this process keeps it
        time.sleep(0.5 if step % 10 == 9 else 0.01)  # a data-loading pause every 10 steps
"""


# the script's model and batch: (width, hidden width, batch)
PLAIN, CAPTURING = (64, 256, 32), (512, 1024, 256)


def one_kill(
    workdir: Path, flush: float, capture: bool, rng: random.Random
) -> tuple[float, int, int]:
    script, path, log = workdir / "train.py", workdir / "run.h5", workdir / "done.txt"
    script.write_text(TRAIN)
    path.unlink(missing_ok=True)
    log.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "hookdbg", "record", "-q", "--flush-interval", str(flush)]
    if capture:
        cmd += ["--capture", "*", "--capture-budget", "100000"]
    shape = [str(n) for n in (CAPTURING if capture else PLAIN)]
    proc = subprocess.Popen([*cmd, "-o", str(path), str(script), str(log), *shape])
    deadline = time.time() + 300
    while not log.exists() and time.time() < deadline:  # start-up: 3 to 10 s on a busy
        time.sleep(0.05)  # machine, so the moment is drawn from the script's start
    time.sleep(rng.uniform(1, 5))  # a random moment while it trains
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lines = [line.split() for line in log.read_text().splitlines() if line]
    if not lines:
        return 0.0, 0, 0  # killed before the script began: nothing was finished
    start = float(lines[0][1])
    finished = [float(at) for _, at in lines[1:]]
    out = subprocess.run(
        [sys.executable, "-m", "hookdbg", "summary", "--json", str(path)],
        capture_output=True,
        text=True,
    )
    in_file = json.loads(out.stdout)["steps"] if out.returncode == 0 else 0
    done = len(finished)
    # finished work not in the file: from the newest step it holds to the newest finished
    lost = 0.0 if in_file >= done else finished[-1] - (finished[in_file - 1] if in_file else start)
    return lost, done, in_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--flush-interval", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--capture", action="store_true", help="capture every tensor of a wider model"
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    losses = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.kills):
            lost, done, held = one_kill(Path(tmp), args.flush_interval, args.capture, rng)
            losses.append(lost)
            print(f"kill {i + 1:2d}: {done} steps finished, {held} in the file, {lost:.3f} s lost")
    losses.sort()
    what = f"--flush-interval {args.flush_interval}" + (", --capture" if args.capture else "")
    print(
        f"finished work lost over {args.kills} kills ({what}): "
        f"median {losses[len(losses) // 2]:.3f} s, worst {losses[-1]:.3f} s"
    )


if __name__ == "__main__":
    main()
