"""A recorder's side of the steering channel (hookdbg/control.py has its contract): the
lines appended to the control file since the recorder last looked, read within a budget
and checked, each a command to apply or a numbered line to answer with why not."""

from __future__ import annotations

import math
import os
import stat
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hookdbg.control import BUDGET, MAX_LINE, POLL_EVERY, BadLine, Command, parse, refusal

_CHUNK = 64 * 1024  # bytes read at a time


@dataclass(frozen=True)
class Refused:
    """A numbered line a recorder will not apply, and why: answered, never applied."""

    seq: int
    why: str
    sent: float | None = None  # the command's time, if the line had a valid one


@dataclass
class Reader:
    """A recorder's side: the lines appended to a control file since it last looked.
    Lines there before ``since`` (the recording's start) were meant for another run.

    It reads a file only through a descriptor opened without following a link and
    checked itself (a regular file of this user no one else may write). A file once
    seen writable by others, or another user's, is never read again, even once it is
    private: whoever could write it then may still hold it open (and this reader holds
    it open too, so that no file made anew gets its inode). A copy of an older control
    file put back is not read again either: commands sent before the last one taken
    are skipped. Per look, ``budget`` seconds at most (at least one line); the rest
    waits for the next look."""

    path: Path
    since: float
    budget: float = BUDGET
    offset: int = 0  # bytes of the file read (or skipped): the next line begins here
    _seen: float = -math.inf  # when it last looked
    _last: tuple[int, ...] = ()  # the file's identity, size, times, mode and owner then
    _inode: tuple[int, int] = (-1, -1)  # (device, inode) of the file read
    _head: bytes = b""  # its first bytes: a file made anew (same inode or not) differs
    _refused: str | None = None  # why the file at the path is not read, while it is not
    # files never read again, (device, inode) -> a descriptor held open on each, so
    # that its inode is not given to a file made anew at the path
    _tainted: dict[tuple[int, int], int] = field(default_factory=dict)
    _newest: float = -math.inf  # the latest ``sent`` of a command taken
    _replayed: float = -math.inf  # commands sent until then come from an older file
    _skipping: int = -1  # inside a line longer than any command: its bytes so far
    _behind: bool = False  # the last look left lines for the next
    _bad_lines: int = 0  # bad lines without a command number, not said yet
    _bad_said: float = -math.inf  # when that count was last said
    _skipped_old: int = 0  # commands skipped as sent before the newest taken
    problems: list[str] = field(default_factory=list)  # what to say, once each

    def __post_init__(self) -> None:
        opened = _open_checked(self.path)
        if opened is not None and opened[2] is None:
            fd, info, _ = opened
            try:
                self.offset = info.st_size
                self._head = os.pread(fd, 64, 0)
                self._last, self._inode = _identity(info), (info.st_dev, info.st_ino)
            finally:
                os.close(fd)

    def poll(self, now: float, every: float = POLL_EVERY) -> Iterator[Command | Refused]:
        """The commands that arrived, and the numbered lines refused, in the file's
        order; at most every ``every`` seconds, within ``BUDGET`` seconds of work."""
        if now - self._seen < every:
            return
        self._seen = now
        deadline = time.perf_counter() + self.budget
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
            inode = (info.st_dev, info.st_ino)
            head = os.pread(fd, 64, 0)
            if (
                inode != self._inode
                or head[: len(self._head)] != self._head
                or info.st_size < self.offset
            ):
                self._made_anew()
            self._last, self._inode = _identity(info), inode
            self._head = head
            refuse = _TAINTED if (info.st_dev, info.st_ino) in self._tainted else None
            if refuse != self._refused:  # its commands answered, none applied
                self.problems.append(
                    f"reading {self.path} again"
                    if refuse is None
                    else f"applying no command of {self.path}: {refuse}"
                )
                self._refused = refuse
            behind = yield from self._lines(fd, info.st_size, deadline, refuse)
        finally:
            os.close(fd)
        if behind != self._behind:
            self._behind = behind
            self.problems.append(
                f"reading a backlog of {info.st_size - self.offset:,} bytes of {self.path}, "
                f"{self.budget * 1e3:g} ms a look"
                if behind
                else f"read the backlog of {self.path}"
            )

    def said(self, now: float, final: bool = False) -> list[str]:
        """What to say of the file itself: each refusal once, the first bad line with
        why, and the count of later ones at most once a minute (and at the end)."""
        if self._bad_lines and (final or now - self._bad_said >= 60):
            n = self._bad_lines
            self.problems.append(f"ignored {n:,} more bad line{'s' * (n != 1)} of {self.path}")
            self._bad_lines, self._bad_said = 0, now
        if self._skipped_old and (final or not self._behind):
            n, self._skipped_old = self._skipped_old, 0
            self.problems.append(
                f"skipped {n:,} command{'s' * (n != 1)} of {self.path} sent before the last "
                "one read (a copy of an older control file put back?)"
            )
        found, self.problems = self.problems, []
        return found

    def _made_anew(self) -> None:
        """The file was removed and made anew, or rewritten in place: read from its
        start, but no command again."""
        self.offset, self._skipping, self._replayed = 0, -1, self._newest

    def _lines(
        self, fd: int, size: int, deadline: float, refuse: str | None
    ) -> Generator[Command | Refused, None, bool]:
        """The lines from ``offset`` to ``size`` (each command refused, with
        ``refuse``, if given); True if the budget ran out first."""
        buf, pos = b"", 0  # the file's bytes from ``offset`` on, and where in them we are
        start = self.offset
        while True:
            if self.offset > start and self.offset < size and time.perf_counter() > deadline:
                return True  # (at least a line, or a part of one too long, per look)
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
                    return False  # all read, or a line still being written: it ends later
                buf += more
                continue
            line = buf[pos : end + 1]
            pos = end + 1
            if self._skipping >= 0:
                length, self._skipping = self._skipping + len(line), -1
                self._bad(f"a line of {length:,} bytes, more than any command ({MAX_LINE:,})")
                item = None
            else:
                item = self._line(line, refuse)
            self.offset += len(line)
            if item is not None:
                yield item

    def _line(self, line: bytes, refuse: str | None) -> Command | Refused | None:
        """What a whole line is: a command to apply, a numbered line refused, or
        nothing to answer (None)."""
        if not line.strip():
            return None
        try:
            command = parse(line.rstrip(b"\n"))
        except BadLine as exc:
            if exc.seq is None:
                self._bad(str(exc))
                return None
            return Refused(exc.seq, str(exc), exc.sent)
        if command.sent < self.since:
            return None  # for an earlier run
        if command.sent <= self._replayed:
            self._skipped_old += 1
            return None
        self._newest = max(self._newest, command.sent)
        return command if refuse is None else Refused(command.seq, refuse, command.sent)

    def _bad(self, why: str) -> None:
        if self._bad_said == -math.inf:
            self._bad_said = time.monotonic()
            self.problems.append(f"ignored a line of {self.path}: {why}")
        else:
            self._bad_lines += 1

    def _refuse(self, why: str, info: os.stat_result) -> None:
        """Said once per reason. A regular file others may write, or another user's,
        is never read again."""
        if why != self._refused:
            self.problems.append(f"not reading {self.path}: {why}")
        self._refused = why
        self._last = ()
        inode = (info.st_dev, info.st_ino)
        if stat.S_ISREG(info.st_mode) and inode not in self._tainted:
            self._tainted[inode] = _hold(self.path, inode)
            if len(self._tainted) > _TAINTED_HELD:  # the oldest: long gone from the path
                _release(self._tainted.pop(next(iter(self._tainted))))

    def close(self) -> None:
        """Let go of the files held (the recording ends)."""
        for fd in self._tainted.values():
            _release(fd)
        self._tainted.clear()


_TAINTED_HELD = 16


def _hold(path: Path, inode: tuple[int, int]) -> int:
    """A descriptor of the file at ``path`` if it is still ``inode`` (-1 if not)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return -1
    info = os.fstat(fd)
    if (info.st_dev, info.st_ino) == inode:
        return fd
    os.close(fd)
    return -1


def _release(fd: int) -> None:
    if fd >= 0:
        os.close(fd)


_TAINTED = (
    "others could write it, or it was another user's, while this recording watched it, "
    "and may still hold it open: remove it, and `hookdbg ctl` makes a new one"
)


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
