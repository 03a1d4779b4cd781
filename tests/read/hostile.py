"""Hostile variants of a real recording, for the fuzz tests: each is a name and a function
that damages an open (``r+``) copy of the file in one way."""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import h5py
import numpy as np

from hookdbg.store import schema

Mutation = Callable[[h5py.File], None]

HUGE = 10**12  # rows: a 100 kB file claiming this many is what the issue measured


def commands(path: Path, other: Path, tmp: Path) -> list[list[str]]:
    """Every reader command, each as a user would type it on this recording."""
    p = str(path)
    return [
        ["summary", p],
        ["summary", p, "--json"],
        ["profile", p],
        ["alerts", p],
        ["show", p, "standardize"],
        ["search", p, "nan"],
        ["search", p, "type:Linear"],
        ["diff", p, str(other)],
        ["export", p, "--format", "perfetto", "-o", "-"],
        ["export", p, "--format", "csv", "-o", "-"],
        ["export", p, "--format", "json", "--table", "calls", "-f", "-o", str(tmp / "x.json")],
        ["tensor", p, "standardize", "--step", "3", "--slot", "output"],
    ]


def _replace(f: h5py.File, where: str, data: np.ndarray, **kwargs: object) -> None:
    del f[where]
    f.create_dataset(where, data=data, **kwargs)


def _retyped(ds: h5py.Dataset) -> np.ndarray:
    """The column's length, in a type of another kind: strings for numbers, numbers
    for strings."""
    n = ds.shape[0]
    return np.zeros(n, dtype="f8") if ds.dtype.kind == "S" else np.full(n, b"x", dtype="S8")


def _reshaped(ds: h5py.Dataset, scalar: bool) -> np.ndarray:
    values = ds[()]
    return np.asarray(values[0] if len(values) else 0) if scalar else np.stack([values, values], 1)


def attribute_variants(base: h5py.File) -> Iterator[tuple[str, Mutation]]:
    """Every attribute deleted, retyped (numbers as text, text as numbers) and turned
    into an array; then values of the right type that mean nothing."""
    for name, value in base.attrs.items():
        is_text = isinstance(value, str)

        def delete(f: h5py.File, name: str = name) -> None:
            del f.attrs[name]

        def retype(f: h5py.File, name: str = name, is_text: bool = is_text) -> None:
            f.attrs[name] = 7 if is_text else "abc"

        def array(f: h5py.File, name: str = name, value: object = value) -> None:
            kind = h5py.string_dtype() if isinstance(value, str) else None
            f.attrs[name] = np.array([value, value], dtype=kind)

        yield f"attr {name} deleted", delete
        yield f"attr {name} retyped", retype
        yield f"attr {name} an array", array
    odd = {
        "schema_version": "abc",
        "options": "[1, 2]",
        "argv": '{"script": 1}',
        "pid": 2**40,
        "world_size": 10**12,
        "rank": 5,
        "local_rank": -1,
        "format": "something-else",
    }
    for name, value in odd.items():

        def set_value(f: h5py.File, name: str = name, value: object = value) -> None:
            f.attrs[name] = value

        yield f"attr {name}={value!r}", set_value

    def nested(f: h5py.File) -> None:  # a JSON bomb: deeper than Python's recursion limit
        f.attrs["argv"] = "[" * 100_000 + "]" * 100_000

    yield "attr argv nested 100000 deep", nested


def columns(base: h5py.File) -> list[str]:
    """Every dataset the reader uses that ``base`` holds: each table's columns, and the
    capture bytes (a column an older schema lacks is not there to damage)."""
    names = [f"{t}/{c}" for t, (dtype, _) in schema.TABLES.items() for c in dtype.names or ()]
    return [n for n in [*names, schema.CAPTURE_DATA] if n in base]


