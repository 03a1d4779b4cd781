"""Tables' tails: their rows after the last whole chunk of their columns, while the file
is written or after it was cut short (hookdbg/store/schema.py: TAIL_SLOTS).

The writer keeps a table's tail as a zlib stream of its rows (a numpy array of the
table's row dtype) in one of three byte slots, and ``committed`` says, per table, how
many rows its columns hold, how many times its tail was written (its slot is that
count modulo 3) and how long it is. A slot is rewritten two commits after it was named.
So a reader takes one snapshot of ``committed``, reads every table's tail it names,
and reads ``committed`` again: if no table's count moved by more than one, every tail
it read was whole and all of them belong to the one snapshot (one moment of the run:
no step with half its rows); else it reads again.

Like everything in a file, a tail is untrusted: its length must lie inside its slot,
and the stream must inflate, completely, to whole rows and at most a chunk of them (the
writer seals a full chunk into the columns): a few bytes claiming a gigabyte are
refused, not inflated.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from functools import partial
from pathlib import Path

import h5py
import numpy as np

from hookdbg.read.checks import RecordingError, checked_dataset, read_or_fail
from hookdbg.store import schema

# a table's rows in its columns, and the rows after them (None: none)
TableState = tuple[int, np.ndarray | None]

_TRIES = 5  # snapshots of a live file the writer may overtake before giving up


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


class Tails:
    """Reads every table's tail from one consistent snapshot of ``committed``."""

    def __init__(
        self,
        f: h5py.File,
        path: Path,
        committed: h5py.Dataset,
        dtypes: dict[str, np.dtype],
        groups: dict[str, h5py.Group],
    ) -> None:
        self.path = path
        self.live = f.swmr_mode
        self._committed = _committed_reader(f, path, committed)
        self._groups = groups
        self._slots: dict[tuple[str, int], h5py.Dataset] = {}  # checked as first read
        self._dtypes = dtypes

    def snapshot(self) -> tuple[dict[str, int], dict[str, np.ndarray | None]]:
        """Each table's rows in its columns and its tail, as of one commit."""
        for _ in range(_TRIES):
            before = self._committed()
            error: RecordingError | None = None
            tails: dict[str, np.ndarray | None] = {}
            try:
                for i, table in enumerate(self._dtypes):
                    generation, nbytes = (
                        int(before[schema.GENERATION, i]),
                        int(before[schema.TAIL_BYTES, i]),
                    )
                    tails[table] = self._inflate(table, generation, nbytes) if nbytes else None
            except RecordingError as exc:
                error = exc
            if not self.live:
                if error is not None:
                    raise error
                break
            moved = self._committed()[schema.GENERATION] - before[schema.GENERATION]
            if (moved <= 1).all():  # no slot read was rewritten meanwhile
                if error is not None:
                    raise error
                break
        else:
            raise RecordingError(
                f"{self.path}: its writer changed it at every read ({_TRIES} tries)"
            )
        sealed = {table: int(before[schema.SEALED, i]) for i, table in enumerate(self._dtypes)}
        negative = [table for table, n in sealed.items() if n < 0]
        if negative:
            raise RecordingError(
                f"{self.path} is damaged: {schema.COMMITTED} says table {negative[0]!r} "
                f"holds {sealed[negative[0]]:,} rows"
            )
        return sealed, tails

    def _slot(self, table: str, index: int) -> h5py.Dataset:
        """A tail's byte slot, checked when first read."""
        ds = self._slots.get((table, index))
        if ds is None:
            name = schema.TAIL_SLOTS[index]
            ds = self._slots[table, index] = checked_dataset(
                self._groups[table],
                name,
                f"{table}/{name}",
                np.dtype("u1"),
                self.path,
                os.path.getsize(self.path),
                filters=schema.NO_FILTERS,
            )
        return ds

    def _inflate(self, table: str, generation: int, nbytes: int) -> np.ndarray:
        path, where = self.path, f"the tail of table {table!r}"
        if generation < 0 or nbytes < 0:
            raise RecordingError(
                f"{path} is damaged: {where} has generation {generation}, {nbytes:,} bytes"
            )
        index = generation % len(schema.TAIL_SLOTS)
        name = f"{table}/{schema.TAIL_SLOTS[index]}"
        ds = self._slot(table, index)
        if self.live and nbytes > ds.shape[0]:  # the writer grew the slot for a longer tail
            read_or_fail(path, name, ds.refresh)
        if nbytes > ds.shape[0]:
            raise RecordingError(
                f"{path} is damaged: {where} claims {nbytes:,} bytes, its slot holds "
                f"{ds.shape[0]:,}"
            )
        data = _chunk_bytes(ds, nbytes, path, name, self.live)
        dtype = self._dtypes[table]
        most = schema.TABLES[table][1] * dtype.itemsize  # a chunk of rows
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
