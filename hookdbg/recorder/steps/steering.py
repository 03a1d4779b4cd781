"""What to record at each step, as launched and as steered since (``hookdbg ctl``,
``Recorder.record_next``, ``Recorder.set_level``).

The launch options give the standing rule (``--level``, ``--steps``, ``--every``, or
``--idle``: no step). ``level`` commands replace it from a step on (the rule before
holds until then); ``record`` commands add windows of steps recorded in a given detail
(level, modules, captures), which win over it; a window that would overlap one asked
before it starts after that one. Commands arrive through the control file
(hookdbg/control.py, read by recorder/steps/inbox.py) or the Python API and take effect
at a step boundary: the step named in the command (so every rank of a run starts at the
same one), or the next step this process begins. What may wait is bounded: a command
starts at most ``MAX_AHEAD`` steps ahead, and at most ``MAX_WAITING`` windows or level
changes wait to begin; a command past either is refused, with why.
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from hookdbg.control import IDLE, REFUSED, Command
from hookdbg.options import Level, ModuleFilter, RecordOptions
from hookdbg.recorder.steps.inbox import Reader, Refused

MAX_AHEAD = 1_000_000  # steps ahead of this process a command may take effect at
MAX_WAITING = 1_000  # windows, and level changes, that may wait to begin


@dataclass(frozen=True)
class Plan:
    """How one step is recorded: not at all, or at ``level`` for ``modules``, copying
    the full tensors of ``capture`` (None: none)."""

    recording: bool
    level: Level
    modules: ModuleFilter
    capture: ModuleFilter | None


@dataclass(frozen=True)
class Window:
    """Steps ``first`` to ``stop - 1`` recorded as a ``record`` command asked."""

    first: int
    stop: int
    level: Level
    modules: ModuleFilter | None
    capture: ModuleFilter | None

    def __contains__(self, step: int) -> bool:
        return self.first <= step < self.stop


class Steering:
    """The schedule of a recording and the commands that change it."""

    def __init__(self, options: RecordOptions, control_file: Path | None) -> None:
        self.options = options
        self.control_file = control_file  # None: steered through the Python API only
        # the standing rules ``level`` commands set, in step order: (from step, level or
        # None for idle); before the first, the launch rule
        self.standing: list[tuple[int, Level | None]] = [(0, None)] if options.idle else []
        self.windows: list[Window] = []
        # the step ``stop`` commands close the recording at (the earliest asked), and
        # those commands, each answered then
        self.stop: tuple[int, list[Command]] | None = None
        self.reader: Reader | None = None
        self.queue: list[Command] = []  # from the Python API (number 0), in order

    def listen(self, since: float) -> None:
        """Read the control file's commands sent from ``since`` (the recording's start)."""
        path = self.control_file
        if path is None:
            return
        self.reader = Reader(path, since)
        try:
            longest = os.pathconf(path.parent, "PC_NAME_MAX")
        except (OSError, ValueError):
            return
        if len(os.fsencode(path.name)) > longest:
            self.reader.problems.append(
                f"{path.name} is a longer name than this file system allows ({longest} "
                "bytes): `hookdbg ctl` cannot steer this recording; name it shorter to"
            )

    # -- commands ---------------------------------------------------------------------

    def submit(self, op: str, **fields: object) -> Command:
        """A command from this process (the Python API): applied at the next step."""
        command = _local(op, **fields)
        self.queue.append(command)
        return command

    def commands(self, now: float) -> Iterator[Command | Refused]:
        """The commands that arrived since the last look (API ones first), and the
        numbered lines of the control file refused, to answer. The control file's
        come as they are read: the time the caller takes over each counts in the
        look's budget."""
        found, self.queue = self.queue, []
        yield from found
        if self.reader is not None:
            yield from self.reader.poll(now)

    def problems(self, now: float, final: bool = False) -> list[str]:
        """What to say of the control file itself (refused, bad lines), once each
        (``final``: at the end, when the files it held are let go)."""
        if self.reader is None:
            return []
        said = self.reader.said(now, final)
        if final:
            self.reader.close()
        return said

    def apply(self, command: Command, step: int) -> str:
        """Change the schedule from the step beginning now (``step``) or the command's
        own first step; returns what was done, as an answer ("" for stop and dump,
        which the recorder does itself)."""
        first = step if command.first is None else max(command.first, step)
        if first - step > MAX_AHEAD:
            return (
                f"{REFUSED}step {first:,} is more than {MAX_AHEAD:,} steps ahead of this "
                f"process (step {step:,})"
            )
        late = command.first is not None and command.first < step
        since = f" (asked from step {command.first}: this process was past it)" if late else ""
        if self.stop is not None and command.op != "stop" and first >= self.stop[0]:
            return (
                f"{REFUSED}the recording stops at step {self.stop[0]:,} (command "
                f"{self.stop[1][0].seq}), before step {first:,}"
            )
        if command.op == "stop":  # the recorder closes the recording at that step
            at, asked = self.stop or (first, [])
            self.stop = (min(at, first), [*asked, command])
            return ""
        if command.op == "record":
            windows = self.windows  # in step order, none overlapping another
            del windows[: bisect.bisect_right(windows, step, key=_stop)]  # those over
            if len(windows) >= MAX_WAITING:
                return f"{REFUSED}{len(windows):,} windows wait to be recorded already"
            start = first
            at = bisect.bisect_right(windows, start, key=_stop)  # the first gap it fits
            while at < len(windows) and windows[at].first < start + command.steps:
                start = windows[at].stop
                at += 1
            level = Level.parse(command.level) if command.level else self.options.level
            window = Window(
                start,
                start + command.steps,
                level,
                ModuleFilter.parse(list(command.modules)) if command.modules else None,
                ModuleFilter.parse(list(command.capture)) if command.capture else None,
            )
            windows.insert(at, window)
            last = window.stop - 1
            span = f"step {start}" if last == start else f"steps {start}-{last}"
            queued = " (after the window asked before it)" if start > first else ""
            return f"recording {span} at {level.name.lower()}{queued}{since}"
        if command.op == "level":
            new = None if command.level == IDLE else Level.parse(command.level or "stats")
            current = [rule for rule in self.standing if rule[0] <= step][-1:]
            later = [rule for rule in self.standing if step < rule[0] < first]
            if len(later) >= MAX_WAITING:
                return f"{REFUSED}{len(later):,} level changes wait to begin already"
            self.standing = [*current, *later, (first, new)]
            if new is None:
                return f"idle from step {first}: no step recorded, the loss watched{since}"
            return f"recording every step at {new.name.lower()} from step {first}{since}"
        return ""

    # -- the schedule -----------------------------------------------------------------

    def plan(self, step: int) -> Plan:
        """How ``step`` is recorded."""
        options = self.options
        at = bisect.bisect_right(self.windows, step, key=_stop)
        if at < len(self.windows) and step in self.windows[at]:
            window = self.windows[at]
            return Plan(
                True,
                window.level,
                window.modules or options.modules,
                window.capture or self._launch_capture(step),
            )
        rules = [level for first, level in self.standing if first <= step]
        if rules:
            level = rules[-1]
            if level is None:
                return Plan(False, options.level, options.modules, None)
            return Plan(True, level, options.modules, self._launch_capture(step))
        return Plan(
            options.records_step(step),
            options.level,
            options.modules,
            self._launch_capture(step),
        )

    def _launch_capture(self, step: int) -> ModuleFilter | None:
        options = self.options
        return options.capture if options.capture and step in options.capture_steps else None

    @property
    def idle(self) -> bool:
        """No step will be recorded unless a command asks for some."""
        standing = self.standing
        return bool(standing) and all(level is None for _, level in standing) and not self.windows