def dataset_variants(base: h5py.File, table: str) -> Iterator[tuple[str, Mutation]]:
    """Every dataset of ``table`` (or the capture bytes) deleted, retyped, reshaped
    (2-D or a scalar, alternately) and resized to 10^12 rows."""
    wanted = [c for c in columns(base) if c == table or c.startswith(table + "/")]
    for i, where in enumerate(wanted):

        def delete(f: h5py.File, where: str = where) -> None:
            del f[where]

        def retype(f: h5py.File, where: str = where) -> None:
            _replace(f, where, _retyped(f[where]))

        def reshape(f: h5py.File, where: str = where, scalar: bool = bool(i % 2)) -> None:
            _replace(f, where, _reshaped(f[where], scalar))

        def huge(f: h5py.File, where: str = where) -> None:
            f[where].resize((HUGE,))

        yield f"{where} deleted", delete
        yield f"{where} retyped", retype
        yield f"{where} reshaped", reshape
        yield f"{where} {HUGE:.0e} rows", huge


def soft(where: str, target: str) -> Mutation:
    """``where`` replaced by a soft link to ``target``."""

    def mutate(f: h5py.File) -> None:
        del f[where]
        f[where] = h5py.SoftLink(target)

    return mutate


def external(where: str, file: Path, target: str) -> Mutation:
    """``where`` replaced by a link to ``target`` in another file."""

    def mutate(f: h5py.File) -> None:
        del f[where]
        f[where] = h5py.ExternalLink(str(file), target)

    return mutate


def structure_variants(base: Path, other: Path, tmp: Path) -> Iterator[tuple[str, Mutation]]:
    """Tables deleted or replaced by a dataset (those ``base`` has: an older schema lacks
    some); links that loop or leave the file; data kept outside the file; filters
    hookdbg never writes."""
    with h5py.File(base, "r") as f:
        tables = [t for t in schema.TABLES if t in f]
    for table in tables:

        def delete(f: h5py.File, table: str = table) -> None:
            del f[table]

        def flat(f: h5py.File, table: str = table) -> None:
            del f[table]
            f[table] = np.arange(3)

        yield f"table {table} deleted", delete
        yield f"table {table} a dataset", flat

    for where in ("tensors/std", "modules/name", "end/status", schema.CAPTURE_DATA, "calls"):
        yield f"{where} a soft link to itself", soft(where, "/" + where)
    yield "tensors/max a soft link to tensors/min", soft("tensors/max", "/tensors/min")

    def soft_loop(f: h5py.File) -> None:
        f["loop_a"] = h5py.SoftLink("/loop_b")
        f["loop_b"] = h5py.SoftLink("/loop_a")
        soft("steps", "/loop_a")(f)

    yield "steps a soft link into a loop", soft_loop
    yield (
        "tensors/std external, to a real recording",
        external("tensors/std", other, "/tensors/std"),
    )
    yield "table calls external, to a real recording", external("calls", other, "/calls")
    yield (
        "modules/name external, to a missing file",
        external("modules/name", tmp / "missing.h5", "/modules/name"),
    )

    def root_loop(f: h5py.File) -> None:
        del f["alerts"]
        f["alerts"] = f["/"]  # a hard link back to the root: /alerts/alerts/alerts...

    yield "table alerts a hard link to the root", root_loop

    def virtual(f: h5py.File) -> None:
        n = f["tensors/std"].shape[0]
        layout = h5py.VirtualLayout(shape=(n,), dtype="f8")
        layout[:] = h5py.VirtualSource(str(other), "/tensors/std", shape=(n,))
        del f["tensors/std"]
        f["tensors"].create_virtual_dataset("std", layout)

    yield "tensors/std a virtual dataset over another file", virtual

    def external_storage(f: h5py.File) -> None:
        raw = tmp / "raw.bin"
        raw.write_bytes(bytes(8 * 4096))
        del f["calls/start"]
        f["calls"].create_dataset(
            "start", shape=(4096,), dtype="f8", external=[(str(raw), 0, 8 * 4096)]
        )

    yield "calls/start stored in an external raw file", external_storage

    def scaleoffset(f: h5py.File) -> None:  # 8 MB of zeros in a few bytes
        _replace(f, "calls/call", np.zeros(10**6, dtype="i8"), chunks=(10**5,), scaleoffset=0)

    yield "calls/call 10^6 rows squeezed by scaleoffset", scaleoffset

    def twice_deflated(f: h5py.File) -> None:
        data = np.zeros(4 * 10**6, dtype="f8")
        del f["calls/total"]
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((10**6,))
        dcpl.set_deflate(9)
        dcpl.set_deflate(9)
        space = h5py.h5s.create_simple(data.shape)
        dsid = h5py.h5d.create(f["calls"].id, b"total", h5py.h5t.IEEE_F64LE, space, dcpl=dcpl)
        h5py.Dataset(dsid)[...] = data

    yield "calls/total deflated twice", twice_deflated

    def small_scaleoffset(f: h5py.File) -> None:  # a lossy filter on the column as it is
        data = f["calls/call"][()]
        _replace(f, "calls/call", data, chunks=True, maxshape=(None,), scaleoffset=0)

    yield "calls/call scale-offset filtered", small_scaleoffset
    yield "tensors/std compressed by filter 40000", unknown_filter("tensors/std")

    def fletcher(f: h5py.File) -> None:
        data = f["steps/step"][()]
        _replace(f, "steps/step", data, chunks=True, maxshape=(None,), fletcher32=True)

    yield "steps/step with fletcher32 checksums", fletcher

    def huge_chunks(f: h5py.File) -> None:  # 2 MiB decompressed to read one row
        data = f["calls/start"][()]
        _replace(f, "calls/start", data, chunks=(1 << 18,), maxshape=(None,), compression="gzip")

    yield "calls/start in chunks of 2 MiB", huge_chunks
    yield "calls/total a chunk inflating to 128 MB", inflating_chunk("calls/total", 128 << 20)


