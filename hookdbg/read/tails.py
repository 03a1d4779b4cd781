"""A table's tail: its rows after the last whole chunk of its columns, while the file is
written or after it was cut short (hookdbg/store/schema.py: TAIL_SLOTS).

The writer keeps them as a zlib stream of the rows (a numpy array of the table's row
dtype) in one of two byte slots, and ``committed`` names the slot and its length. The
writer only ever writes the slot ``committed`` does not name, so a reader that finds
``committed`` unchanged after reading a slot has read a whole tail; if the writer moved
on meanwhile, the read is repeated.

Like everything in a file, a tail is untrusted: its slot must be one of the two, its
length inside the slot, and the stream must inflate, completely, to whole rows and at
most a chunk of them (the writer seals a full chunk into the columns): a few bytes
claiming a gigabyte are refused, not inflated.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from functools import partial
from pathlib import Path

import h5py
import numpy as np

from hookdbg.read.checks import RecordingError, checked_dataset, member, read_or_fail
from hookdbg.store import schema

# (rows in the columns that the writer vouched for, the rows after them or None)
TableState = tuple[int, np.ndarray | None]

_TRIES = 5  # reads of a live file's tail that the writer may overtake before giving up


def _uncached(group: h5py.Group, name: str) -> h5py.Dataset:
    """``group[name]`` read from the file at every read: the writer rewrites a slot's
    chunks in place, and HDF5 would serve a chunk it cached at an earlier read."""
    access = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    access.set_chunk_cache(0, 0, 1.0)
    return h5py.Dataset(h5py.h5d.open(group.id, name.encode(), access))


def _committed_reader(
    f: h5py.File, path: Path, committed: h5py.Dataset
) -> Callable[[], np.ndarray]:
    """What reads ``committed`` as it is on disk now. While a file is written HDF5 may
    answer a read of a small contiguous dataset from a buffer it filled earlier (its
    data sieve): the bytes are read here with ``pread`` on HDF5's own descriptor (the
    file it opened, even if the path was replaced since)."""
    if not f.swmr_mode:
        return lambda: read_or_fail(path, schema.COMMITTED, lambda: committed[()])
    nbytes = committed.dtype.itemsize * int(np.prod(committed.shape))
    offset = read_or_fail(path, schema.COMMITTED, committed.id.get_offset)
    fd = read_or_fail(path, schema.COMMITTED, f.id.get_vfd_handle)
    if offset is None or committed.dtype != np.dtype("<i8") or not isinstance(fd, int):
        raise RecordingError(f"{path} is damaged: {schema.COMMITTED} is not stored as written")
    if offset + nbytes > os.fstat(fd).st_size:
        raise RecordingError(f"{path} is damaged: {schema.COMMITTED} lies past the file's end")

    def read() -> np.ndarray:
        try:
            data = os.pread(fd, nbytes, offset)
        except OSError as exc:
            raise RecordingError(f"{path}: cannot read it ({exc.strerror or exc})") from None
        if len(data) != nbytes:
            raise RecordingError(f"{path} is damaged: {schema.COMMITTED} lies past the file's end")
        return np.frombuffer(data, dtype="<i8").reshape(committed.shape)

    return read


def _chunk_bytes(ds: h5py.Dataset, nbytes: int, path: Path, name: str, live: bool) -> bytes:
    """The first ``nbytes`` of a slot, read from its chunks' places in the file with
    ``pread``: HDF5 serves a read of chunks rewritten in place from buffers it filled
    at an earlier read (its chunk cache, else its data sieve). A slot's chunks are
    uncompressed and, once written, stay where they are; a chunk the reader's index
    does not know yet was added as the slot grew (the index is refreshed once)."""
    fd = read_or_fail(path, name, ds.file.id.get_vfd_handle)
    plist = read_or_fail(path, name, ds.id.get_create_plist)
    chunk = (ds.chunks or (0,))[0]
    if not isinstance(fd, int) or plist.get_nfilters() or not chunk:
        raise RecordingError(f"{path} is damaged: {name} is not stored as written")
    size = os.fstat(fd).st_size  # the file HDF5 has open, even if the path was replaced
    parts = []
    for start in range(0, nbytes, chunk):
        info = read_or_fail(path, name, partial(ds.id.get_chunk_info_by_coord, (start,)))
        if info.byte_offset is None and live:
            read_or_fail(path, name, ds.refresh)
            info = read_or_fail(path, name, partial(ds.id.get_chunk_info_by_coord, (start,)))
        take = min(chunk, nbytes - start)
        at = info.byte_offset
        if at is None or info.size != chunk * ds.dtype.itemsize or at + take > size:
            raise RecordingError(f"{path} is damaged: {name} lacks the bytes its tail claims")
        try:
            parts.append(os.pread(fd, take, at))
        except OSError as exc:
            raise RecordingError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    return b"".join(parts)


def tail_reader(
    f: h5py.File,
    path: Path,
    table: str,
    committed: h5py.Dataset,
    dtype: np.dtype,
) -> Callable[[], TableState]:
    """What reads ``table``'s committed state now: its sealed rows and its tail."""
    index = list(schema.TABLES).index(table)
    group = member(f, table, f"table {table!r}", path)
    assert isinstance(group, h5py.Group), "checked_tables has checked the table"
    size = os.path.getsize(path)
    for slot in schema.TAIL_SLOTS:
        checked_dataset(group, slot, f"{table}/{slot}", np.dtype("u1"), path, size)
    slots = [
        read_or_fail(path, f"{table}/{slot}", partial(_uncached, group, slot))
        for slot in schema.TAIL_SLOTS
    ]
    most = schema.TABLES[table][1] * dtype.itemsize  # a chunk of rows
    where = f"the tail of table {table!r}"
    live = f.swmr_mode

    read_committed = _committed_reader(f, path, committed)

    def state() -> np.ndarray:
        return read_committed()[:, index]

    def inflate(slot: int, nbytes: int) -> np.ndarray:
        if slot not in (0, 1) or nbytes < 0:
            raise RecordingError(f"{path} is damaged: {where} names slot {slot}")
        ds = slots[slot]
        if live and nbytes > ds.shape[0]:  # the writer grew the slot for a longer tail
            # (only then: HDF5 reads wrong chunks after a refresh of a dataset that is
            # open twice in one process, as two readers of one file have it)
            read_or_fail(path, f"{table}/{schema.TAIL_SLOTS[slot]}", ds.refresh)
        if nbytes > ds.shape[0]:
            raise RecordingError(
                f"{path} is damaged: {where} claims {nbytes:,} bytes, its slot holds "
                f"{ds.shape[0]:,}"
            )
        name = f"{table}/{schema.TAIL_SLOTS[slot]}"
        data = _chunk_bytes(ds, nbytes, path, name, live)
        stream = zlib.decompressobj()
        try:
            raw = stream.decompress(data, most + 1)
        except zlib.error as exc:
            raise RecordingError(f"{path} is damaged: {where} does not inflate ({exc})") from None
        whole = stream.eof and not stream.unconsumed_tail and not stream.unused_data
        if not whole or len(raw) > most or len(raw) % dtype.itemsize:
            raise RecordingError(
                f"{path} is damaged: {where} does not hold whole rows, at most a chunk of them"
            )
        return np.frombuffer(raw, dtype=dtype)

    def read() -> TableState:
        for attempt in range(_TRIES):
            before = state()
            sealed, slot, nbytes = (
                int(before[i]) for i in (schema.SEALED, schema.SLOT, schema.TAIL_BYTES)
            )
            if nbytes == 0:
                return sealed, None
            try:
                rows = inflate(slot, nbytes)
            except RecordingError:
                if not live or attempt == _TRIES - 1 or (state() == before).all():
                    raise
                continue  # the writer rewrote the slot as it was read: read it again
            if not live or (state() == before).all():
                return sealed, rows
        raise RecordingError(f"{path}: {where} changed at every read ({_TRIES} tries)")

    return read
