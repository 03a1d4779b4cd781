"""Exports for other tools: Perfetto/Chrome traces, and CSV/JSON for pandas users.

Both stream step by step, so a long recording is never all in memory.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from typing import IO

import numpy as np

from hookdbg.analysis.overview import shape_text
from hookdbg.read.recording import Recording
from hookdbg.store.schema import Phase, Slot, StepKind
from hookdbg.text import utf8

TABLES = ("tensors", "calls", "steps", "alerts", "modules")
_TRACKS = {Phase.FWD: 1, Phase.BWD: 2, Phase.OPT: 3}  # tid 0: the steps
_TRACK_NAMES = {0: "steps", 1: "forward", 2: "backward", 3: "optimizer"}


def perfetto(
    recording: Recording, out: IO[str], first: int | None = None, last: int | None = None
) -> int:
    """Write a Chrome trace-event JSON (loads in ui.perfetto.dev and chrome://tracing):
    one track of step spans, and forward, backward and optimizer tracks of module spans
    nested by time. Returns the number of events written."""
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
                    },
                }


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
    ``first``..``last`` (eval batches by the step they came after) where rows have one."""
    modules = recording.modules
    if table in ("tensors", "calls"):
        lo, hi = recording.segment_range(first, last)
        read = recording.tensors if table == "tensors" else recording.calls
        for step in range(lo, hi + 1):
            for row in read(step, step, kind=None):
                yield _readable(row, recording)
    elif table == "modules":
        for m in modules:
            yield {
                "id": m.id,
                "name": m.name,
                "type": m.type,
                "parent": m.parent,
                "root": m.root,
                "depth": m.depth,
                "kind": "optimizer" if m.is_optimizer else "module",
                "params": m.params,
            }
    else:
        rows = recording.segments if table == "steps" else recording.alerts
        lo = -(2**31) if first is None else first
        hi = 2**31 - 1 if last is None else last
        for row in rows[(rows["step"] >= lo) & (rows["step"] <= hi)]:
            yield _readable(row, recording)


def _readable(row: np.void, recording: Recording) -> dict[str, object]:
    modules = recording.modules
    out: dict[str, object] = {}
    for name in row.dtype.names:
        value = row[name]
        if name == "module":
            out["module"] = modules.name(int(value))
            module = modules.get(int(value))
            out["type"] = module.type if module else ""
        elif name == "segment":  # which step or eval batch: 'step 3', 'eval batch 0'
            out["segment"] = int(value)
            out["of"] = recording.segment_label(int(value))
        elif name == "kind":
            out[name] = StepKind(int(value)).name.lower()
        elif name == "phase":
            out[name] = Phase(int(value)).label
        elif name == "slot":
            out[name] = Slot(int(value)).label
        elif name == "shape":
            out[name] = shape_text(value)
        elif isinstance(value, bytes):
            out[name] = utf8(value)
        elif isinstance(value, np.floating):
            out[name] = None if np.isnan(value) else float(value)
        elif name in ("nan", "posinf", "neginf") and value < 0:
            out[name] = None  # values not looked at (shapes only)
        else:
            out[name] = value.item() if isinstance(value, np.generic) else value
    return out


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