def unknown_filter(where: str, filter_id: int = 40000) -> Mutation:
    """``where`` rewritten as compressed by a filter HDF5 lacks, which reading it would
    make HDF5 look for as a plugin. HDF5 creates such a dataset when the filter is
    optional, and the chunk is written as stored bytes, marked as filtered."""

    def mutate(f: h5py.File) -> None:
        data = f[where][()]
        group, name = where.rsplit("/", 1)
        del f[where]
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((max(len(data), 1),))
        dcpl.set_filter(filter_id, h5py.h5z.FLAG_OPTIONAL, ())
        space = h5py.h5s.create_simple((len(data),), (h5py.h5s.UNLIMITED,))
        kind = h5py.h5t.py_create(data.dtype)
        dsid = h5py.h5d.create(f[group].id, name.encode(), kind, space, dcpl=dcpl)
        dsid.write_direct_chunk((0,), data.tobytes())

    return mutate


def inflating_chunk(where: str, nbytes: int) -> Mutation:
    """``where``'s first chunk replaced by a deflate stream of ``nbytes`` zeros: HDF5
    inflates a chunk's whole stream, however far past the chunk it goes."""

    def mutate(f: h5py.File) -> None:
        stream = zlib.compressobj(9)
        block = bytes(1 << 20)
        data = b"".join(stream.compress(block) for _ in range(nbytes >> 20)) + stream.flush()
        f[where].id.write_direct_chunk((0,), data)

    return mutate


def _set(where: str, index: int, value: object) -> Mutation:
    def mutate(f: h5py.File) -> None:
        f[where][index] = value

    return mutate


def _rows(table: str, **columns: object) -> Mutation:
    """The table rewritten to hold exactly ``columns`` (other columns: zeros)."""

    def mutate(f: h5py.File) -> None:
        n = len(next(iter(columns.values())))  # type: ignore[arg-type]
        for name in f[table]:
            ds = f[table][name]
            ds.resize((n,))
            ds[...] = columns.get(name, np.zeros(n, dtype=ds.dtype))

    return mutate


