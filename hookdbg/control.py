"""Steering a running recording from another process (``hookdbg ctl``): the channel.

The channel is a control file beside the recording, ``run.h5.ctl``: one for every rank
of a torchrun run (``run.rank0.h5``, ``run.rank1.h5`` read the same file). ``ctl``
appends one JSON line per command; each recorder reads the lines it has not read yet at
its step boundaries (one ``stat`` every tenth of a second at most when nothing changed)
and answers in its recording (``info`` rows keyed ``ctl``: the command's number and what
it did), which ``ctl`` reads back.

Why a file and not a socket: nothing listens (no thread in the training process, no
port, no socket path limit of 108 bytes), every rank reads the same commands, and the
recording keeps each answer: what was steered, when, is in the file. Private: ``ctl``
creates the file readable and writable by its owner only, and a recorder reads it only
if it is a regular file (not a link) of its own user that no one else may write.

Stdlib only: the recorder (with torch) and the CLI (without) both import it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hookdbg.options import Level, ModuleFilter, OptionError
from hookdbg.ranks import rank_of

SUFFIX = ".ctl"
OPS = ("record", "level", "stop", "dump")
IDLE = "idle"  # the level of a run that records no step, only watches
LEVELS = ("timing", "shapes", "stats", IDLE)
MAX_LINE = 4096  # bytes: a longer line is no command ctl wrote
MAX_STEPS = 1_000_000  # steps one ``record`` may ask for
ANSWER = "ctl"  # the key of a recorder's answers in its ``info`` table


def control_path(recording: str | os.PathLike[str]) -> Path:
    """``run.h5`` -> ``run.h5.ctl``; a rank's file ``run.rank1.h5`` -> the run's
    ``run.h5.ctl``, the one every rank reads."""
    p = Path(recording)
    run = p.with_name(p.stem.rpartition(".rank")[0] + p.suffix)
    if run.stem and rank_of(run, p) is not None:
        p = run
    return p.with_name(p.name + SUFFIX)


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


def check(command: Command) -> None:
    """Raise OptionError unless ``command`` is one ``ctl`` could have sent."""
    if command.op not in OPS:
        raise OptionError(f"unknown command {command.op!r}; use one of: {', '.join(OPS)}")
    if isinstance(command.seq, bool) or not isinstance(command.seq, int) or command.seq < 0:
        raise OptionError(f"bad command number {command.seq!r}")
    if not isinstance(command.sent, (int, float)) or not math.isfinite(command.sent):
        raise OptionError(f"bad command time {command.sent!r}")
    if command.first is not None and (not isinstance(command.first, int) or command.first < 0):
        raise OptionError(f"bad first step {command.first!r}")
    if command.level is not None and command.level not in LEVELS:
        raise OptionError(f"unknown level {command.level!r}; use one of: {', '.join(LEVELS)}")
    if command.op == "record":
        steps = command.steps
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
            raise OptionError(
                f"--steps must be a whole number from 1 to {MAX_STEPS:,}, not {steps!r}"
            )
        if command.level == IDLE:
            raise OptionError("record --level idle records nothing; use `level idle`")
        ModuleFilter.parse(list(command.modules))
        ModuleFilter.parse(list(command.capture))
    if command.op == "level" and command.level is None:
        raise OptionError(f"level needs one of: {', '.join(LEVELS)}")
    if command.level is not None and command.level != IDLE:
        Level.parse(command.level)


def parse(line: bytes) -> Command:
    """A command from one line of a control file (OptionError if it is none)."""
    if len(line) > MAX_LINE:
        raise OptionError(f"a line of {len(line):,} bytes, more than any command")
    try:
        data = json.loads(line)
    except (UnicodeDecodeError, ValueError) as exc:
        raise OptionError(f"not a JSON line: {exc}") from None
    if not isinstance(data, dict):
        raise OptionError("not a JSON object")
    known = set(Command.__dataclass_fields__)
    unknown = set(data) - known
    if unknown:
        raise OptionError(f"unknown fields {', '.join(sorted(unknown))}")
    for key in ("modules", "capture"):
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(g, str) for g in value):
            raise OptionError(f"{key} must be a list of globs")
        data[key] = tuple(value)
    try:
        command = Command(**data)
    except TypeError as exc:
        raise OptionError(str(exc)) from None
    if command.seq < 1:  # 0: a command made inside the recording process
        raise OptionError(f"bad command number {command.seq!r}")
    return command


def send(path: Path, **fields: object) -> Command:
    """Append a command to the control file at ``path`` (created private), numbered
    after those already in it; returns it. Two ``ctl`` at once are serialised by a lock."""
    Command(seq=1, **fields)  # type: ignore[arg-type]  # a bad one leaves no file behind
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise OptionError(f"{path} is not a control file of yours (owner or mode)")
        fcntl.flock(fd, fcntl.LOCK_EX)
        with open(path, "rb") as f:
            seq = sum(1 for _ in f) + 1
        command = Command(seq=seq, **fields)  # type: ignore[arg-type]
        os.write(fd, command.line())
        return command
    finally:
        os.close(fd)


@dataclass
class Reader:
    """A recorder's side: the commands appended to a control file since it last looked.
    Lines there before ``since`` (the recording's start) were meant for another run."""

    path: Path
    since: float
    offset: int = 0
    _size: int = -1
    _inode: int = -1
    _head: bytes = b""  # its first bytes: a file made anew (same inode or not) differs
    _seen: float = 0.0
    problems: list[str] = field(default_factory=list)  # what was refused, to say once

    def __post_init__(self) -> None:
        with contextlib.suppress(OSError):
            info = os.lstat(self.path)
            self.offset = self._size = info.st_size
            self._inode = info.st_ino
            if stat.S_ISREG(info.st_mode):
                self._head = self._first_bytes()

    def poll(self, now: float, every: float = 0.1) -> list[Command]:
        """New commands, at most every ``every`` seconds (a ``stat`` when none)."""
        if now - self._seen < every:
            return []
        self._seen = now
        try:
            info = os.lstat(self.path)
        except OSError:
            return []
        if (info.st_size, info.st_ino) == (self._size, self._inode):
            return []
        self._size = info.st_size
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            return self._refuse("it is not a regular file of this user")
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return self._refuse("others may write it")
        head = self._first_bytes()
        if (info.st_ino, head[: len(self._head)]) != (self._inode, self._head):
            self.offset = 0  # removed and made anew (the inode may be reused): start over
        self._inode, self._head = info.st_ino, head
        if info.st_size < self.offset:  # replaced by a shorter one
            self.offset = 0
        return list(self._read())

    def _read(self) -> Iterator[Command]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(64 * MAX_LINE)
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # whole lines only: the rest is still being written
        self.offset += end
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            try:
                command = parse(line)
            except OptionError as exc:
                self.problems.append(f"ignored a line of {self.path}: {exc}")
                continue
            if command.sent >= self.since:
                yield command

    def _first_bytes(self) -> bytes:
        """(Of a regular file: O_NOFOLLOW, O_NONBLOCK, as a link or a pipe put there
        since the check is not followed or waited on.)"""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return b""
        try:
            return os.read(fd, 64)
        except OSError:
            return b""
        finally:
            os.close(fd)

    def _refuse(self, why: str) -> list[Command]:
        self.problems.append(f"not reading {self.path}: {why}")
        return []
