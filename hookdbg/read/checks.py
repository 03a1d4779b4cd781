"""What a file must pass before the reader trusts any of it.

A recording is input like any other: copied half-way, cut short by a crash, edited by
hand, or built to hurt. At open the reader checks, in order: the file is a regular
HDF5 file whose superblock says it is whole; its writer finished setting it up; every
table is a group inside this file. Before a table is first read (``checked_columns``:
all its columns at once, for a live file at open) it checks that every column is a
plain dataset inside this file (no soft or external link, no virtual or external
storage: a recording holds none), 1-D with the schema's type, with the writer's filters
and chunks, and that no column, nor the table, declares more rows than its stored bytes
can hold (hookdbg/read/storage.py). Nothing is read, nor allocated, before it is
checked: a 134 kB file that claims 10^12 rows is refused, not read into 312 TiB, and
one naming a filter HDF5 lacks loads no plugin. A report reads only the tables it
needs, so that a distributed run's summary does not check every rank's tensors; a
damaged table it does not read leaves it working (``Recording.check`` checks all).

Every failure is a ``RecordingError`` whose message is one line for the user.

The module runs a little over 400 lines on purpose: the checks are one ordered gate,
and read together they show what the reader assumes of a file and in which order.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import h5py
import numpy as np

from hookdbg.read.storage import forget_plugin_paths, storage_problem, table_problem
from hookdbg.store import schema
from hookdbg.text import plural

T = TypeVar("T")

# What h5py raises for a file it cannot make sense of (corrupt metadata, bad heaps,
# missing filters): any of these from an h5py call on a recording means a damaged file.
H5_ERRORS = (OSError, ValueError, RuntimeError, KeyError, TypeError)


class RecordingError(Exception):
    """A file that cannot be read as a recording; the message is one line for the user."""


# -- the superblock: is the file whole, and did its writer finish creating it? ---------

_SIGNATURE = b"\x89HDF\r\n\x1a\n"
WRITING = 0x01  # file consistency flags of a version 2/3 superblock
SWMR_WRITING = 0x04


@dataclass(frozen=True)
class Superblock:
    """The facts a version 2/3 superblock (what hookdbg writes) gives away for free."""

    flags: int
    eof: int  # the end-of-file address: how long the file should be

    @property
    def being_created(self) -> bool:
        """Opened for writing but never switched to SWMR: the recorder switches as the
        last step of creating the file, so its process died while creating it."""
        return bool(self.flags & WRITING) and not self.flags & SWMR_WRITING


def superblock(path: Path) -> Superblock | None:
    """The superblock's flags and end-of-file address; None for other superblock
    versions (left to HDF5 to judge) or a file too short to hold one."""
    with open(path, "rb") as f:
        head = f.read(48)
    if not head.startswith(_SIGNATURE) or len(head) < 12 or head[8] not in (2, 3):
        return None
    width = head[9]  # size of offsets
    if width not in (4, 8) or len(head) < 12 + 4 * width:
        return None
    eof = int.from_bytes(head[12 + 2 * width : 12 + 3 * width], "little")
    return Superblock(flags=head[11], eof=eof)


_CREATING_SECONDS = 10.0  # creating a file takes milliseconds; 10 s of silence means dead


def created_too_soon(path: Path, detail: str) -> RecordingError:
    """The file's writer never finished setting it up: it died doing so (``kill -9``
    within milliseconds of starting), or, if the file is seconds old, is still at it."""
    try:
        age = time.time() - path.stat().st_mtime
    except OSError:
        age = float("inf")
    if age < _CREATING_SECONDS:
        return RecordingError(
            f"{path} is still being created, or its recording process died as it started "
            f"({detail}); try again in a moment"
        )
    return RecordingError(
        f"{path} was cut short while it was being created: the recording process ended "
        f"before the file was set up ({detail}), so nothing was recorded in it"
    )


def open_file(path: Path) -> tuple[h5py.File, Superblock | None]:
    """Open read-only: plainly if the file was closed cleanly, else (still being written,
    or its writer died) with SWMR. Truncation and a file whose writer died creating it
    are told from the superblock first, so the message can say which it was."""
    forget_plugin_paths()  # before HDF5 reads anything of the file
    if not path.exists():
        raise RecordingError(f"{path}: no such file")
    if path.is_dir():
        raise RecordingError(f"{path} is a directory, not a recording")
    if not path.is_file():
        raise RecordingError(f"{path} is not a regular file (a device or a pipe?)")
    try:
        size = path.stat().st_size
        if size == 0:
            raise RecordingError(
                f"{path} is empty (0 bytes): nothing was ever written to it (a recording "
                "process killed as it started leaves this)"
            )
        is_hdf5 = h5py.is_hdf5(path)
        block = superblock(path)
    except OSError as exc:
        raise RecordingError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if not is_hdf5:
        raise RecordingError(f"{path} is not a hookdbg recording (not an HDF5 file)")
    if block is not None:
        if block.being_created:
            raise created_too_soon(path, f"{size:,} bytes written")
        if size < block.eof and not block.flags & SWMR_WRITING:
            why = (
                "was it copied while being written, or did a transfer stop early?"
                if block.flags & WRITING
                else "did a copy or a transfer stop early?"
            )
            raise RecordingError(
                f"{path} is damaged: it is truncated ({size:,} of {block.eof:,} bytes); {why}"
            )
        # Shorter than it says, but its SWMR writer never closed it: the disk filled up
        # (HDF5 had reserved space it could not write) or the writer died extending it.
        # Everything the writer committed is there (``committed``); reads are bounded.
    writing = block is not None and bool(block.flags & SWMR_WRITING)
    # HDF5 may refuse its file lock: a recorder holds it while it creates the file, but
    # anyone who may read a file can lock it, so a refused lock is tried once more
    # without locks (a file being created still fails, and is said to be). A file this
    # process already holds opens only with the locking it was opened with.
    try:
        return _open(path, writing, locking=None), block
    except OSError as exc:
        if not (_locked(exc) or _other_locking(exc)):
            raise damaged(path, exc) from None
        first = exc
    try:
        return _open(path, writing, locking=False), block
    except OSError as exc:
        raise damaged(path, first if _locked(first) else exc) from None


def _open(path: Path, writing: bool, locking: bool | None) -> h5py.File:
    """``locking``: None is HDF5's default, what every other opener in this process uses."""
    if not writing:  # closed by its writer: a plain open (HDF5 refuses it otherwise)
        try:
            return h5py.File(path, "r", locking=locking)
        except OSError as exc:
            if "already open for write" not in str(exc):
                raise
    return _open_swmr(path, locking)  # open for write: live, or it died (kill -9, crash)