class _GarbleChunk:
    """Garble the middle of the first stored chunk of ``where``: ``make`` writes 64
    bytes there once h5py has closed the file."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.at: int | None = None

    def __call__(self, f: h5py.File) -> None:
        info = f[self.where].id.get_chunk_info(0)
        self.at = info.byte_offset + info.size // 2


def value_variants() -> Iterator[tuple[str, Mutation]]:
    """Well-formed files holding values that mean nothing: unknown codes and module
    ids, module trees that loop, stored tensors that lie about their bytes, text that
    is not UTF-8, non-finite times, and corrupt compressed chunks."""
    yield "calls/phase 9", _set("calls/phase", 3, 9)
    yield "tensors/slot 9", _set("tensors/slot", 7, 9)
    yield "modules/kind 9", _set("modules/kind", 1, 9)
    yield "captures/reason 9", _set("captures/reason", 0, 9)
    yield "tensors/module 999", _set("tensors/module", 5, 999)
    yield "alerts/module 999", _set("alerts/module", 0, 999)
    yield "captures/module 999", _set("captures/module", 0, 999)
    yield "modules ids repeat", _set("modules/id", 2, 1)
    yield "modules parent missing", _set("modules/parent", 2, 77)
    yield "modules parents loop", _rows("modules", id=[0, 1], parent=[1, 0], name=[b"a", b"b"])
    yield (
        "modules nested 600 deep",
        _rows("modules", id=np.arange(600), parent=np.arange(-1, 599), name=[b"m"] * 600),
    )
    yield "captures/dtype object", _set("captures/dtype", 0, b"object")
    yield "captures/dtype structured", _set("captures/dtype", 0, b"f8,i4")
    yield "captures/shape not numbers", _set("captures/shape", 0, b"a,b")
    yield "captures/shape negative", _set("captures/shape", 0, b"-8,-16")
    yield "captures/nbytes wrong", _set("captures/nbytes", 1, 10**15)
    yield "captures/offset past the end", _set("captures/offset", 3, 10**12)
    yield "captures/offset negative", _set("captures/offset", 3, -512)
    yield "alerts/message not UTF-8", _set("alerts/message", 0, b"\xff\xfe\x1b]0;x\x07")
    yield "tensors/path not UTF-8", _set("tensors/path", 7, b"\xff\xfe")
    yield "modules/name not UTF-8", _set("modules/name", 2, b"model.\xff")
    yield "info rows not UTF-8", _rows("info", key=[b"\xffkey"], value=[b"\xfe"], time=[0.0])
    yield "calls/start inf", _set("calls/start", 0, np.inf)
    yield "calls/total nan", _set("calls/total", 0, np.nan)
    yield "steps/end -inf", _set("steps/end", 0, -np.inf)
    yield "tensors/step decreasing", _set("tensors/step", 0, 10**6)
    yield "progress/time nan", _set("progress/time", 0, np.nan)
    yield "tensors/std chunk corrupt", _GarbleChunk("tensors/std")
    yield "modules/name chunk corrupt", _GarbleChunk("modules/name")
    yield "capture_data chunk corrupt", _GarbleChunk(schema.CAPTURE_DATA)


# -- files that expand: a few MB on disk that claim far more --------------------------


@functools.cache
def _deflated_zeros(nbytes: int) -> bytes:
    return zlib.compress(bytes(nbytes), 9)


def _commit(f: h5py.File, table: str, rows: int) -> None:
    """Say in ``committed`` that ``table``'s columns hold ``rows`` rows, and no tail."""
    committed = f[schema.COMMITTED][()]
    index = list(schema.TABLES).index(table)
    committed[schema.SEALED, index] = rows
    committed[schema.TAIL_BYTES, index] = 0
    f[schema.COMMITTED][...] = committed


def zero_rows(table: str, rows: int) -> Mutation:
    """``table``'s columns rewritten to ``rows`` rows of zeros in chunks as large as the
    reader takes (1 MiB), each a deflate stream of 1 kB written as stored bytes: a few
    MB of file claiming gigabytes of rows."""

    def mutate(f: h5py.File) -> None:
        group = f[table]
        for name in [n for n in group if n not in schema.TAIL_SLOTS]:
            old = group[name]
            dtype, width = old.dtype, old.shape[1:]
            row = dtype.itemsize * int(np.prod(width, dtype=np.int64))
            chunk = schema.MAX_CHUNK_BYTES // row
            del group[name]
            new = group.create_dataset(
                name,
                shape=(rows, *width),
                maxshape=(None, *width),
                dtype=dtype,
                chunks=(chunk, *width),
                compression="gzip",
                shuffle=True,
            )
            for start in range(0, rows, chunk):
                new.id.write_direct_chunk((start, *(0,) * len(width)), _deflated_zeros(chunk * row))
        _commit(f, table, rows)

    return mutate


