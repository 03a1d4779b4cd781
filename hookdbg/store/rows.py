"""Rows on their way to the file: gathered by the recorder, handed to the writer.

``Rows`` is what the training thread appends to, one sink per table, named, so a hook
appends a row (a tuple in the table's column order, schema.py) with no lookup. The
tables that grow with every module call, ``calls`` and ``tensors``, are ``RowBuffer``s
(store/_pack.c) where that extension is built: a row is stored column by column as it
is appended (the recorder's C path writes it there directly, rowbuffer.h), so no
tuple per row waits for the writer, for the garbage collector to count, and the
writer thread appends each column to the file as it is. The other tables are lists of
tuples, and so are all tables without the extension: the writer thread turns those
into numpy rows (``CONVERTERS``), encoding text and cutting it to the schema's fixed
widths.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from hookdbg.store import schema

try:
    import hookdbg.store._pack as _packer
except ImportError:  # not built: numpy's conversion of the row tuples instead
    _packer = None
_pack = getattr(_packer, "pack", None)
RowBuffer = getattr(_packer, "RowBuffer", None)  # None: lists of tuples for every table
_join = getattr(_packer, "join", None)

_Key = TypeVar("_Key", bound=Hashable)

TABLE_NAMES = (
    "modules",
    "calls",
    "tensors",
    "steps",
    "alerts",
    "captures",
    "info",
    "losses",
    "shards",
    "device_times",
)


class RowSink(Protocol):
    """Where a table's rows go: a list of tuples, or a ``RowBuffer``."""

    def append(self, row: tuple, /) -> None: ...

    def extend(self, rows: Iterable[tuple], /) -> None: ...

    def __len__(self) -> int: ...


Columns = dict[str, np.ndarray]  # a table's rows column by column, all of one length
Buffer = Any  # bytes, or a _pack.Column (untyped): read through the buffer protocol


@dataclass(frozen=True)
class Packed:
    """A ``RowBuffer``'s rows as taken: the bytes of each field of ``dtype``, in order
    (bytes-like ``Column``s, in the memory the rows were gathered in). The writer
    thread makes them numpy columns (``columns``), not the training thread."""

    dtype: np.dtype
    fields: tuple[Buffer, ...]

    def __len__(self) -> int:
        first = self.dtype[0]
        return len(self.fields[0]) // first.itemsize if self.fields else 0

    @property
    def nbytes(self) -> int:
        return sum(len(data) for data in self.fields)

    def columns(self) -> Columns:
        out = {}
        for name, data in zip(self.dtype.names or (), self.fields, strict=True):
            field = self.dtype[name]  # a histogram's field holds an array per row
            out[name] = np.frombuffer(data, dtype=field.base).reshape(-1, *field.shape)
        return out


Taken = list | Packed  # a table's rows as handed over: tuples, or packed already


def joined(parts: list[Taken]) -> list[Taken]:
    """``parts`` with each run of packed ones (a step's hand-overs since the writer last
    wrote) as one: its fields copied together once, in C and off the GIL, where numpy
    would make an array of every piece and join those."""
    if _join is None:
        return parts
    out: list[Taken] = []
    run: list[Packed] = []
    for part in [*parts, None]:
        if isinstance(part, Packed):
            run.append(part)
            continue
        if len(run) > 1:
            out.append(Packed(run[0].dtype, _join([p.fields for p in run])))
        else:
            out.extend(run)
        run = []
        if part is not None:
            out.append(part)
    return out


class Rows:
    """The rows gathered since the last hand-over to the writer, one sink per table."""

    __slots__ = TABLE_NAMES

    def __init__(self, tables: Mapping[str, tuple[np.dtype, int]] = schema.TABLES) -> None:
        self.modules: RowSink = []
        self.calls: RowSink = buffer_for(tables["calls"][0])
        self.tensors: RowSink = buffer_for(tables["tensors"][0])
        self.steps: RowSink = []
        self.alerts: RowSink = []
        self.captures: RowSink = []
        self.info: RowSink = []
        self.losses: RowSink = []
        self.shards: RowSink = []
        self.device_times: RowSink = []

    def take(self) -> dict[str, Taken]:
        """The rows gathered so far, by table (empty tables left out); starts afresh."""
        out: dict[str, Taken] = {}
        for name in TABLE_NAMES:
            rows = getattr(self, name)
            if not rows:
                continue
            if isinstance(rows, list):
                out[name] = rows
                setattr(self, name, [])
            else:
                out[name] = Packed(rows.dtype, rows.take())
        return out


def rows_in(columns: Columns) -> int:
    """How many rows ``columns`` hold."""
    return len(next(iter(columns.values()))) if columns else 0


_text_cache: dict[object, bytes] = {}
TEXTS_KEPT = 1 << 16  # encodings remembered per cache; past that, texts that never repeat
#                       (a dict output keyed by sample ids, say): the cache starts over


def _text(value: object, width: int) -> bytes:
    """Encoded and cut to ``width`` bytes without splitting a UTF-8 character; what
    UTF-8 cannot hold (a lone surrogate from a file name decoded with surrogateescape)
    as a backslash escape."""
    data = str(value).encode("utf-8", "backslashreplace")
    if len(data) > width:
        data = data[:width].decode("utf-8", "ignore").encode("utf-8")
    return data


def _cached(value: _Key, make: Callable[[_Key], bytes]) -> bytes:
    out = _text_cache.get(value)
    if out is None:
        out = _remember(_text_cache, value, make(value))
    return out


def _remember(cache: dict[object, bytes], value: object, text: bytes) -> bytes:
    if len(cache) >= TEXTS_KEPT:
        cache.clear()
    cache[value] = text
    return text


