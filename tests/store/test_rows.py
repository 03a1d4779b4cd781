"""Tensor rows become numpy records the same way with or without the compiled packer."""

import math

import numpy as np
import pytest

from hookdbg.store import rows, schema


def summary(shape, lo, hi, nan=0):
    return (shape, "float32", "cpu", math.prod(shape), lo, hi, 0.5, 1.5, 2.5, nan, 0, 1, 0.25)


ROWS = [
    (7, 1, 2, 3, 0, 1, "0", summary((8, 32), -1.0, 2.0)),
    (2**40, 9, 9, 4, 1, 4, "weight", summary((), float("nan"), float("nan"), nan=3)),
    (8, 1, 2, 5, 2, 2, "é" * 40, summary((1,) * 40, -3.5, 1e300)),  # texts cut to width
]


@pytest.mark.skipif(rows._pack is None, reason="the compiled packer is not built")
def test_packed_rows_equal_numpys_conversion():
    packed, slow = rows.tensor_rows(ROWS), rows._tensor_rows_slowly(ROWS)
    assert packed.dtype == schema.TENSORS
    for name in schema.TENSORS.names:
        assert np.array_equal(packed[name], slow[name], equal_nan=packed[name].dtype.kind == "f")
    assert packed["call"][1] == 2**40 and packed["path"][2].decode("utf-8") == "é" * 32


@pytest.mark.skipif(rows._pack is None, reason="the compiled packer is not built")
def test_packer_rejects_rows_it_cannot_read():
    out = np.empty(1, dtype=schema.TENSORS)
    with pytest.raises(ValueError, match="not a tuple"):
        rows._pack([(1, 2)], out, rows._TENSOR_FIELDS)
    with pytest.raises(TypeError):
        rows._pack([("x", *ROWS[0][1:])], out, rows._TENSOR_FIELDS)
    with pytest.raises(ValueError, match="outside its record"):
        rows._pack([ROWS[0]], out, ((0, -1, schema.TENSORS.itemsize - 4, 0),))
    with pytest.raises(ValueError, match="outside its record"):  # a text wider than the record
        rows._pack([ROWS[0]], out, ((6, -1, 0, 6, schema.TENSORS.itemsize + 1, {}, str.encode),))
    with pytest.raises(TypeError, match="not bytes"):  # an encoder that does not encode
        rows._pack([ROWS[0]], out, ((6, -1, 0, 6, 8, {}, str.upper),))


@pytest.mark.skipif(rows._pack is None, reason="the compiled packer is not built")
def test_texts_are_encoded_once_per_value_and_zero_padded():
    made, cache = [], {}

    def encode(value):  # as the writer's encoders do: fill the cache
        made.append(value)
        cache[value] = value.encode()
        return cache[value]

    layout = ((6, -1, 0, 6, 8, cache, encode),)
    out = np.full(3, b"garbage!", dtype="S8")
    twice = [(*ROWS[0][:6], "ab", ROWS[0][7])] * 2 + [(*ROWS[0][:6], "abcdefghij", ROWS[0][7])]
    rows._pack(twice, out, layout)
    assert list(out) == [b"ab", b"ab", b"abcdefgh"]  # padded, and cut to the width
    assert made == ["ab", "abcdefghij"]  # once per distinct value


@pytest.mark.skipif(rows._pack is None, reason="the compiled packer is not built")
def test_call_rows_packed_equal_numpys_conversion():
    calls = [
        (5, 0, 1, 1, 3, 0, -1, 0, 0.25, 1e-3, 5e-4),
        (2**33, 1, 7, 8, 9, 2, 5, 3, 9.5, 0.0, 0.0),
    ]
    assert rows.CONVERTERS["calls"](calls).tobytes() == np.array(calls, schema.CALLS).tobytes()
