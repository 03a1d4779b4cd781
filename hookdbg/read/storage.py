"""How a dataset keeps its bytes, judged before any of them is read.

HDF5 reads a chunked dataset by running each chunk through the filter pipeline the file
names, and a file can name anything: a filter HDF5 lacks, which it then looks for as a
plugin (code loaded from HDF5_PLUGIN_PATH or /usr/local/hdf5/lib/plugin); a filter that
rebuilds values from a few bits (scale-offset, n-bit); chunks of any size, each
decompressed whole to read one row of it; a deflate stream that inflates far past its
chunk (HDF5 grows its buffer until the stream ends: measured, 1 MB became 1 GB to read
four numbers); and more rows than its bytes could hold. The reader takes only what
the writer writes:

* no plugin is ever looked for: HDF5's plugin search path is emptied before a file is
  opened;
* a dataset's filters are one of the writer's pipelines for it (hookdbg/store/schema.py);
* a chunk holds at most schema.MAX_CHUNK_BYTES, and each stored chunk is no larger than
  deflate or LZF leave data that does not compress, so it inflates to at most 1032
  times that (deflate's best ratio);
* a column declares no more rows than its bytes can hold at that ratio; a table's rows
  take no more than ``TABLE_RATIO`` times its stored bytes, and the module table has at
  most ``MAX_MODULES`` rows: what a command reads stays within a bounded multiple of the
  file's size, whatever the file claims.

The functions here return what is wrong, in words (None: nothing); the caller
(hookdbg/read/checks.py) says it as one line, and turns an h5py error raised here into
one too.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Collection, Iterable

import h5py

from hookdbg.store import schema
from hookdbg.text import human_bytes

# zlib's deflate cannot compress better than about 1032:1 (258-byte matches coded in 2
# bits); LZF does worse. A column whose stored bytes could not hold what it declares,
# at that ratio, is lying about its length.
BEST_RATIO = 1032
_SLACK = 1 << 20  # a column may declare this much more than it stores (unwritten tail)
_COMPRESSING = {schema.DEFLATE, schema.LZF}

# A table's rows, all columns together, against its stored bytes. Recorded tables compress
# 2-15:1; made up to compress as well as real ones can, they reach 61:1 (2,000,000 steps
# whose times are kept to 10 ms) and 69:1 (20,000 alerts alike but for the step); rows
# of zeros reach 400-1000:1. A table declaring up to TABLE_SLACK (600,000 steps) is read
# whatever its ratio.
TABLE_RATIO = 128
TABLE_SLACK = 32 << 20
# The module table is bounded by its rows instead: its fixed-width names are mostly zero
# padding, so a real one compresses like zeros (123:1 for the 78,000 modules of a
# mixture-of-experts transformer with 256 experts in 61 layers, 168:1 for 200,000 named
# m0 to m199999). The cap is over three times that transformer; a million modules took
# summary 3 GB and 50 s.
MAX_MODULES = 1 << 18

_PLUGINS_LOCK = threading.Lock()


def forget_plugin_paths() -> None:
    """Empty HDF5's plugin search path, so that a file naming a filter HDF5 lacks is
    refused instead of answered by loading code from a plugin directory. For the whole
    process (h5py is one library): recordings need no plugin, and filters registered
    directly (the hdf5plugin package) still work."""
    plugins = getattr(h5py, "h5pl", None)
    if plugins is None:  # an HDF5 without plugin paths loads none from them
        return
    with _PLUGINS_LOCK:  # the TUI opens files from worker threads
        while plugins.size():
            plugins.remove(0)


def pipeline(plist: h5py.h5p.PropDCID) -> tuple[int, ...]:
    """The filter ids of a dataset's pipeline, in the order they were applied."""
    return tuple(plist.get_filter(i)[0] for i in range(plist.get_nfilters()))


