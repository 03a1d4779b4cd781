"""Steering a running recording from another process (``hookdbg ctl``): the channel.

The channel is a control file beside the recording, ``run.h5.ctl``: one for every rank
of a torchrun run (``run.rank0.h5``, ``run.rank1.h5`` read the same file). ``ctl``
appends one JSON line per command; each recorder reads the lines it has not read yet at
its step boundaries and answers in its recording (``info`` rows keyed ``ctl``: the
command's number and what it did, or why it was refused), which ``ctl`` reads back.

Why a file and not a socket: nothing listens (no thread in the training process, no
port, no socket path limit of 108 bytes), every rank reads the same commands, and the
recording keeps each answer: what was steered, when, is in the file.

The contract (docs/format.md, "The control file", says it for users):

- Who may write: the file's owner, who must be the recorder's user, and no one else
  (no group or other write bit). ``ctl`` creates it private; a recorder reads only a
  regular file (not a link, pipe or device) of its own user that no one else may write,
  and what it held unread while others could write it is refused, never applied later.
- A line is one JSON object of at most ``MAX_LINE`` bytes with the fields of
  ``Command``, checked by ``check``; ``ctl`` refuses before writing anything a recorder
  would refuse by the line alone. A numbered line that breaks a rule is answered with
  why (``refused: ...``); any other is said once on stderr and in the recording.
- Bounded work: a recorder looks at most every ``POLL_EVERY`` seconds, and spends at
  most ``BUDGET`` seconds of a step boundary on the lines waiting (at least one line):
  a flood of commands drains over many boundaries and costs training at most
  ``BUDGET / POLL_EVERY`` of its time.

Stdlib only: the recorder (with torch) and the CLI (without) both import it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeGuard

from hookdbg.options import Level, ModuleFilter, OptionError
from hookdbg.ranks import run_of

SUFFIX = ".ctl"
OPS = ("record", "level", "stop", "dump")
IDLE = "idle"  # the level of a run that records no step, only watches
LEVELS = ("timing", "shapes", "stats", IDLE)
MAX_LINE = 4096  # bytes, its line break not counted: a longer line is no command
MAX_STEPS = 1_000_000  # steps one ``record`` may ask for
MAX_FIRST = 10**15  # the largest step a command may name (a recorder also bounds it)
ANSWER = "ctl"  # the key of a recorder's answers in its ``info`` table
REFUSED = "refused: "  # how an answer that refuses a command begins
CHANNEL = "ctl_channel"  # the key of what a recorder said of the control file itself
POLL_EVERY = 0.1  # seconds: the most often a recorder looks at the control file
BUDGET = 0.001  # seconds of a step boundary a recorder spends on waiting lines


def control_path(recording: str | os.PathLike[str]) -> Path:
    """``run.h5`` -> ``run.h5.ctl``; a rank's file ``run.rank1.h5`` -> the run's
    ``run.h5.ctl``, the one every rank reads. Beside the file a link names (the
    recorder and ``ctl`` reach the same control file however they name the run)."""
    p = Path(os.path.realpath(recording))
    run = run_of(p) or p
    return run.with_name(run.name + SUFFIX)


@dataclass(frozen=True)
class Command:
    """One steering command. ``first``: the step the change takes effect at (None: the
    next step each recorder begins); ``steps``: how many steps ``record`` records."""

    seq: int
    op: str
    sent: float = field(default_factory=time.time)
    first: int | None = None
    steps: int = 0
    level: str | None = None
    modules: tuple[str, ...] = ()
    capture: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check(self)

    def line(self) -> bytes:
        data = {k: v for k, v in asdict(self).items() if v not in (None, (), 0) or k == "seq"}
        return (json.dumps(data, separators=(",", ":")) + "\n").encode()

    def describe(self) -> str:
        """What the command asks, as ``ctl`` echoes it: 'record 5 steps at stats'."""
        if self.op == "record":
            what = f"record {self.steps} step{'s' * (self.steps != 1)}"
            if self.level:
                what += f" at {self.level}"
            if self.modules:
                what += f", modules {' '.join(self.modules)}"
            if self.capture:
                what += f", capturing {' '.join(self.capture)}"
        elif self.op == "level":
            what = f"level {self.level}"
        else:
            what = self.op
        return what + ("" if self.first is None else f" from step {self.first}")


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value: object) -> bool:
    """A number of seconds (an int beyond a float's range is none)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


_OPTIONAL = ("first", "steps", "level", "modules", "capture")
_TAKES = {  # the fields each command may have, beside seq, op and sent
    "record": frozenset(_OPTIONAL),
    "level": frozenset(("first", "level")),
    "stop": frozenset(("first",)),
    "dump": frozenset(),
}


def check(command: Command) -> None:
    """Raise OptionError unless ``command`` is one ``ctl`` could have sent."""
    if command.op not in OPS:
        raise OptionError(f"unknown command {command.op!r}; use one of: {', '.join(OPS)}")
    if not _whole(command.seq) or command.seq < 0:
        raise OptionError(f"bad command number {command.seq!r}")
    if not _finite(command.sent):
        raise OptionError(f"bad command time {command.sent!r}")
    given = [name for name in _OPTIONAL if getattr(command, name) not in (None, 0, ())]
    given += ["first"] if command.first == 0 else []
    extra = [name for name in given if name not in _TAKES[command.op]]
    if extra:
        raise OptionError(f"{command.op} takes no {', '.join(extra)}")
    first = command.first
    if first is not None and (not _whole(first) or not 0 <= first <= MAX_FIRST):
        raise OptionError(f"bad first step {first!r}: a whole number from 0 to {MAX_FIRST:,}")
    if command.level is not None and command.level not in LEVELS:
        raise OptionError(f"unknown level {command.level!r}; use one of: {', '.join(LEVELS)}")
    if command.op == "record":
        steps = command.steps
        if not _whole(steps) or not 1 <= steps <= MAX_STEPS:
            raise OptionError(
                f"--steps must be a whole number from 1 to {MAX_STEPS:,}, not {steps!r}"
            )
        if command.level == IDLE:
            raise OptionError("record --level idle records nothing; use `level idle`")
        if command.modules:
            ModuleFilter.parse(list(command.modules))
        if command.capture:
            ModuleFilter.parse(list(command.capture))
    if command.op == "level" and command.level is None:
        raise OptionError(f"level needs one of: {', '.join(LEVELS)}")
    if command.level is not None and command.level != IDLE:
        Level.parse(command.level)


_FIELDS = frozenset(Command.__dataclass_fields__)


class BadLine(OptionError):
    """A line of a control file that is no command; ``seq`` and ``sent``: its command
    number and time, if it had valid ones (the recorder answers it), else None."""

    def __init__(self, why: str, seq: int | None = None, sent: float | None = None) -> None:
        super().__init__(why)
        self.seq = seq
        self.sent = sent


def parse(line: bytes) -> Command:
    """A command from one line of a control file (``BadLine`` if it is none)."""
    if len(line) > MAX_LINE:
        raise BadLine(f"a line of {len(line):,} bytes, more than any command ({MAX_LINE:,})")
    try:
        data = json.loads(line.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadLine(f"not a JSON line: {exc}") from None
    except RecursionError:
        raise BadLine("not a JSON line: nested deeper than Python reads") from None
    if not isinstance(data, dict):
        raise BadLine("not a JSON object")
    raw = data.get("seq")
    seq = raw if _whole(raw) and 1 <= raw <= 2**63 else None  # 0: made in the recorder
    try:
        unknown = data.keys() - _FIELDS
        if unknown:
            raise OptionError(f"unknown fields {', '.join(sorted(unknown))}")
        for key in ("modules", "capture"):
            value = data.get(key)
            if value is None:
                continue
            if not isinstance(value, list) or not all(isinstance(g, str) for g in value):
                raise OptionError(f"{key} must be a list of globs")
            data[key] = tuple(value)
        if seq is None:
            raise OptionError(f"bad command number {raw!r}")
        return Command(**data)
    except (OptionError, TypeError, ValueError) as exc:
        sent = data.get("sent")
        when = float(sent) if isinstance(sent, (int, float)) and _finite(sent) else None
        raise BadLine(str(exc), seq, when) from None


# -- ctl's side ------------------------------------------------------------------------


def send(path: Path, lock_wait: float = 5.0, /, **fields: object) -> Command:
    """Append a command to the control file at ``path`` (created private), numbered
    after the lines already in it (by its size past 16 MiB); returns it. Two ``ctl`` at
    once are serialised by a lock, waited for ``lock_wait`` seconds at most. Everything
    a recorder would refuse of the line is refused here (OptionError), before anything
    is written; so is a ``path`` that is no control file of this user (a link, pipe,
    device, another's)."""
    probe = Command(seq=10**12, **fields)  # type: ignore[arg-type]  # a bad one: no file
    length = len(probe.line()) - 1
    if length > MAX_LINE:
        raise OptionError(
            f"the command takes {length:,} bytes, more than a control line may hold "
            f"({MAX_LINE:,}): ask for fewer or shorter --modules/--capture globs"
        )
    with contextlib.suppress(FileNotFoundError):
        _own(path, os.lstat(path))  # before opening: a pipe would block, a device act
    fd = _open_private(path)
    try:
        _own(path, os.fstat(fd))
        _lock(fd, path, lock_wait)
        lines, terminated = _count_lines(fd)
        command = Command(seq=lines + 1, **fields)  # type: ignore[arg-type]
        data = command.line() if terminated else b"\n" + command.line()
        written = os.write(fd, data)
        if written != len(data):
            raise OptionError(f"{path}: only {written} of {len(data)} bytes written (disk full?)")
        return command
    finally:
        os.close(fd)


def _open_private(path: Path) -> int:
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OptionError(f"{path} is a symbolic link, not a control file") from None
        raise


def refusal(info: os.stat_result) -> str | None:
    """Why a file (its ``fstat``) is no control file of this user, if it is not: the
    one rule of who may write the channel, for ``ctl`` and recorders alike."""
    if not stat.S_ISREG(info.st_mode):
        return f"it is {_kind(info.st_mode)}"
    if info.st_uid != os.getuid():
        return "it belongs to another user"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "others may write it"
    return None


def _own(path: Path, info: os.stat_result) -> None:
    why = refusal(info)
    if why is not None:
        raise OptionError(f"{path} is not a control file of yours: {why}")


def _lock(fd: int, path: Path, wait: float) -> None:
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise OptionError(
                    f"{path} stayed locked by another writer for {wait:g} s"
                ) from None
            time.sleep(0.01)


def _count_lines(fd: int) -> tuple[int, bool]:
    """The lines a file holds, and whether its last one is ended (an unended one would
    glue the next command to it). Past ``_COUNTED`` bytes (a flood's), its size: more
    than its lines, and no slower to know however large the file grows."""
    size = os.fstat(fd).st_size
    last = os.pread(fd, 1, size - 1) if size else b"\n"
    if size > _COUNTED:
        return size, last == b"\n"
    lines, offset = 0, 0
    while chunk := os.pread(fd, 1 << 20, offset):
        lines += chunk.count(b"\n")
        offset += len(chunk)
    return lines + (last != b"\n"), last == b"\n"


_COUNTED = 16 << 20  # bytes of a control file whose lines ctl counts


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"
