"""A tensor summary's fields, declared once: what hookdbg keeps of every tensor it sees.

A summary travels from the recorder to the writer as a plain tuple in ``FIELDS``'
order (hookdbg/recorder/summaries/stats.py says why a tuple), and is stored in the tensors
table's columns of the same names (schema.TENSORS: ``WHERE_COLUMNS`` then these). Code
names a field's position with the constants below (``NUMEL``, ``COUNTS``...) or
``at(name)``, never with a number; the C extensions look the same positions up by name
here when they are imported (hookdbg/store/fields.h), so nothing is generated from this.
The schema version is the latest ``since`` (schema.SCHEMA_VERSION). Reports, the search
language, TensorBoard scalars, the TUI and the merge of DTensor shards
(read/shards.py) take their lists of statistics from the flags here.

CONTRIBUTING.md gives the steps to add a statistic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# the fixed widths of the text fields (bytes)
SHAPE_BYTES = 64
DTYPE_BYTES = 16
DEVICE_BYTES = 16

# the largest finite value of each floating dtype (torch.finfo(dtype).max), by the name
# a summary holds: numbers, not torch, so that reports start without importing it
LARGEST = {
    "float64": 1.7976931348623157e308,
    "float32": 3.4028234663852886e38,
    "bfloat16": 3.3895313892515355e38,
    "float16": 65504.0,
    "float8_e5m2": 57344.0,
    "float8_e5m2fnuz": 57344.0,
    "float8_e4m3fn": 448.0,
    "float8_e4m3fnuz": 240.0,
}

# What a summary's nan, posinf and neginf hold where no count was taken: its values
# were not looked at (``--level shapes``, integer tensors), or, on a device, they changed
# in place between the hook that saw the tensor and its statistics (recorder/summaries/deferred.py)
NOT_LOOKED = -1
CHANGED_IN_PLACE = -2

TEXT, COUNT, STAT, FRACTION = "text", "count", "stat", "fraction"
# how DTensor shards' values of a field merge into the global tensor's (read/shards.py),
# where it is a mean: weighted by each shard's finite values, or by its elements
FINITE_MEAN, ELEMENT_MEAN = "finite mean", "element mean"


@dataclass(frozen=True)
class Field:
    """One field of a summary, and what reads it."""

    name: str  # the tensors table's column
    dtype: str  # its numpy dtype
    label: str  # a column's title in reports and the TUI
    kind: str  # TEXT, COUNT, STAT (a number: ``-`` where NaN), FRACTION (written as 37%)
    missing: float | int | bytes  # its value where nothing was measured
    doc: str  # one line: what it is (search help, docs)
    since: int = 1  # the schema version that added it: older recordings read ``missing``
    search: bool = False  # a statistic the search language compares (``sat_frac>0.5``)
    scalar: bool = False  # a TensorBoard series (``output/sat_frac``)
    shown: bool = False  # a column of ``hookdbg show``'s tensor tables and of the TUI's
    # FINITE_MEAN or ELEMENT_MEAN; otherwise read/shards.py merges it by name or a
    # global row reads it as ``missing``
    merge: str = ""


_NAN = math.nan
FIELDS: tuple[Field, ...] = (
    Field("shape", f"S{SHAPE_BYTES}", "shape", TEXT, b"", "sizes, comma separated"),
    Field("dtype", f"S{DTYPE_BYTES}", "dtype", TEXT, b"", "float32, bfloat16, int64..."),
    Field("device", f"S{DEVICE_BYTES}", "device", TEXT, b"", "cpu, cuda:0..."),
    Field("numel", "<i8", "numel", COUNT, 0, "elements", search=True),
    *(
        Field(name, "<f8", name, STAT, _NAN, doc, search=True, scalar=True, shown=True)
        for name, doc in (
            ("min", "the smallest finite value"),
            ("max", "the largest finite value"),
            ("mean", "the mean of the finite values"),
            ("std", "their population std (ddof 0)"),
            ("norm", "their L2 norm"),
        )
    ),
    *(
        Field(name, "<i8", name, COUNT, NOT_LOOKED, doc, search=True, scalar=True)
        for name, doc in (
            ("nan", "NaN values"),
            ("posinf", "+inf values"),
            ("neginf", "-inf values"),
        )
    ),
    Field(
        "zero_frac",
        "<f4",
        "zeros",
        FRACTION,
        _NAN,
        "the fraction of values that are 0 (of floats sampled above 4096 on the torch path)",
        search=True,
        scalar=True,
        shown=True,
        merge=ELEMENT_MEAN,
    ),
    Field(
        "sat_frac",
        "<f4",
        "sat",
        FRACTION,
        _NAN,
        "the fraction of values equal to the finite min or max (a ReLU6 at its cap)",
        since=7,
        search=True,
        scalar=True,
        shown=True,
    ),
    Field(
        "absmean",
        "<f8",
        "absmean",
        STAT,
        _NAN,
        "the mean of |x| over the finite values (near 0: a vanishing activation)",
        since=8,
        search=True,
        scalar=True,
        shown=True,
        merge=FINITE_MEAN,
    ),
    Field(
        "neg_frac",
        "<f4",
        "neg",
        FRACTION,
        _NAN,
        "the fraction of values below 0, -inf among them (a ReLU's dead inputs)",
        since=9,
        search=True,
        scalar=True,
        shown=True,
        merge=ELEMENT_MEAN,
    ),
)

NAMES: tuple[str, ...] = tuple(f.name for f in FIELDS)
LENGTH = len(FIELDS)
_POSITIONS = {name: i for i, name in enumerate(NAMES)}


def at(name: str) -> int:
    """The position of field ``name`` in a summary tuple."""
    return _POSITIONS[name]


def field(name: str) -> Field:
    return FIELDS[_POSITIONS[name]]


SHAPE, DTYPE, DEVICE, NUMEL = at("shape"), at("dtype"), at("device"), at("numel")
MIN, MAX, MEAN, STD, NORM = at("min"), at("max"), at("mean"), at("std"), at("norm")
NAN, POSINF, NEGINF = at("nan"), at("posinf"), at("neginf")
ZERO_FRAC = at("zero_frac")
HEAD = slice(SHAPE, NUMEL + 1)  # where the tensor is and how large: known without its values
VALUES = slice(MIN, LENGTH)  # what its values say (NaN, NOT_LOOKED where not looked at)
COUNTS = slice(NAN, NEGINF + 1)  # its NaN, +inf and -inf counts

# reports' lists of statistics, in declaration order
STATS = tuple(f.name for f in FIELDS if f.kind == STAT and f.shown)  # min max mean...
FRACTIONS = tuple(f.name for f in FIELDS if f.kind == FRACTION and f.shown)  # zero_frac...
SEARCHED = tuple(f.name for f in FIELDS if f.search)
SCALARS = tuple(f.name for f in FIELDS if f.scalar)
COUNTED = tuple(f.name for f in FIELDS if f.kind == COUNT and f.missing == NOT_LOOKED)
# the values of a summary whose tensor's values were not looked at
NO_VALUES: tuple = tuple(f.missing for f in FIELDS[VALUES])
# a summary is its head, then its values; the three counts lie together
assert HEAD.start == 0 and HEAD.stop == VALUES.start and COUNTS.stop - COUNTS.start == 3


def missing_since(version: int) -> dict[str, float | int | bytes]:
    """The fields a recording of this schema version lacks, with what they read as."""
    return {f.name: f.missing for f in FIELDS if f.since > version}