def _locked(exc: OSError) -> bool:
    """HDF5 could not take the file's lock."""
    return getattr(exc, "errno", None) == 11 and "lock" in str(exc)


def _other_locking(exc: OSError) -> bool:
    """The file is open in this process with the other file-locking setting."""
    return "file locking" in str(exc) and "don't match" in str(exc)


# A SWMR reader retries a metadata read that fails its checksum (a torn read while the
# writer flushes), sleeping 1 ns, 2 ns, 4 ns... between attempts. HDF5's default of 100
# attempts never ends on a file that is simply corrupt (measured on a damaged cut-short
# recording: 30 attempts 1.1 s, 33 attempts 8.6 s, 36 attempts 69 s). 28 attempts wait
# about 0.27 s in all, ample for a writer to finish a flush.
_SWMR_READ_ATTEMPTS = 28


# Files being written, opened once per process however many readers open them: HDF5
# reads wrong chunks from a dataset opened twice once one of its handles is refreshed
# (a notebook cell that opens a live recording again), so readers of one file share the
# file and its datasets (``_shared``). (device, inode) -> [the file, its readers]
_LIVE: dict[tuple[int, int], list] = {}
_LIVE_LOCK = threading.Lock()


def _open_swmr(path: Path, locking: bool | None = None) -> h5py.File:
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    if locking is not None:
        fapl.set_file_locking(locking, True)
    _limit_read_attempts(fapl, _SWMR_READ_ATTEMPTS)
    flags = h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ
    with _LIVE_LOCK:
        f = h5py.File(h5py.h5f.open(os.fsencode(path), flags, fapl=fapl))
        st = os.fstat(f.id.get_vfd_handle())  # the file opened, whatever the path names now
        key = (st.st_dev, st.st_ino)
        held = _LIVE.get(key)
        if held is not None and held[0].id.valid:
            f.close()
            held[1] += 1
            return held[0]
        _LIVE[key] = [f, 1]
        return f