def storage_problem(
    ds: h5py.Dataset,
    where: str,
    file_size: int,
    filters: Collection[tuple[int, ...]],
    plist: h5py.h5p.PropDCID | None = None,
) -> str | None:
    """What is wrong with how ``ds`` stores its bytes, if anything (see the module);
    ``plist``: its creation properties, where the caller holds them already."""
    dsid = ds.id
    plist = dsid.get_create_plist() if plist is None else plist
    used = pipeline(plist)
    if used not in filters:
        names = ", ".join(map(str, used)) or "none"
        return f"{where} uses HDF5 filters hookdbg never writes ({names}); refusing to read it"
    itemsize = dsid.dtype.itemsize
    chunk_bytes = 0
    if plist.get_layout() == h5py.h5d.CHUNKED:
        chunk_bytes = math.prod(plist.get_chunk()) * itemsize
        if chunk_bytes > schema.MAX_CHUNK_BYTES:
            return (
                f"{where} is stored in chunks of {human_bytes(chunk_bytes)}, larger than "
                f"hookdbg writes ({human_bytes(schema.MAX_CHUNK_BYTES)}); refusing to read it"
            )
    shape: tuple[int, ...] = ds.shape or (0,)
    declared = math.prod(shape) * itemsize
    compressing = [f for f in used if f in _COMPRESSING]
    if declared > _SLACK:
        stored = min(dsid.get_storage_size(), file_size)
        ratio = BEST_RATIO if compressing else 1
        if declared > stored * ratio + _SLACK:
            return (
                f"{where} claims {shape[0]:,} rows ({human_bytes(declared)}), more than its "
                f"{human_bytes(stored)} on disk can hold; refusing to read it"
            )
    if compressing and chunk_bytes:
        return _chunk_problem(dsid, where, chunk_bytes, file_size)
    return None


def _chunk_problem(
    dsid: h5py.h5d.DatasetID, where: str, chunk_bytes: int, file_size: int
) -> str | None:
    """A stored chunk larger than deflate or LZF make of incompressible data (HDF5's
    deflate adds at most 0.1% and 12 bytes; LZF stores such a chunk raw), or past the
    file's end: it could inflate to 1032 times its size."""
    most = min(chunk_bytes + chunk_bytes // 512 + 64, file_size)
    largest = max(_chunk_sizes(dsid), default=0)
    if largest > most:
        return (
            f"{where} has a compressed chunk of {human_bytes(largest)}, more than its "
            f"{human_bytes(chunk_bytes)} of rows compress to; refusing to read it"
        )
    return None


def _chunk_sizes(dsid: h5py.h5d.DatasetID) -> Iterable[int]:
    """The stored size of every chunk, from the chunk index alone."""
    sizes: list[int] = []
    iterate = getattr(dsid, "chunk_iter", None)
    if iterate is not None:  # HDF5 1.14: one pass over the index
        iterate(lambda info: sizes.append(info.size))
        return sizes
    return (dsid.get_chunk_info(i).size for i in range(dsid.get_num_chunks()))


def table_problem(name: str, columns: Iterable[h5py.Dataset], file_size: int) -> str | None:
    """A table whose rows, all columns together, take more than ``TABLE_RATIO`` times
    its stored bytes: compressed that well, they are not rows a recorder wrote, and
    reading them would cost far more than the file. The module table: over MAX_MODULES
    rows."""
    declared = stored = rows = 0
    for ds in columns:
        shape: tuple[int, ...] = ds.shape or (0,)
        declared += math.prod(shape) * ds.id.dtype.itemsize
        stored += ds.id.get_storage_size()
        rows = max(rows, shape[0])
    if name == "modules":
        if rows <= MAX_MODULES:
            return None
        return (
            f"table 'modules' claims {rows:,} modules, more than a model has (hookdbg reads "
            f"up to {MAX_MODULES:,}); refusing to read it"
        )
    stored = min(stored, file_size)  # chunks may share their bytes
    if declared <= TABLE_SLACK or declared <= stored * TABLE_RATIO:
        return None
    return (
        f"table {name!r} claims {rows:,} rows ({human_bytes(declared)}) in "
        f"{human_bytes(stored)} on disk, compressed {declared // max(stored, 1):,}:1 where a "
        f"recording's compress at most {TABLE_RATIO}:1; refusing to read it"
    )
