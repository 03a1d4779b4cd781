"""Exports for other tools: Perfetto/Chrome traces, and CSV/JSON for pandas users.

Both stream step by step, so a long recording is never all in memory.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from typing import IO

import numpy as np

from hookdbg.read.recording import Recording
from hookdbg.read.resolve import TABLES, blocks
from hookdbg.store.schema import Phase, StepKind

__all__ = ["TABLES", "perfetto", "table_rows", "write_csv", "write_json"]
_TRACKS = {Phase.FWD: 1, Phase.BWD: 2, Phase.OPT: 3}  # tid 0: the steps
_TRACK_NAMES = {0: "steps", 1: "forward", 2: "backward", 3: "optimizer"}


def perfetto(
    recording: Recording, out: IO[str], first: int | None = None, last: int | None = None
) -> int:
    """Write a Chrome trace-event JSON (loads in ui.perfetto.dev and chrome://tracing):
    one track of step spans, and forward, backward and optimizer tracks of module spans
    nested by time (host times; a call timed on a CUDA device carries its device times
    in its args). Returns the number of events written."""
    pid = recording.info.rank
    first, last = recording.segment_range(first, last)
    events: list[dict] = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": pid,
            "args": {"name": f"hookdbg rank {pid}: {recording.info.command}"},
        },
    ]
    events += [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
        for tid, name in _TRACK_NAMES.items()
    ]
    out.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
    count = 0
    for event in [*events, *_trace_events(recording, first, last, pid)]:
        out.write(("" if count == 0 else ",\n") + json.dumps(event))
        count += 1
    out.write("\n]}\n")
    return count


def _trace_events(recording: Recording, first: int, last: int, pid: int) -> Iterator[dict]:
    """Training steps and eval batches in the range, each a span with its calls."""
    modules = recording.modules
    segments = recording.segments
    chosen = (segments["step"] >= first) & (segments["step"] <= last) & (segments["recorded"] == 1)
    for row in segments[chosen]:
        step, segment = int(row["step"]), int(row["segment"])
        label = recording.segment_label(segment)
        yield {
            "ph": "X",
            "name": label,
            "cat": "eval" if row["kind"] == StepKind.EVAL else "step",
            "pid": pid,
            "tid": 0,
            **_span(row["start"], row["end"]),
        }
        calls = recording.calls(step, step, kind=None)
        calls = calls[calls["segment"] == segment]
        timed = recording.device_times(step, step, kind=None)
        device = {(int(r["call"]), int(r["phase"])): r for r in timed[timed["segment"] == segment]}
        for phase in (Phase.FWD, Phase.BWD, Phase.OPT):
            spans = calls[calls["phase"] == phase]
            for start, end, call in _nested(spans):
                module = modules.get(int(call["module"]))
                yield {
                    "ph": "X",
                    "name": module.name if module else "?",
                    "cat": phase.label,
                    "pid": pid,
                    "tid": _TRACKS[phase],
                    **_span(start, end),
                    "args": {
                        "type": module.type if module else "?",
                        "step": label,
                        "call": int(call["index"]),
                        "self_ms": float(call["self"]) * 1e3,
                        **_device_args(device.get((int(call["call"]), int(phase)))),
                    },
                }


def _device_args(timed: np.void | None) -> dict[str, float]:
    if timed is None:
        return {}
    return {"device_ms": float(timed["total"]) * 1e3, "device_self_ms": float(timed["self"]) * 1e3}


def _nested(spans: np.ndarray) -> Iterator[tuple[float, float, np.void]]:
    """Spans clipped so that each lies inside the one enclosing it: trace viewers draw
    partially overlapping spans on one track wrongly (backward spans can overlap a
    little: their ends are the arrival of the last input gradient)."""
    order = np.lexsort((-spans["total"], spans["start"]))
    stack: list[float] = []  # end times of open spans
    for call in spans[order]:
        start, end = float(call["start"]), float(call["start"] + call["total"])
        while stack and stack[-1] <= start:
            stack.pop()
        if stack:
            end = min(end, stack[-1])
        stack.append(end)
        yield start, end, call


def _span(start: float, end: float) -> dict[str, float]:
    """ts and dur in microseconds; rounding the ends (not the duration) keeps spans that
    share a boundary sharing it exactly."""
    ts, te = round(float(start) * 1e6, 3), round(float(end) * 1e6, 3)
    return {"ts": ts, "dur": round(te - ts, 3)}


def table_rows(
    recording: Recording, table: str, first: int | None = None, last: int | None = None
) -> Iterator[dict[str, object]]:
    """Rows of one table as plain dicts with names instead of ids and codes, steps
    ``first``..``last`` (eval batches by the step they came after) where rows have one.
    The same resolution as ``Recording.to_pandas`` (hookdbg/read/resolve.py), streamed
    block by block."""
    for columns in blocks(recording, table, first, last):
        yield from columns.rows()


def write_csv(rows: Iterator[dict[str, object]], out: IO[str]) -> int:
    writer = None
    count = 0
    for row in rows:
        if writer is None:
            writer = csv.DictWriter(out, fieldnames=list(row))
            writer.writeheader()
        writer.writerow(row)
        count += 1
    return count


def write_json(rows: Iterator[dict[str, object]], out: IO[str]) -> int:
    """A JSON array of records: ``pandas.read_json(path)`` reads it as a table."""
    out.write("[")
    count = 0
    for row in rows:
        out.write(("\n" if count == 0 else ",\n") + json.dumps(row))
        count += 1
    out.write("\n]\n")
    return count