def close_file(f: h5py.File) -> None:
    """Close a file ``open_file`` gave, once its last reader in this process is done."""
    with _LIVE_LOCK:
        for key, held in _LIVE.items():
            if held[0] is f:
                held[1] -= 1
                if held[1] > 0:
                    return
                del _LIVE[key]
                break
    f.close()


def _limit_read_attempts(fapl: h5py.h5p.PropFAID, attempts: int) -> None:
    """H5Pset_metadata_read_attempts, which h5py does not wrap: looked up through h5py's
    own extension module, so it is the HDF5 library h5py uses. Without it (an unusual
    build), HDF5's default applies."""
    try:
        setter = ctypes.CDLL(h5py.h5p.__file__).H5Pset_metadata_read_attempts
    except (OSError, AttributeError):
        return
    setter.argtypes = [ctypes.c_int64, ctypes.c_uint]
    setter.restype = ctypes.c_int
    setter(fapl.id, attempts)


def read_or_fail(path: Path, what: str, read: Callable[[], T]) -> T:
    """Run an h5py read of ``what``; its failure (a corrupt chunk, a filter HDF5 lacks)
    is the file's fault, said in one line."""
    try:
        return read()
    except H5_ERRORS as exc:
        raise RecordingError(f"{path} is damaged: cannot read {what} ({reason(exc)})") from None


def damaged(path: Path, exc: BaseException) -> RecordingError:
    if isinstance(exc, OSError) and _locked(exc):  # HDF5's file lock, even without it
        return RecordingError(
            f"{path} is being created by its recorder (it holds the file's lock until "
            "the file can be read): try again in a moment"
        )
    return RecordingError(
        f"{path} is damaged and cannot be read (truncated or corrupt: {reason(exc)})"
    )


def reason(exc: BaseException) -> str:
    """The first line of an h5py error (KeyError's message comes without its quotes)."""
    text = str(exc.args[0]) if exc.args else ""
    return text.splitlines()[0] if text.strip() else type(exc).__name__


# -- structure: tables, columns, links ---------------------------------------------------

_LINK_KINDS = {h5py.SoftLink: "a soft link", h5py.ExternalLink: "an external link"}


def member(
    group: h5py.Group, name: str, where: str, path: Path, live: bool | None = None
) -> object | None:
    """``group[name]`` if it is a hard link (an object inside this file), None if there
    is none. Soft links (which may point at themselves) and external links (to other
    files) are refused without following them: a recording holds no links. ``live``:
    whether the file is read as it is written, where the caller knows."""
    key = name.encode()
    try:
        if not group.id.links.exists(key):
            return None
        if group.id.links.get_info(key).type != h5py.h5l.TYPE_HARD:
            link = group.get(name, getlink=True)
            label = _LINK_KINDS.get(type(link), "a link")
            target = getattr(link, "filename", None) or getattr(link, "path", "?")
            raise RecordingError(
                f"{path} is damaged: {where} is {label} (to {target}), which a recording "
                "never holds; refusing to follow it"
            )
        found = h5py.h5o.open(group.id, key)
    except H5_ERRORS as exc:
        raise damaged(path, exc) from None
    if isinstance(found, h5py.h5d.DatasetID):
        live = _swmr(group.id) if live is None else live
        # a closed file does not change: h5py then keeps what it learnt of the column
        # (its shape, its reader) instead of asking HDF5 again at every use
        return _shared(group, name, h5py.Dataset(found, readonly=not live), live)
    return h5py.Group(found) if isinstance(found, h5py.h5g.GroupID) else found


# The datasets of files being written, by (file, path), shared by every reader of the
# file in this process (``_LIVE``).
_SHARED: weakref.WeakValueDictionary[tuple[object, str], h5py.Dataset] = (
    weakref.WeakValueDictionary()
)