def _stop(window: Window) -> int:
    return window.stop


class AnswerEcho:
    """The answers to steering commands said on stderr: each one while they come a few
    at a time; in a flood (the file keeps every one), a line now and then that counts
    those not said."""

    BURST = 5  # answers said at once at most
    EVERY = 2.0  # seconds to earn one more

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.credit = float(self.BURST)
        self.unsaid = 0
        self._earned = time.monotonic()

    def __call__(self, line: str) -> None:
        self._earn(time.monotonic())
        if self.credit >= 1 and not self.unsaid:
            self.credit -= 1
            self.say(line)
        else:
            self.unsaid += 1

    def flush(self, now: float, final: bool = False) -> None:
        """Say the count of answers not said, when a line is earned (or at the end)."""
        self._earn(now)
        if self.unsaid and (final or self.credit >= 1):
            self.credit = max(self.credit - 1, 0.0)
            n, self.unsaid = self.unsaid, 0
            self.say(
                f"{n:,} more steering command{'s' * (n != 1)} answered (each answer is in "
                "the recording: hookdbg ctl RECORDING status)"
            )

    def _earn(self, now: float) -> None:
        self.credit = min(self.BURST, self.credit + (now - self._earned) / self.EVERY)
        self._earned = now


def _local(op: str, **fields: object) -> Command:
    """A command made in this process (number 0), checked as one from the file is."""
    for key in ("modules", "capture"):
        value = fields.get(key)
        if isinstance(value, str):
            fields[key] = (value,)
        elif value is not None:
            fields[key] = tuple(value)  # type: ignore[arg-type]
    clean = {k: v for k, v in fields.items() if v is not None}
    return Command(seq=0, op=op, **clean)  # type: ignore[arg-type]
