"""How fast a large recording opens and answers queries.

Builds a synthetic recording of N tensor rows (default 10 million, ~25,000 steps of a
resnet18-sized model) through hookdbg's own writer, then times opening it and typical
queries. Target (docs/performance.md): opening well under a second.

    python benchmarks/reader.py [--rows 10000000] [--keep FILE]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from hookdbg.analysis.query import parse
from hookdbg.analysis.search import search
from hookdbg.read import open_recording
from hookdbg.store import schema
from hookdbg.store.writer import Writer

MODULES, ROWS_PER_STEP = 70, 400


def build(path: Path, rows: int) -> None:
    rng = np.random.default_rng(0)
    writer = Writer(
        path,
        {
            "format": schema.FORMAT,
            "schema_version": schema.SCHEMA_VERSION,
            "hookdbg_version": "bench",
            "torch_version": "-",
            "python_version": "-",
            "created": "-",
            "host": "-",
            "pid": os.getpid(),
            "argv": '["bench"]',
            "cwd": "-",
            "options": "{}",
            "rank": 0,
            "world_size": 1,
            "local_rank": 0,
            "backend": "",
        },
        flush_interval=0.5,
        max_backlog_bytes=1 << 40,
    )
    # modules of a model whose root module is not in the table (parent -1, depth 1)
    modules = [(i, f"model.m{i}", "Linear", -1, 0, 1, 0, 10, "", 0) for i in range(MODULES)]
    writer.submit({"modules": modules})
    steps = rows // ROWS_PER_STEP
    block = 250  # steps per batch
    for first in range(0, steps, block):
        n_steps = min(block, steps - first)
        n = n_steps * ROWS_PER_STEP
        t = np.zeros(n, dtype=schema.TENSORS)
        t["step"] = t["segment"] = first + np.arange(n) // ROWS_PER_STEP
        t["module"] = rng.integers(0, MODULES, n)
        t["call"] = t["step"] * 100 + t["module"]
        t["slot"] = rng.integers(0, 5, n)
        t["shape"], t["dtype"], t["device"] = b"16,64,32,32", b"float32", b"cpu"
        for stat in ("min", "max", "mean", "std", "norm"):
            t[stat] = rng.standard_normal(n)
        writer._append_array("tensors", t)  # straight to disk: this measures reading
        s = np.zeros(n_steps, dtype=schema.STEPS)
        s["step"] = s["segment"] = first + np.arange(n_steps)
        s["recorded"] = 1
        writer._append_array("steps", s)
    writer.close(
        {
            "time": time.time(),
            "status": "complete",
            "exit_code": 0,
            "steps": steps,
            "calls": 0,
            "alerts": 0,
            "message": "",
        }
    )


def timed(label: str, fn):
    t0 = time.perf_counter()
    result = fn()
    print(f"  {label:<45s} {time.perf_counter() - t0:7.3f} s")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--keep", type=Path, help="keep the synthetic recording here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "big.h5"
        t0 = time.perf_counter()
        build(path, args.rows)
        print(
            f"built {args.rows:,} tensor rows ({path.stat().st_size / 1e6:.0f} MB) in "
            f"{time.perf_counter() - t0:.0f} s"
        )
        rec = timed("open_recording (validate, small tables)", lambda: open_recording(path))
        last = int(rec.recorded_steps[-1])
        timed("one step's rows, all columns", lambda: rec.tensors(last // 2, last // 2))
        timed(
            "search 'name:model.m7 std>0' (first 50)",
            lambda: search(rec, parse("name:model.m7 std>0"), limit=50),
        )
        timed("search 'nan' (first 50)", lambda: search(rec, parse("nan"), limit=50))
        table = rec.tensors_table

        def one_module_over_time() -> np.ndarray:  # what a plot of one module needs
            mine = table.column("module") == 7
            return np.stack([table.column("step")[mine], table.column("std")[mine]])

        timed("module 7's std at every step (3 columns)", one_module_over_time)
        rec.close()


if __name__ == "__main__":
    main()