def _shared(group: h5py.Group, name: str, opened: h5py.Dataset, live: bool) -> h5py.Dataset:
    """``opened``, or the handle of the same dataset another reader holds, in a file
    being written (SWMR); a closed file's datasets do not change, and are not shared."""
    if not live:
        return opened
    key = (group.id.fileno, f"{group.name.rstrip('/')}/{name}")
    held = _SHARED.get(key)
    # (only a handle of this very file: a number HDF5 gave a file closed since may be
    # given to another)
    if held is not None and held.id.valid and held.file.id == group.file.id:
        opened.id.close()
        held.refresh()  # as the file is now, not as the first reader opened it
        return held
    _SHARED[key] = opened
    return opened


def _swmr(oid: h5py.h5g.GroupID) -> bool:
    """Whether the file holding ``oid`` is read as it is written (SWMR), asked of the
    file's id alone (an ``h5py.File`` object costs more to build than the question)."""
    intent = h5py.h5i.get_file_id(oid).get_intent()
    return bool(intent & (h5py.h5f.ACC_SWMR_READ | h5py.h5f.ACC_SWMR_WRITE))


def checked_dataset(
    parent: h5py.Group,
    name: str,
    where: str,
    expected: np.dtype,
    path: Path,
    file_size: int,
    missing: str | None = None,
    dims: int = 1,
    filters: Collection[tuple[int, ...]] = schema.COLUMN_FILTERS,
    live: bool | None = None,
) -> h5py.Dataset:
    """A column (or the capture bytes) that can be read safely: a dataset of ``dims``
    dimensions inside the file, of the expected kind, stored with ``filters`` (one of
    these pipelines) in chunks the writer could have made, declaring no more rows than
    its storage can hold (hookdbg/read/storage.py)."""
    ds = member(parent, name, where, path, live)
    if ds is None:
        raise RecordingError(f"{path} is damaged: {missing or where + ' is missing'}")
    if not isinstance(ds, h5py.Dataset):
        raise RecordingError(f"{path} is damaged: {where} is a group, not a column")
    try:
        shape, dtype = ds.shape, ds.dtype  # h5py keeps the shape it read
        plist = ds.id.get_create_plist()
        if plist.get_layout() == h5py.h5d.VIRTUAL or plist.get_external_count():
            raise RecordingError(
                f"{path} is damaged: {where} keeps its data in other files, which a "
                "recording never does; refusing to read it"
            )
    except H5_ERRORS as exc:
        raise damaged(path, exc) from None
    if shape is None or len(shape) != dims:
        found = "no shape" if shape is None else f"shape {shape}"
        wanted = "one dimension" if dims == 1 else f"{dims} dimensions"
        raise RecordingError(f"{path} is damaged: {where} has {found}, expected {wanted}")
    same = dtype.kind == expected.kind and (
        dtype.kind == "S" or dtype.itemsize == expected.itemsize
    )
    if not same or dtype.names is not None or dtype.subdtype is not None:
        raise RecordingError(
            f"{path} is damaged: {where} has type {dtype}, expected {expected.str.lstrip('<|')}"
        )
    try:
        problem = storage_problem(ds, where, file_size, filters, plist)
    except H5_ERRORS as exc:
        raise damaged(path, exc) from None
    if problem is not None:
        raise RecordingError(f"{path} is damaged: {problem}")
    return ds


def checked_groups(f: h5py.File, path: Path, tables: Collection[str]) -> dict[str, h5py.Group]:
    """Each table's group: a group inside this file, not the file's root."""
    root = read_or_fail(path, "the root group", lambda: f["/"])
    out = {}
    for name in tables:
        group = member(f, name, f"table {name!r}", path)
        if group is None:
            raise RecordingError(f"{path} is damaged: table {name!r} is missing")
        if not isinstance(group, h5py.Group):
            raise RecordingError(f"{path} is damaged: table {name!r} is not a group of columns")
        if group == root:
            raise RecordingError(f"{path} is damaged: table {name!r} links back to the file's root")
        out[name] = group
    return out


