"""What to record at each step, as launched and as steered since (``hookdbg ctl``,
``Recorder.record_next``, ``Recorder.set_level``).

The launch options give the standing rule (``--level``, ``--steps``, ``--every``, or
``--idle``: no step). ``level`` commands replace it from a step on (the rule before
holds until then); ``record`` commands add windows of steps recorded in a given detail
(level, modules, captures), which win over it; a window asked while another is still to
come or running starts after it. Commands arrive through the control file (hookdbg/control.py) or
the Python API and take effect at a step boundary: the step named in the command (so
every rank of a run starts at the same one), or the next step this process begins.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hookdbg import control
from hookdbg.control import IDLE, Command
from hookdbg.options import Level, ModuleFilter, RecordOptions


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
        self.reader: control.Reader | None = None
        self.queue: list[Command] = []  # from the Python API (number 0), in order

    def listen(self, since: float) -> None:
        """Read the control file's commands sent from ``since`` (the recording's start)."""
        if self.control_file is not None:
            self.reader = control.Reader(self.control_file, since)

    # -- commands ---------------------------------------------------------------------

    def submit(self, op: str, **fields: object) -> Command:
        """A command from this process (the Python API): applied at the next step."""
        command = _local(op, **fields)
        self.queue.append(command)
        return command

    def commands(self, now: float) -> list[Command]:
        """The commands that arrived since the last look (API ones first)."""
        found, self.queue = self.queue, []
        if self.reader is not None:
            found += self.reader.poll(now)
        return found

    def problems(self) -> list[str]:
        """What the control file held that was refused, once each."""
        if self.reader is None:
            return []
        found, self.reader.problems = self.reader.problems, []
        return found

    def apply(self, command: Command, step: int) -> str:
        """Change the schedule from the step beginning now (``step``) or the command's
        own first step; returns what was done, as an answer ("" for stop and dump,
        which the recorder does itself)."""
        first = step if command.first is None else max(command.first, step)
        late = command.first is not None and command.first < step
        since = f" (asked from step {command.first}: this process was past it)" if late else ""
        if command.op == "stop":  # the recorder closes the recording at that step
            at, asked = self.stop or (first, [])
            self.stop = (min(at, first), [*asked, command])
            return ""
        if command.op == "record":
            start = max([first, *(w.stop for w in self.windows if w.stop > first)])
            level = Level.parse(command.level) if command.level else self.options.level
            window = Window(
                start,
                start + command.steps,
                level,
                ModuleFilter.parse(list(command.modules)) if command.modules else None,
                ModuleFilter.parse(list(command.capture)) if command.capture else None,
            )
            self.windows = [w for w in self.windows if w.stop > step] + [window]
            last = window.stop - 1
            span = f"step {start}" if last == start else f"steps {start}-{last}"
            queued = " (after the window asked before it)" if start > first else ""
            return f"recording {span} at {level.name.lower()}{queued}{since}"
        if command.op == "level":
            new = None if command.level == IDLE else Level.parse(command.level or "stats")
            current = [rule for rule in self.standing if rule[0] <= step][-1:]
            later = [rule for rule in self.standing if step < rule[0] < first]
            self.standing = [*current, *later, (first, new)]
            if new is None:
                return f"idle from step {first}: no step recorded, the loss watched{since}"
            return f"recording every step at {new.name.lower()} from step {first}{since}"
        return ""

    # -- the schedule -----------------------------------------------------------------

    def plan(self, step: int) -> Plan:
        """How ``step`` is recorded."""
        options = self.options
        for window in self.windows:
            if step in window:
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
