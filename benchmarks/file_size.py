"""A recording's size against what it holds, for a slow run and a fast one.

The same tiny training script runs under ``hookdbg record`` twice: once with a pause
per step (data loading, a slow GPU: the writer flushes many times, each time with few
new rows) and once without. Under SWMR HDF5 never reuses file space, so a file that
grew with its flushes, not its rows, shows here as a slow run's file much larger than
the fast run's. For each run it prints the file's size while recording (just before
the run ends) and after, the bytes its datasets store, and their ratio.

    python benchmarks/file_size.py                  # 600 steps, 0.1 s pause: ~70 s
    python benchmarks/file_size.py --steps 200 --pause 0.05
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import h5py

SCRIPT = textwrap.dedent(
    """
    import os, sys, time, torch
    steps, pause, size_file = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        x = torch.randn(16, 32)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(pause)
    time.sleep(2.5)  # two flushes: what was recorded is in the file, still being written
    recording = os.environ["HOOKDBG_BENCH_FILE"]
    open(size_file, "w").write(str(os.path.getsize(recording)))
    """
)


def stored_bytes(path: Path) -> int:
    """The bytes HDF5 stores for the file's datasets (their chunks, compressed)."""
    total = 0

    def add(_name: str, obj: object) -> None:
        nonlocal total
        if isinstance(obj, h5py.Dataset):
            total += obj.id.get_storage_size()

    with h5py.File(path, "r") as f:
        f.visititems(add)
    return total


def run(tmp: Path, name: str, steps: int, pause: float) -> tuple[int, int, int]:
    script, recording, live = tmp / "train.py", tmp / f"{name}.h5", tmp / f"{name}.size"
    script.write_text(SCRIPT)
    env = {**os.environ, "HOOKDBG_BENCH_FILE": str(recording)}
    command = [sys.executable, "-m", "hookdbg", "record", "-q", "-f", "-o", str(recording)]
    subprocess.run([*command, str(script), str(steps), str(pause), str(live)], check=True, env=env)
    return int(live.read_text()), os.path.getsize(recording), stored_bytes(recording)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--pause", type=float, default=0.1, help="seconds per step (slow run)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = {
            "fast": run(Path(tmp), "fast", args.steps, 0.0),
            "slow": run(Path(tmp), "slow", args.steps, args.pause),
        }
    print(f"{args.steps} steps; slow: {args.pause:g} s pause per step; default flush interval")
    print(f"{'run':<6}{'live kB':>10}{'closed kB':>11}{'stored kB':>11}{'closed/stored':>15}")
    for name, (live, closed, stored) in rows.items():
        print(
            f"{name:<6}{live / 1e3:>10.1f}{closed / 1e3:>11.1f}{stored / 1e3:>11.1f}"
            f"{closed / stored:>15.2f}"
        )
    (_, slow, _), (_, fast, _) = rows["slow"], rows["fast"]
    print(f"slow/fast closed size: {slow / fast:.2f}x")


if __name__ == "__main__":
    main()
