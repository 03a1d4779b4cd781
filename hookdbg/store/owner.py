"""One writer per recording: a recorder holds a POSIX write lock on its file while it
writes it, so that another recorder does not truncate a file a live run is writing
(under SWMR HDF5 gives up its own file lock, and ``record -f`` would go through).

The lock is on one byte far past the end of the file, taken with ``lockf``: it guards
nothing in the file and does not meet the ``flock`` locks HDF5 takes for readers. The
kernel drops it when the writing process ends, however it ends (``kill -9`` too).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

_AT = 1 << 62  # the byte locked: past any file's end


def hold(fd: int) -> None:
    """Mark the file open on ``fd`` (for writing) as written by this process."""
    # (a file system without POSIX locks: no guard, nothing else changes)
    with contextlib.suppress(OSError):
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _AT)


def written_by_another(path: Path) -> bool:
    """Whether a live process holds ``path`` as its recording's writer."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False  # not there, or not ours to overwrite: the caller says which
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _AT)
    except OSError:
        return True
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, _AT)
        return False
    finally:
        os.close(fd)


def not_writable(path: Path, force: bool) -> str | None:
    """Why a recording may not be written to ``path`` (None: it may), said the same by
    the recorder and by ``hookdbg record`` before torch loads."""
    if path.is_dir():
        return f"{path} is a directory; give a file name like run.h5"
    if path.exists() and not force:
        return f"{path} already exists; pass --force to overwrite it"
    if written_by_another(path):
        return (
            f"{path} is being written by another recording that is still running: stop it "
            "(`hookdbg ctl FILE stop`) or record to another file"
        )
    return None