def _fill(f: h5py.File, table: str, rows: int, columns: dict[str, object]) -> None:
    """``table`` resized to ``rows`` rows holding ``columns`` (others: zeros), stored as
    the writer stores them (the columns keep their filters and chunks)."""
    group = f[table]
    for name in [n for n in group if n not in schema.TAIL_SLOTS]:
        ds = group[name]
        ds.resize((rows, *ds.shape[1:]))
        ds[...] = np.asarray(columns.get(name, 0), dtype=ds.dtype)
    _commit(f, table, rows)


def roots(n: int) -> Mutation:
    """``n`` models of one module each, every one a root: a large module table that
    compresses well, but no better than a recording's can."""

    def mutate(f: h5py.File) -> None:
        ids = np.arange(n)
        names = np.char.add(b"m", ids.astype("S7"))
        columns = {"id": ids, "parent": -1, "root": ids, "name": names, "type": b"Linear"}
        _fill(f, "modules", n, columns)

    return mutate


def long_run(n: int) -> Mutation:
    """A steps table of ``n`` steps as a long run records them, its times kept to 10 ms
    (so that they compress as well as real ones can): legitimate, and long."""

    def mutate(f: h5py.File) -> None:
        steps = np.arange(n)
        start = np.round(1.7e9 + 0.02 * steps, 2)
        columns = {
            "step": steps,
            "segment": steps,
            "start": start,
            "end": start + 0.01,
            "optimizer_steps": 1,
            "backward": 1,
            "recorded": steps < 5,
            "scale": np.nan,
            "overhead": np.nan,
        }
        _fill(f, "steps", n, columns)

    return mutate


def near_the_bound(n: int) -> Mutation:
    """``n`` numbered steps, the first 5 recorded, every other value zero but for random
    times in the first 2.9% of rows, in chunks of 1 MiB at deflate's best: 117:1,
    nearly as well as a table may compress and still be read (hookdbg/read/storage.py:
    TABLE_RATIO)."""

    def mutate(f: h5py.File) -> None:
        group = f["steps"]
        times = np.random.default_rng(0).random(n * 29 // 1000)
        for name in [c for c in group if c not in schema.TAIL_SLOTS]:
            dtype = group[name].dtype
            data = np.zeros(n, dtype)
            if name in ("step", "segment"):
                data[:] = np.arange(n)
            elif name in ("start", "end"):
                data[: len(times)] = times
            elif name == "recorded":
                data[:5] = 1
            del group[name]
            group.create_dataset(
                name,
                data=data,
                maxshape=(None,),
                chunks=(schema.MAX_CHUNK_BYTES // dtype.itemsize,),
                compression="gzip",
                compression_opts=9,
                shuffle=True,
            )
        _commit(f, "steps", n)

    return mutate


def expanding_variants(tables: Collection[str]) -> Iterator[tuple[str, Mutation]]:
    """Every table claiming 2 GiB of rows of zeros in a few MB; then files as large as
    a reader takes: 200,000 root modules, a 2,000,000-step run, and 4,000,000 steps
    compressed nearly as well as the reader allows."""
    for table, (dtype, _) in schema.TABLES.items():
        if table in tables:
            rows = (2 << 30) // dtype.itemsize
            yield f"{table}: {rows:,} rows of zeros", zero_rows(table, rows)
    yield "modules: 200,000 roots", roots(200_000)
    yield "steps: a 2,000,000-step run", long_run(2_000_000)
    yield "steps: 4,000,000 rows compressed 117:1", near_the_bound(4_000_000)


def make(base: Path, target: Path, mutate: Mutation) -> Path:
    """A copy of ``base`` at ``target``, damaged by ``mutate``."""
    target.write_bytes(base.read_bytes())
    with h5py.File(target, "r+") as f:
        mutate(f)
    if isinstance(mutate, _GarbleChunk) and mutate.at is not None:
        with open(target, "r+b") as raw:
            raw.seek(mutate.at)
            raw.write(b"\xa5" * 64)
    return target
