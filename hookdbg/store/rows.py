"""Rows on their way to the file: gathered by the recorder, converted by the writer.

``Rows`` is what the training thread appends to: one list per table, named, so a hook
appends a plain tuple (in the table's column order, schema.py) with no lookup. The
writer thread turns those tuples into numpy rows (``CONVERTERS``): the formatting and
the UTF-8 encoding, truncating text to the schema's fixed widths, happen there, not on
the training thread.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import numpy as np

from hookdbg.store import schema

try:
    from hookdbg.store._pack import pack as _pack
except ImportError:  # not built: numpy's conversion of the row tuples instead
    _pack = None

_Key = TypeVar("_Key", bound=Hashable)

TABLE_NAMES = ("modules", "calls", "tensors", "steps", "alerts", "captures", "info")


class Rows:
    """The rows gathered since the last hand-over to the writer, one list per table."""

    __slots__ = TABLE_NAMES

    def __init__(self) -> None:
        self.modules: list[tuple] = []
        self.calls: list[tuple] = []
        self.tensors: list[tuple] = []
        self.steps: list[tuple] = []
        self.alerts: list[tuple] = []
        self.captures: list[tuple] = []
        self.info: list[tuple] = []

    def take(self) -> dict[str, list]:
        """The rows gathered so far, by table (empty tables left out); starts afresh."""
        out = {}
        for name in TABLE_NAMES:
            rows = getattr(self, name)
            if rows:
                out[name] = rows
                setattr(self, name, [])
        return out


_text_cache: dict[object, bytes] = {}


def _text(value: object, width: int) -> bytes:
    """Encoded and cut to ``width`` bytes without splitting a UTF-8 character."""
    data = str(value).encode("utf-8")
    if len(data) > width:
        data = data[:width].decode("utf-8", "ignore").encode("utf-8")
    return data


def _cached(value: _Key, make: Callable[[_Key], bytes]) -> bytes:
    out = _text_cache.get(value)
    if out is None:
        out = _text_cache[value] = make(value)
    return out


def shape_text(shape: tuple[int, ...]) -> bytes:
    return _cached(tuple(shape), lambda s: _text(",".join(map(str, s)), schema.SHAPE_BYTES))


def dtype_text(dtype: object) -> bytes:
    return _cached(dtype, lambda d: _text(str(d).removeprefix("torch."), 16))


def device_text(device: object) -> bytes:
    return _cached(device, lambda d: _text(d, 16))


_CODES = {"<i8": 0, "<i4": 1, "<i2": 2, "|u1": 3, "|i1": 3, "<f8": 4, "<f4": 5}
_TEXT = 6  # pack's code for a text column, stored through a cache of encodings


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
        if kind.kind == "S":
            layout.append((*where[name], offset, _TEXT, kind.itemsize, *(texts or {})[name]))
        else:
            layout.append((*where[name], offset, _CODES[kind.str]))
    return tuple(layout)


_path_cache: dict[object, bytes] = {}


def _path_text(path: object) -> bytes:
    out = _path_cache[path] = _text(path, schema.PATH_BYTES)
    return out


# where each column of a tensor row lies: (call, step, segment, module, phase, slot,
# path, summary), the summary's fields inside it
_TENSOR_FIELDS = _fields(
    schema.TENSORS,
    {
        **{name: (i, -1) for i, name in enumerate(schema.WHERE_COLUMNS)},
        **{name: (7, i) for i, name in enumerate(schema.SUMMARY_COLUMNS)},
    },
    texts={
        "path": (_path_cache, _path_text),
        "shape": (_text_cache, shape_text),
        "dtype": (_text_cache, dtype_text),
        "device": (_text_cache, device_text),
    },
)


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
    fields = _fields(dtype, {name: (i, -1) for i, name in enumerate(dtype.names or ())})

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
    "modules": _texts_encoded(schema.MODULES),
    "alerts": _texts_encoded(schema.ALERTS),
    "info": _texts_encoded(schema.INFO),
}
