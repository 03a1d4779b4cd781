"""Rows become numpy records the same way with or without the compiled packer, whether
converted by the writer or gathered in a row buffer."""

import math
import tracemalloc

import numpy as np
import pytest

from hookdbg.store import rows, schema
from hookdbg.store import summary as layout


def summary(shape, lo, hi, nan=0):
    """A summary tuple in hookdbg/store/summary.py's order (0.375 for fields not named)."""
    named = {"min": lo, "max": hi, "mean": 0.5, "std": 1.5, "norm": 2.5, "nan": nan}
    named.update(posinf=0, neginf=1, zero_frac=0.25)
    values = (named.get(name, 0.375) for name in layout.NAMES[layout.VALUES])
    return (shape, "float32", "cpu", math.prod(shape), *values)


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


buffered = pytest.mark.skipif(rows.RowBuffer is None, reason="the compiled packer is not built")


def _taken(buffer) -> dict[str, np.ndarray]:
    """What the writer gets from a row buffer: its columns."""
    return rows.Packed(buffer.dtype, buffer.take()).columns()


@buffered
def test_rows_hand_over_the_buffers_packed_and_the_lists_as_they_are():
    gathered = rows.Rows()
    gathered.tensors.append(ROWS[0])
    gathered.steps.append((0, 0, 0, 0.0, 1.0, 3, 1, 1, 1, float("nan"), 0, 0.0))
    taken = gathered.take()
    assert set(taken) == {"tensors", "steps"}  # empty tables are left out
    assert isinstance(taken["tensors"], rows.Packed) and len(taken["tensors"]) == 1
    assert taken["tensors"].columns()["call"].tolist() == [7]
    assert isinstance(taken["steps"], list) and gathered.steps == []
    assert gathered.take() == {}


@buffered
def test_a_row_buffer_holds_what_numpy_makes_of_the_tuples():
    buffer = rows.buffer_for(schema.TENSORS)
    buffer.append(ROWS[0])
    buffer.extend(ROWS[1:])
    assert len(buffer) == len(ROWS)
    got, want = _taken(buffer), rows._tensor_rows_slowly(ROWS)
    for name in schema.TENSORS.names:
        assert np.array_equal(got[name], want[name], equal_nan=want[name].dtype.kind == "f"), name
    assert len(buffer) == 0  # taken: it starts afresh
    buffer.append(ROWS[2])  # and reuses its room with nothing left of the old rows
    assert _taken(buffer)["path"].tolist() == [("é" * 32).encode()]


@buffered
def test_a_row_buffer_keeps_histograms_and_zero_fills_rows_without_one():
    dtype = schema.tensors_dtype(4)
    buffer = rows.buffer_for(dtype)
    counts = np.array([1, 2, 3, 4], dtype=np.int64)
    buffer.append((*ROWS[0][:7], (*ROWS[0][7], counts.tobytes(), None)))  # as histograms.py
    buffer.append(ROWS[1])  # a summary without one (no statistics)
    got = _taken(buffer)
    assert got["histogram"].shape == (2, 4)
    assert got["histogram"].tolist() == [[1, 2, 3, 4], [0, 0, 0, 0]]
    assert got["numel"].tolist() == [256, 1]


@buffered
def test_a_row_the_buffer_cannot_read_leaves_nothing_behind():
    buffer = rows.buffer_for(schema.TENSORS)
    buffer.append(ROWS[0])
    with pytest.raises(ValueError, match="not a tuple"):
        buffer.append((*ROWS[1][:7], None))  # no summary
    with pytest.raises(TypeError):
        buffer.append(("x", *ROWS[1][1:]))
    with pytest.raises(ValueError, match="not a tuple"):
        buffer.append([1, 2])
    assert len(buffer) == 1
    assert _taken(buffer)["call"].tolist() == [7]


@buffered
def test_rows_whose_texts_the_buffer_knows_go_straight_in_whole():
    """The second time a row's text values come (the same objects, as the hooks pass
    them), the row is written into the columns directly: the same records as numpy's;
    one whose number does not fit its field leaves nothing behind."""
    buffer = rows.buffer_for(schema.TENSORS)
    for row in ROWS * 3:
        buffer.append(row)
        with pytest.raises(OverflowError):
            buffer.append((2**70, *row[1:]))  # the call column holds 64 bits
    got, want = _taken(buffer), rows._tensor_rows_slowly(ROWS * 3)
    for name in schema.TENSORS.names:
        assert np.array_equal(got[name], want[name], equal_nan=want[name].dtype.kind == "f"), name


