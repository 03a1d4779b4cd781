"""What the framework callbacks share: one recording from the start of training to its
end, and ``on_nan="stop"`` done the way a trainer stops.

The recorder's own ``on_nan="stop"`` raises a ``BaseException`` out of the hook that
found the origin, which a trainer treats as a crash (its exception hooks run, ``fit``
raises). Here the recorder runs with ``on_nan="warn"`` (one line per origin, as
always), the callback looks at the recorder's alert count at each batch end, and asks
the trainer to stop (``trainer.should_stop``, ``control.should_training_stop``): the
trainer finishes the batch, runs its end-of-training hooks and returns normally, and
the recording is closed with status ``stopped``. The recording's ``options`` still say
``on_nan: warn``, which is what the recorder did.

Under several processes every rank records its own file (``run.rank1.h5``: the rule
is in hookdbg/ranks.py), and the decision to stop is shared by all ranks (one rank
stopping alone would leave the others waiting for it in their next collective).
"""

from __future__ import annotations

import atexit
import inspect
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from hookdbg.options import OptionError, RecordOptions, on_nan_action
from hookdbg.ranks import placement, rank_files
from hookdbg.read import RecordingError, open_recording
from hookdbg.recorder import Recorder, RecordError, record
from hookdbg.recorder.steps.meta import backend_name
from hookdbg.text import human_bytes, plural

_RECORD_OPTIONS = {
    name
    for name, p in inspect.signature(record).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY
}
_ALREADY_RUNNING = "already running"  # RecordError of a second recording in one process


class RecordingSession:
    """One recording, started and closed by a framework callback."""

    def __init__(
        self,
        path: str,
        on_nan: str = "record",
        ranks: Iterable[int] | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        options = dict(options or {})
        unknown = sorted(set(options) - _RECORD_OPTIONS - {"on_nan"})
        if unknown:
            raise TypeError(
                f"unknown hookdbg option {unknown[0]!r}; options are "
                f"{', '.join(sorted(_RECORD_OPTIONS - {'on_nan'}))}"
            )
        try:
            on_nan_action(on_nan)
        except OptionError as exc:
            raise exc.as_keywords() from None
        self.path = path
        self.on_nan = on_nan
        self.ranks = None if ranks is None else frozenset(ranks)
        self._options = {**options, "on_nan": "warn" if on_nan == "stop" else on_nan}
        # fail at construction, before the trainer sets anything up, on what the
        # recorder would refuse: a bad value, a recording already there
        checked = {k: v for k, v in self._options.items() if k != "force"}
        try:
            RecordOptions.build(**{**checked, "on_nan": on_nan})  # stop needs NaN checks too
        except OptionError as exc:
            raise exc.as_keywords() from None
        if not options.get("force") and (Path(path).exists() or rank_files(path)):
            raise RecordError(f"{path} already exists; pass force=True to overwrite it")
        self.recorder: Recorder | None = None
        self.stopped_at: int | None = None  # the trainer's global step when it was asked
        self.recordings = 0  # started by this session (a callback can serve several fits)

    @property
    def quiet(self) -> bool:
        return bool(self._options.get("quiet", False))

    def say(self, message: str) -> None:
        if not self.quiet:
            print(f"{placement().prefix}{message}", file=sys.stderr, flush=True)

    def start(self, rank: int, global_step: int) -> None:
        """Start recording (on ranks chosen by ``ranks``); ``global_step`` is where the
        trainer starts (not 0 when it resumes from a checkpoint)."""
        self.close("exception", 1, "training ended without its end-of-training hook")
        self.stopped_at = None
        if self.ranks is not None and rank not in self.ranks:
            return
        self.recordings += 1
        path = Path(self.path)
        if self.recordings > 1:  # the next fit: run.2.h5, not over the first one
            path = path.with_name(f"{path.stem}.{self.recordings}{path.suffix}")
        recorder = record(path, **self._options)
        try:
            recorder.start()
        except RecordError as exc:
            if _ALREADY_RUNNING not in str(exc):
                raise
            self.say(f"{exc}: this callback records nothing (the running one records all)")
            return
        self.recorder = recorder
        _open_sessions.add(self)
        self.say(f"recording -> {recorder.path}")
        if global_step:
            self.say(
                f"the trainer resumes at global step {global_step}: the recording counts "
                f"its steps from 0 (recording step N is global step {global_step} + N)"
            )

    def should_stop(self, global_step: int, device: torch.device | None = None) -> bool:
        """Whether the trainer must stop now: ``on_nan="stop"`` and an origin was found,
        on this rank or any other (then every rank stops at the same batch)."""
        if self.on_nan != "stop" or self.stopped_at is not None:
            return False
        found = self.recorder is not None and self.recorder.detector.alerts > 0
        if not _any_rank(found, device):
            return False
        self.stopped_at = global_step
        where = "a NaN/inf origin" if found else "a NaN/inf origin on another rank"
        self.say(f"on_nan='stop': {where}; stopping the trainer at global step {global_step}")
        return True

    def end(self) -> None:
        """Training ended normally, or because ``should_stop`` asked it to."""
        if self.stopped_at is None:
            self.close("complete", 0)
        else:
            self.close(
                "stopped",
                0,
                f"on_nan='stop': the trainer stopped at global step {self.stopped_at}, "
                "after the first NaN/inf origin (see the alerts)",
            )

    def failed(self, exc: BaseException) -> None:
        """Training raised ``exc``."""
        if isinstance(exc, KeyboardInterrupt):
            self.close("interrupted", 130, "KeyboardInterrupt")
        else:
            self.close("exception", 1, f"{type(exc).__name__}: {exc}")

    def close(self, status: str, exit_code: int, message: str = "") -> None:
        """Close the recording (if one is open) and say what it holds."""
        recorder, self.recorder = self.recorder, None
        if recorder is None:
            return
        _open_sessions.discard(self)
        recorder.close(status, exit_code, message)
        self.say(_status_line(recorder, status))


def _status_line(recorder: Recorder, status: str) -> str:
    """What the file holds, as the reader sees it (a training step that validation
    interrupted is two segments of the recorder's but one step)."""
    path = recorder.path
    try:
        with open_recording(path) as rec:
            counts = [plural(len(rec.steps), "step")]
            if len(rec.evals):
                counts.append(plural(len(rec.evals), "eval batch", "eval batches"))
            counts.append(plural(len(rec.alerts), "alert"))
    except RecordingError as exc:
        return f"recording {path} ended ({status}) but cannot be read back: {exc}"
    line = f"recorded {', '.join(counts)} -> {path} ({human_bytes(rec.size)}, status {status})"
    if recorder.write_error:
        line += f"; writing stopped early: {recorder.write_error}"
    elif recorder.dropped_rows:
        line += f"; {recorder.dropped_rows:,} rows DROPPED (the disk could not keep up)"
    return line


def _any_rank(flag: bool, device: torch.device | None) -> bool:
    """``flag`` or'ed over the ranks of torch.distributed's default group (one
    all-reduce of one number per call); just ``flag`` in a single process."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return flag
    if device is None or "gloo" in backend_name().split(","):  # gloo reduces on the host
        device = torch.device("cpu")
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


# Recordings a trainer left open (Hugging Face's Trainer calls no callback when
# training raises): closed at exit, with the exception that ended the process if any.
_open_sessions: set[RecordingSession] = set()


@atexit.register
def _close_at_exit() -> None:
    exc = getattr(sys, "last_value", None)
    for session in list(_open_sessions):
        if isinstance(exc, BaseException):
            session.failed(exc)
        else:
            session.close("exception", 1, "training ended without its end-of-training hook")