def shape_text(shape: tuple[int, ...]) -> bytes:
    return _cached(tuple(shape), lambda s: _text(",".join(map(str, s)), schema.SHAPE_BYTES))


def dtype_text(dtype: object) -> bytes:
    return _cached(dtype, lambda d: _text(str(d).removeprefix("torch."), 16))


def device_text(device: object) -> bytes:
    return _cached(device, lambda d: _text(d, 16))


_CODES = {"<i8": 0, "<i4": 1, "<i2": 2, "|u1": 3, "|i1": 3, "<f8": 4, "<f4": 5}
_TEXT = 6  # pack's code for a text column, stored through a cache of encodings
_RAW = 7  # pack's code for bytes stored as they are (zeros for None)


def _fields(
    dtype: np.dtype,
    where: dict[str, tuple[int, int]],
    texts: dict[str, tuple[dict, Callable[[Any], bytes]]] | None = None,
) -> tuple:
    """The ``pack`` layout of the columns in ``where``: (outer, inner, byte offset,
    code), and for a text column its width and the (cache, make) ``texts`` gives it."""
    fields = dtype.fields
    assert fields is not None, "a table's row dtype is structured"
    layout: list[tuple] = []
    for name in dtype.names or ():
        if name not in where:
            continue
        kind, offset = fields[name][:2]
        if kind.shape:  # an array per row (a histogram's counts): bytes copied as they are
            layout.append((*where[name], offset, _RAW, kind.itemsize))
        elif kind.kind == "S":
            layout.append((*where[name], offset, _TEXT, kind.itemsize, *(texts or {})[name]))
        else:
            layout.append((*where[name], offset, _CODES[kind.str]))
    return tuple(layout)


_path_cache: dict[object, bytes] = {}


def _path_text(path: object) -> bytes:
    return _remember(_path_cache, path, _text(path, schema.PATH_BYTES))


def _tensor_fields(dtype: np.dtype) -> tuple:
    """Where each column of a tensor row lies: (call, step, segment, module, phase, slot,
    path, summary), the summary's fields inside it (a histogram's counts after them)."""
    return _fields(
        dtype,
        {
            **{name: (i, -1) for i, name in enumerate(schema.WHERE_COLUMNS)},
            **{name: (7, i) for i, name in enumerate(schema.SUMMARY_COLUMNS)},
            schema.HISTOGRAM: (7, len(schema.SUMMARY_COLUMNS)),
        },
        texts={
            "path": (_path_cache, _path_text),
            "shape": (_text_cache, shape_text),
            "dtype": (_text_cache, dtype_text),
            "device": (_text_cache, device_text),
        },
    )


_TENSOR_FIELDS = _tensor_fields(schema.TENSORS)


def _number_fields(dtype: np.dtype) -> tuple:
    """The layout of a table of numbers only, its rows in schema order."""
    return _fields(dtype, {name: (i, -1) for i, name in enumerate(dtype.names or ())})


def buffer_for(dtype: np.dtype) -> RowSink:
    """A ``RowBuffer`` for the calls or tensors table of this dtype; a list without the
    extension."""
    if RowBuffer is None:
        return []
    calls = dtype.names == schema.CALLS.names
    layout = _number_fields(dtype) if calls else _tensor_fields(dtype)
    return RowBuffer(dtype, dtype.itemsize, layout)  # type: ignore[no-any-return]


def tensor_rows(rows: list) -> np.ndarray:
    """(call, step, segment, module, phase, slot, path, summary) -> TENSORS rows."""
    if _pack is None:
        return _tensor_rows_slowly(rows)
    out = np.empty(len(rows), dtype=schema.TENSORS)
    _pack(rows, out, _TENSOR_FIELDS)
    return out


def _tensor_rows_slowly(rows: list) -> np.ndarray:
    out = []
    for call, step, segment, module, phase, slot, path, s in rows:
        out.append(
            (
                call,
                step,
                segment,
                module,
                phase,
                slot,
                _text(path, schema.PATH_BYTES),
                shape_text(s[0]),
                dtype_text(s[1]),
                device_text(s[2]),
                *s[3:],
            )
        )
    return np.array(out, dtype=schema.TENSORS)


def _texts_encoded(dtype: np.dtype) -> Callable[[list], np.ndarray]:
    """Converter for a table whose rows are already in schema order, strings as str."""
    widths = [dtype[n].itemsize if dtype[n].kind == "S" else 0 for n in dtype.names or ()]

    def convert(rows: list) -> np.ndarray:
        fixed = [
            tuple(_text(v, w) if w else v for v, w in zip(row, widths, strict=True)) for row in rows
        ]
        return np.array(fixed, dtype=dtype)

    return convert


def _numbers(dtype: np.dtype) -> Callable[[list], np.ndarray]:
    """Converter for a table of numbers only, its rows in schema order."""
    fields = _number_fields(dtype)

    def convert(rows: list) -> np.ndarray:
        if _pack is None:
            return np.array(rows, dtype=dtype)
        out = np.empty(len(rows), dtype=dtype)
        _pack(rows, out, fields)
        return out

    return convert


CONVERTERS = {
    "tensors": tensor_rows,
    "calls": _numbers(schema.CALLS),
    "device_times": _numbers(schema.DEVICE_TIMES),
    "modules": _texts_encoded(schema.MODULES),
    "alerts": _texts_encoded(schema.ALERTS),
    "captures": _texts_encoded(schema.CAPTURES),  # a path may be any text: a dict's key
    "info": _texts_encoded(schema.INFO),
    "shards": _texts_encoded(schema.SHARDS),
}
