"""Where a steering command should take effect across the ranks of a live run (``hookdbg
ctl``, the TUI's record key): a step no rank has begun, that every rank will have heard
of before it gets there."""

from __future__ import annotations

import math
import time

import numpy as np

from hookdbg import control
from hookdbg.control import Command
from hookdbg.options import OptionError
from hookdbg.read import Recording, Status

_MOST_AHEAD = 100_000  # steps: a run whose steps take no time is not waited for longer


class SteerError(Exception):
    """A command that cannot be sent, in one line for the user."""


def steer(recs: list[Recording], lock_wait: float = 5.0, **fields: object) -> Command:
    """Send a command to every rank of a live run (``recs``: one recording per rank);
    ``record``, ``level`` and ``stop`` take effect at a step every rank reaches after
    hearing of it. ``lock_wait``: the most seconds to wait for another sender."""
    ended = [rec for rec in recs if rec.status is not Status.LIVE]
    if ended:
        rec = ended[0]
        raise SteerError(
            f"{rec.path} is not being recorded ({rec.status.value}): there is nothing to steer"
        )
    if fields["op"] in ("record", "level", "stop") and len(recs) > 1:
        fields["first"] = common_step(recs)
    target = control.control_path(recs[0].path)
    try:
        return control.send(target, lock_wait, **fields)
    except OptionError as exc:
        raise SteerError(str(exc)) from None
    except OSError as exc:
        raise SteerError(f"cannot write {target}: {exc.strerror or exc}") from None


def common_step(recs: list[Recording]) -> int:
    """The furthest rank's step, plus the steps it runs in the time a command takes to
    reach every rank: its file's age, a flush interval, half a second to spare."""
    now = time.time()
    furthest = max(current_step(rec) for rec in recs)
    periods = [p for p in (_step_period(rec) for rec in recs) if p > 0]
    if not periods:
        return furthest + 2
    delay = 0.5 + max(_flush_interval(rec) for rec in recs)
    delay += max(now - _last_seen(rec) for rec in recs)
    return furthest + min(math.ceil(delay / min(periods)), _MOST_AHEAD) + 1


def current_step(rec: Recording) -> int:
    """The step the recording's last segment belongs to (0 before any)."""
    segments = rec.segments
    return int(segments["step"][-1]) if len(segments) else 0


def _flush_interval(rec: Recording) -> float:
    value = rec.info.options.get("flush_interval", 1.0)
    return float(value) if isinstance(value, (int, float)) else 1.0


def _step_period(rec: Recording) -> float:
    """Seconds from one training step's start to the next's, lately (0: unknown)."""
    starts = rec.steps["start"][-21:]
    return float(np.median(np.diff(starts))) if len(starts) > 1 else 0.0


def _last_seen(rec: Recording) -> float:
    progress = rec.last_progress
    return float(progress["time"]) if progress is not None else time.time()
