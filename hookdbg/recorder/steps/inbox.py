"""A recorder's side of the steering channel (hookdbg/control.py has its contract): the
lines appended to the control file since the recorder last looked, read within a budget
and checked, each a command to apply or a numbered line to answer with why not."""

from __future__ import annotations

import math
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hookdbg.control import BUDGET, MAX_LINE, POLL_EVERY, BadLine, Command, parse, refusal

_CHUNK = 64 * 1024  # bytes read at a time


@dataclass(frozen=True)
class Refused:
    """A numbered line a recorder will not apply, and why: answered, never applied."""

    seq: int
    why: str


@dataclass
class Reader:
    """A recorder's side: the lines appended to a control file since it last looked.
    Lines there before ``since`` (the recording's start) were meant for another run.

    It reads a file only through a descriptor opened without following a link and
    checked itself (a regular file of this user no one else may write). Whatever came
    into the file while it was refused is refused too once it is readable again: a
    line another user wrote then is never applied. Per look, ``BUDGET`` seconds at most
    (at least one line); the rest waits for the next look."""

    path: Path
    since: float
    offset: int = 0  # bytes of the file read (or skipped): the next line begins here
    _seen: float = -math.inf  # when it last looked
    _last: tuple[int, ...] = ()  # the file's identity, size, times, mode and owner then
    _head: bytes = b""  # its first bytes: a file made anew (same inode or not) differs
    _refused: str | None = None  # why the file is not read, while it is not
    _exposed: tuple[int, int] | None = None  # (device, inode) of a file seen writable
    _distrust_below: int = 0  # a line beginning before this offset came while exposed
    _skipping: int = -1  # inside a line longer than any command: its bytes so far
    _bad_lines: int = 0  # bad lines without a command number, not said yet
    _bad_said: float = -math.inf  # when that count was last said
    problems: list[str] = field(default_factory=list)  # what to say, once each

    def __post_init__(self) -> None:
        opened = _open_checked(self.path)
        if opened is not None and opened[2] is None:
            fd, info, _ = opened
            try:
                self.offset = info.st_size
                self._head = os.pread(fd, 64, 0)
                self._last = _identity(info)
            finally:
                os.close(fd)

    def poll(self, now: float, every: float = POLL_EVERY) -> Iterator[Command | Refused]:
        """The commands that arrived, and the numbered lines refused, in the file's
        order; at most every ``every`` seconds, within ``BUDGET`` seconds of work."""
        if now - self._seen < every:
            return
        self._seen = now
        deadline = time.perf_counter() + BUDGET
        try:
            info = os.lstat(self.path)
        except OSError:
            return  # not there (yet, or any more)
        if _identity(info) == self._last and self.offset >= info.st_size:
            return  # nothing new: the common case, one lstat
        opened = _open_checked(self.path)
        if opened is None:
            return
        fd, info, why = opened
        if why is not None:
            self._refuse(why, info)
            return
        try:
            self._last = _identity(info)
            head = os.pread(fd, 64, 0)
            if head[: len(self._head)] != self._head or info.st_size < self.offset:
                self.offset, self._distrust_below, self._skipping = 0, 0, -1  # made anew
            self._head = head
            if self._refused is not None:
                self._resume(info)
            yield from self._lines(fd, info.st_size, deadline)
        finally:
            os.close(fd)

    def said(self, now: float, final: bool = False) -> list[str]:
        """What to say of the file itself: each refusal once, the first bad line with
        why, and the count of later ones at most once a minute (and at the end)."""
        if self._bad_lines and (final or now - self._bad_said >= 60):
            n = self._bad_lines
            self.problems.append(f"ignored {n:,} more bad line{'s' * (n != 1)} of {self.path}")
            self._bad_lines, self._bad_said = 0, now
        found, self.problems = self.problems, []
        return found

    def _lines(self, fd: int, size: int, deadline: float) -> Iterator[Command | Refused]:
        buf, pos = b"", 0  # the file's bytes from ``offset`` on, and where in them we are
        while True:
            end = buf.find(b"\n", pos)
            if end < 0:
                rest = len(buf) - pos
                if self._skipping >= 0 or rest > MAX_LINE:  # too long: drop it as it comes
                    self._skipping = max(self._skipping, 0) + rest
                    self.offset += rest
                    buf, pos = b"", 0
                else:
                    buf, pos = buf[pos:], 0
                at = self.offset + len(buf)
                more = os.pread(fd, min(_CHUNK, size - at), at) if at < size else b""
                if not more:
                    return  # all read, or a line still being written: it ends later
                buf += more
                continue
            line = buf[pos : end + 1]
            pos = end + 1
            if self._skipping >= 0:
                length, self._skipping = self._skipping + len(line), -1
                self._bad(f"a line of {length:,} bytes, more than any command ({MAX_LINE:,})")
                item = None
            else:
                item = self._line(line)
            self.offset += len(line)
            if item is not None:
                yield item
            if time.perf_counter() > deadline:
                return

    def _line(self, line: bytes) -> Command | Refused | None:
        """What a whole line at ``offset`` is: a command to apply, a numbered line
        refused, or nothing to answer (None)."""
        if not line.strip():
            return None
        try:
            command = parse(line.rstrip(b"\n"))
        except BadLine as exc:
            if exc.seq is None:
                self._bad(str(exc))
                return None
            return Refused(exc.seq, str(exc))
        if command.sent < self.since:
            return None  # for an earlier run
        if self.offset < self._distrust_below:
            return Refused(
                command.seq,
                f"it was unread in {self.path} while others could write it, so it may be "
                "theirs: send it again",
            )
        return command

    def _bad(self, why: str) -> None:
        if self._bad_said == -math.inf:
            self._bad_said = time.monotonic()
            self.problems.append(f"ignored a line of {self.path}: {why}")
        else:
            self._bad_lines += 1

    def _refuse(self, why: str, info: os.stat_result) -> None:
        """Said once per reason. A file others may write is exposed: what comes into
        it until it is private again is refused then."""
        if why != self._refused:
            self.problems.append(f"not reading {self.path}: {why}")
        self._refused = why
        self._last = ()
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            self._exposed = (info.st_dev, info.st_ino)

    def _resume(self, info: os.stat_result) -> None:
        note = f"reading {self.path} again"
        if self._exposed == (info.st_dev, info.st_ino):
            self._distrust_below = info.st_size
            note += "; what it held unread while others could write it is refused"
        self.problems.append(note)
        self._refused = self._exposed = None


def _open_checked(path: Path) -> tuple[int, os.stat_result, str | None] | None:
    """A descriptor of the file at ``path`` (-1 if it is no regular file), its own
    ``fstat``, and why a recorder may not read it, if it may not (None: nothing
    there). A link is not followed, nor a pipe or device opened."""
    try:
        info = os.lstat(path)
        fd = -1
        if stat.S_ISREG(info.st_mode):
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            info = os.fstat(fd)
    except OSError:
        return None  # removed or replaced since: looked at again next time
    why = refusal(info)
    if why is not None and fd >= 0:
        os.close(fd)
        fd = -1
    return fd, info, why


def _identity(info: os.stat_result) -> tuple[int, ...]:
    return (
        info.st_dev,
        info.st_ino,
        info.st_size,
        info.st_mtime_ns,
        info.st_ctime_ns,
        info.st_mode,
        info.st_uid,
    )
