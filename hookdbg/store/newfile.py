"""A recording's file comes to disk whole, or not at all.

The writer lays the file out (its tables, the end row's preallocated bytes, a first
progress row) in memory, with HDF5's core driver, and this module puts the image on disk
with plain OS writes; HDF5 then opens it and starts SWMR. So a full disk (or a quota, or
a file size limit) is met by ``os.write``, before HDF5 has anything of the file on
disk, and the recording is refused with one line saying how much it needed and how
much was free.

Measured with h5py 3.16 / HDF5 2.0 on a 20 MB tmpfs: when HDF5 itself runs out of space
while it creates the file, its flush fails half-way and leaves the file's metadata
cache unable to flush again ("Slist already enabled?"); closing the file then fails,
each dataset handle freed later prints an ignored ``RuntimeError`` traceback ("Can't
decrement id ref count"), and the process may end by SIGSEGV at exit. That file cannot
be closed cleanly, so it must never come to exist.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
from pathlib import Path

import h5py

from hookdbg.text import human_bytes

LIBVER = ("v110", "v110")  # SWMR needs the v110 file format at least
# Free space a recording needs beyond its new file to start: its first flushes take
# some (each table's tail gets a 16 kB chunk, a table's columns a chunk each once it
# fills one; a 3-step MLP run took 120 kB more than the new file). With less, writing
# would stop at the first flush and the run would record nothing.
START_ROOM = 1 << 20
_LIMITS = {errno.EDQUOT, errno.EFBIG}  # a quota, a file size limit: no room either
# a version 2 or 3 superblock (HDF5 file format spec, II.A): the signature, then one byte
# each for the version, the sizes of offsets and lengths, and the consistency flags
_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_FLAGS_AT = 11
_WRITING = 0x01  # the file is open for writing
_names = itertools.count()  # open in-memory files need names of their own


class DiskFull(Exception):
    """Too little room for the file; the message says how much it needed and had."""


def in_memory() -> h5py.File:
    """An empty HDF5 file in memory only, in the format the recording is written in."""
    name = f"hookdbg-new-{os.getpid()}-{next(_names)}.h5"
    return h5py.File(name, "w", driver="core", backing_store=False, libver=LIBVER)


def image(f: h5py.File) -> bytes:
    """The bytes of ``f`` (an in-memory file) as a file on disk would hold them, with
    HDF5's marks of a file open for writing cleared."""
    f.flush()
    return bytes(f.id.get_file_image())


def put(path: Path, data: bytes) -> None:
    """Write ``data`` as the new file ``path`` (replacing one there). DiskFull if the
    disk has less than the file and ``START_ROOM`` free, or runs out meanwhile; OSError
    if the file cannot be written for another reason. Either way nothing is left at
    ``path``.

    A file there is unlinked, never truncated: a reader holding an older recording
    (`hookdbg tui`, a notebook) reads on in it. Through a symlink, its target is
    replaced."""
    need = len(data) + START_ROOM
    free = free_space(path)
    if free is not None and free < need:
        raise DiskFull(_full(need, free))
    path = Path(os.path.realpath(path))
    with contextlib.suppress(OSError):
        if stat.S_ISREG(os.stat(path, follow_symlinks=False).st_mode):
            path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        view = memoryview(_marked(data))
        while view:
            view = view[os.write(fd, view) :]
        os.pwrite(fd, data[_FLAGS_AT : _FLAGS_AT + 1], _FLAGS_AT)  # whole: HDF5 may open it
    except OSError as exc:
        os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink()
        if exc.errno == errno.ENOSPC:
            raise DiskFull(_full(need, free_space(path) or 0)) from None
        if exc.errno in _LIMITS:
            need_text = f"a recording needs {human_bytes(need)} to start"
            raise DiskFull(f"{exc.strerror} ({need_text})") from None
        raise
    try:
        os.close(fd)  # where a network file system reports what it could not write
    except OSError:
        with contextlib.suppress(OSError):
            path.unlink()
        raise


def _marked(data: bytes) -> bytes:
    """``data`` with its superblock saying "open for writing", as HDF5's own does while
    it writes a file: a reader that finds the file before it is whole (a process killed
    as it writes it) is told that it was being created, not that it was truncated by a
    copy (hookdbg/read/checks.py). The superblock's checksum no longer matches, which
    keeps HDF5 out as well; ``put`` writes the original byte back last."""
    if data[: len(_SIGNATURE)] != _SIGNATURE or data[len(_SIGNATURE)] not in (2, 3):
        return data
    return data[:_FLAGS_AT] + bytes([data[_FLAGS_AT] | _WRITING]) + data[_FLAGS_AT + 1 :]


def free_space(path: Path, replacing: bool = True) -> int | None:
    """Bytes that a file written at ``path`` can take: what the file system holding it
    has free for this user, plus what the file there now holds if it is ``replacing``
    it (not if it grows). None where the file system does not say."""
    try:
        fs = os.statvfs(path.parent)
    except OSError:
        return None
    free = fs.f_bavail * fs.f_frsize
    if not replacing:
        return free
    with contextlib.suppress(OSError):
        st = os.stat(path, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            free += st.st_blocks * 512
    return free


def _full(need: int, free: int) -> str:
    have, want = human_bytes(free), human_bytes(need)
    if have == want:  # 1.1 MB of 1.1 MB: in kB, to tell them apart
        have, want = f"{free / 1000:,.0f} kB", f"{need / 1000:,.0f} kB"
    return f"the disk is full ({have} free; a recording needs {want} to start)"