def checked_columns(
    group: h5py.Group,
    name: str,
    dtype: np.dtype,
    path: Path,
    lacks: Collection[str] = (),
) -> dict[str, h5py.Dataset]:
    """A table's columns, checked (see ``checked_dataset``), but those it ``lacks`` (an
    older schema had none). Extra columns and attributes are ignored: a newer recorder
    may add some."""
    file_size = os.path.getsize(path)
    filters = schema.END_FILTERS if name == schema.END_TABLE else schema.COLUMN_FILTERS
    live = _swmr(group.id)
    out = {
        column: checked_dataset(
            group,
            column,
            f"{name}/{column}",
            dtype[column],
            path,
            file_size,
            missing=f"table {name!r} has no column {column!r}",
            filters=filters,
            live=live,
        )
        for column in dtype.names or ()
        if column not in lacks
    }
    try:
        problem = table_problem(name, out.values(), file_size)
    except H5_ERRORS as exc:
        raise damaged(path, exc) from None
    if problem is not None:
        raise RecordingError(f"{path} is damaged: {problem}")
    return out


def checked_committed(
    f: h5py.File, path: Path, tables: int, tails: bool = False
) -> h5py.Dataset | None:
    """What the writer vouched for, for each of the first ``tables`` of schema.TABLES
    (the file's schema version has those): the rows in each table's columns and, from
    version 5 (``tails``), its tail's generation and length (schema.SEALED, GENERATION, TAIL_BYTES);
    None in a schema-1 file, which has none."""
    shape = (3, tables) if tails else (tables,)
    ds = optional_dataset(f, schema.COMMITTED, np.dtype("<i8"), path, dims=len(shape))
    if ds is None:
        return None
    if ds.shape != shape:
        raise RecordingError(
            f"{path} is damaged: {schema.COMMITTED} has shape {ds.shape}, expected {shape}"
        )
    return ds


def optional_dataset(
    f: h5py.File, name: str, expected: np.dtype, path: Path, dims: int = 1
) -> h5py.Dataset | None:
    """An uncompressed dataset at the file's root that some recordings lack (None
    there), checked (``checked_dataset``)."""
    if member(f, name, name, path) is None:
        return None
    size = os.path.getsize(path)
    return checked_dataset(
        f, name, name, expected, path, size, dims=dims, filters=schema.NO_FILTERS
    )


def checked_capture_data(f: h5py.File, path: Path) -> h5py.Dataset:
    """The flat bytes that ``captures`` rows point into."""
    name = schema.CAPTURE_DATA
    size = os.path.getsize(path)
    return checked_dataset(
        f, name, name, np.dtype("u1"), path, size, filters=schema.CAPTURE_FILTERS
    )


def check_column_values(where: str, name: str, values: np.ndarray, path: Path) -> None:
    """Codes a report turns into names (phase, slot, kind, reason) must be known ones."""
    limit = _CODE_LIMITS.get(name)
    if limit is not None and len(values):
        top = int(values.max())
        if top > limit:
            raise RecordingError(
                f"{path} is damaged: {where}/{name} holds {top}, which is no {name} "
                f"(0 to {limit}); {plural(int((values > limit).sum()), 'row')} affected"
            )


_CODE_LIMITS = {
    "phase": max(schema.Phase),
    "slot": max(schema.Slot),
    "kind": max(schema.ModuleKind),
    "reason": max(schema.CaptureReason),
}


def check_module_rows(rows: np.ndarray, path: Path) -> None:
    """The module table must be a forest: unique ids, parents that exist, no cycles.
    Any depth is one: a model nests as deep as its script's recursion limit let it run,
    and readers walk the tree with loops, not recursion."""
    ids = rows["id"].tolist()
    if len(set(ids)) != len(ids):
        raise RecordingError(f"{path} is damaged: the modules table repeats module ids")
    parent = dict(zip(ids, rows["parent"].tolist(), strict=True))
    rooted: set[int] = set()  # modules whose parents are known to lead to a root
    for start in ids:
        chain: list[int] = []
        node = start
        while node != -1 and node not in rooted:
            if node not in parent:
                raise RecordingError(
                    f"{path} is damaged: module {chain[-1]} has parent {node}, which is no module"
                )
            chain.append(node)
            if len(chain) > len(ids):
                raise RecordingError(f"{path} is damaged: module {start}'s parents form a loop")
            node = parent[node]
        rooted.update(chain)