@buffered
def test_taken_rows_keep_their_memory_while_the_buffer_gathers_more():
    """take() hands over the memory the rows were gathered in, not a copy: what was
    taken stays as it was while the buffer fills again, and reads as bytes do."""
    buffer = rows.buffer_for(schema.CALLS)
    first = [(i, 0, 1, 1, 3, 0, -1, 0, 0.5 * i, 1e-3, 5e-4) for i in range(1000)]
    buffer.extend(first)
    taken = rows.Packed(buffer.dtype, buffer.take())
    assert len(taken) == 1000 and taken.nbytes == 1000 * schema.CALLS.itemsize
    buffer.extend([(7, 1, 9, 9, 9, 9, 9, 9, 9.0, 9.0, 9.0)] * 5000)  # new memory, reused room
    assert taken.columns()["call"].tolist() == list(range(1000))
    assert taken.columns()["start"].tolist() == [0.5 * i for i in range(1000)]
    assert bytes(taken.fields[0]) == np.arange(1000, dtype="<i8").tobytes()
    assert _taken(buffer)["call"].tolist() == [7] * 5000
    empty = buffer.take()
    assert [len(column) for column in empty] == [0] * len(empty)


@buffered
def test_hand_overs_joined_for_the_writer_keep_their_rows_in_order():
    """The writer joins a table's hand-overs (packed runs into one, tuples left as
    they are) before it appends them: the same rows, in the same order."""
    buffer = rows.buffer_for(schema.CALLS)
    parts, want = [], []
    for start in (0, 300, 301, 900):
        batch = [(i, 1, 2, 3, 4, 5, -1, 0, i / 8, 1.0, 0.5) for i in range(start, start + 7)]
        buffer.extend(batch)
        parts.append(rows.Packed(buffer.dtype, buffer.take()))
        want += batch
    tuples = [(5000, 0, 0, 0, 0, 0, -1, 0, 0.0, 0.0, 0.0)]
    got = rows.joined([*parts[:3], tuples, parts[3]])
    assert [type(p) for p in got] == [rows.Packed, list, rows.Packed]
    assert len(got[0]) == 21 and got[1] is tuples
    assert got[0].columns()["call"].tolist() == [r[0] for r in want[:21]]
    assert got[0].columns()["start"].tolist() == [r[8] for r in want[:21]]
    assert rows.joined(parts[3:]) == parts[3:]  # one part: as it is
    mixed = rows.Packed(buffer.dtype, tuple(bytes(f) for f in parts[0].fields))  # bytes too
    assert rows.joined([mixed, parts[1]])[0].columns()["call"].tolist() == [r[0] for r in want[:14]]


@buffered
def test_taken_rows_hold_no_more_memory_than_the_writer_counts():
    """The writer's memory bound counts a hand-over's bytes: its columns hold no more
    (a buffer grown by doubling gives back the room it did not fill)."""
    buffer = rows.buffer_for(schema.CALLS)
    tracemalloc.start()
    try:
        buffer.extend([(i, 0, 0, 0, 0, 0, -1, 0, 0.0, 0.0, 0.0) for i in range(300)])
        taken = rows.Packed(buffer.dtype, buffer.take())  # room for 512 rows was made
        held = tracemalloc.get_traced_memory()[0]
        counted = taken.nbytes
        del taken
        freed = held - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert counted == 300 * schema.CALLS.itemsize
    assert counted <= freed <= counted + 4096  # the Column objects themselves, a little


@buffered
def test_a_float_does_not_go_into_an_integer_field():
    """A float where an integer belongs is refused, as numpy's conversion refuses it,
    however the row is written."""
    buffer = rows.buffer_for(schema.CALLS)
    good = (1, 0, 0, 0, 0, 0, -1, 0, 0.5, 0.5, 0.5)
    buffer.append(good)
    for bad in (1.9, float("nan")):
        with pytest.raises(TypeError):
            buffer.append((bad, *good[1:]))
    assert _taken(buffer)["call"].tolist() == [1]


@buffered
def test_texts_that_take_turns_are_each_encoded_as_themselves():
    """The buffer remembers encodings by the identity of the value it holds on to: many
    distinct values, each seen again later, come out as themselves."""
    buffer = rows.buffer_for(schema.TENSORS)
    paths = [f"layer{i}.weight" for i in range(300)]
    for path in paths * 2:
        buffer.append((*ROWS[0][:6], path, ROWS[0][7]))
    assert [p.decode() for p in _taken(buffer)["path"]] == paths * 2


@buffered
def test_call_rows_in_a_buffer_equal_numpys_conversion():
    calls = [
        (5, 0, 1, 1, 3, 0, -1, 0, 0.25, 1e-3, 5e-4),
        (2**33, 1, 7, 8, 9, 2, 5, 3, 9.5, 0.0, 0.0),
    ]
    buffer = rows.buffer_for(schema.CALLS)
    buffer.extend(calls)
    got, want = _taken(buffer), np.array(calls, schema.CALLS)
    assert all(np.array_equal(got[name], want[name]) for name in schema.CALLS.names)


def _buffer_with_encoder(make) -> object:
    """A tensors row buffer whose path encoder is ``make`` (it fills no cache: it runs
    for every value it has not just seen)."""
    layout = tuple(
        (*f[:5], {}, make) if f[3] == rows._TEXT and f[0] == 6 else f
        for f in rows._tensor_fields(schema.TENSORS)
    )
    return rows.RowBuffer(schema.TENSORS, schema.TENSORS.itemsize, layout)


@buffered
def test_a_row_goes_in_whole_while_python_code_takes_the_buffer():
    """A text's first encoding runs Python code, which may hand the buffer over (a
    signal handler closing the recording): it hands over whole rows only, and the row
    being added goes in afterwards."""
    taken = []

    def make(path):
        if path == "mid":
            taken.append(rows.Packed(buffer.dtype, buffer.take()))
        return path.encode()

    buffer = _buffer_with_encoder(make)
    buffer.append((1, *ROWS[0][1:6], "first", ROWS[0][7]))
    buffer.append((2, *ROWS[0][1:6], "mid", ROWS[0][7]))
    assert taken[0].columns()["call"].tolist() == [1]
    rest = _taken(buffer)
    assert rest["call"].tolist() == [2] and rest["path"].tolist() == [b"mid"]


@buffered
def test_a_row_that_fails_leaves_the_rows_added_meanwhile():
    def make(path):
        if path == "outer":
            buffer.append((7, *ROWS[0][1:6], "inner", ROWS[0][7]))
            raise RuntimeError("cannot encode")
        return path.encode()

    buffer = _buffer_with_encoder(make)
    with pytest.raises(RuntimeError, match="cannot encode"):
        buffer.append((9, *ROWS[0][1:6], "outer", ROWS[0][7]))
    assert _taken(buffer)["call"].tolist() == [7]


@buffered
def test_numbers_that_run_python_code_cannot_write_into_moved_memory():
    class Sneaky:
        """An int whose conversion appends many rows (the buffer's memory moves)."""

        def __index__(self):
            buffer.extend([ROWS[0]] * 5000)
            return 123456789

    buffer = rows.buffer_for(schema.TENSORS)
    buffer.append((Sneaky(), *ROWS[0][1:]))
    calls = _taken(buffer)["call"]
    assert len(calls) == 5001 and calls[-1] == 123456789


@buffered
def test_a_histogram_of_the_wrong_size_is_refused():
    buffer = rows.buffer_for(schema.tensors_dtype(4))
    with pytest.raises(ValueError, match="raw field"):
        buffer.append((*ROWS[0][:7], (*ROWS[0][7], b"\0" * 16)))  # 2 counts, not 4
    assert len(buffer) == 0


def test_texts_that_never_repeat_do_not_grow_the_caches_without_end(monkeypatch):
    monkeypatch.setattr(rows, "TEXTS_KEPT", 100)
    paths = [f"output.sample{i}" for i in range(250)]  # a dict output keyed by sample ids
    shapes = [(i, 3) for i in range(250)]  # sequence lengths that vary
    out = rows.tensor_rows(
        [(*ROWS[0][:6], p, summary(s, 0.0, 1.0)) for p, s in zip(paths, shapes, strict=True)]
    )
    assert [p.decode() for p in out["path"]] == paths
    assert [s.decode() for s in out["shape"]] == [f"{i},3" for i in range(250)]
    assert len(rows._path_cache) <= 100 and len(rows._text_cache) <= 100
