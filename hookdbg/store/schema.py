"""The recording format: one HDF5 file, plain compound tables, versioned.

Writer and reader both take every name and dtype from here, so the two can only
change together. docs/format.md describes the same schema for people using h5py or
pandas directly; a change here that is not backwards compatible raises
``SCHEMA_FLOOR`` (and with it ``SCHEMA_VERSION``).

Every table is an HDF5 group of equal-length 1-D column datasets (one per field of
the table's row dtype below), so that a query decompresses only the columns it reads:
one module's std across 2M rows took 0.065 s this way against 1.08 s from a compound
table. All columns are resizable, chunked and created before SWMR starts, so
everything the writer does afterwards, full tensor captures included, is an append.
Strings are fixed-width bytes: SWMR has no safe way to append variable-length data.
While a file is being written a reader may see one column a batch ahead of another;
the table's length is that of its shortest column.
"""

from __future__ import annotations

import functools
from enum import IntEnum

import numpy as np

from hookdbg.store import summary
from hookdbg.store.summary import CHANGED_IN_PLACE as CHANGED_IN_PLACE
from hookdbg.store.summary import NOT_LOOKED as NOT_LOOKED
from hookdbg.store.summary import SHAPE_BYTES as SHAPE_BYTES

FORMAT = "hookdbg-recording"
# 2: segments (training steps and eval batches); 3: the GradScaler's steps.scale, .skipped;
# 4: the losses and shards tables, loss sites in modules, steps.overhead, loss alerts;
# 5: each table's tail kept apart while the file is written (TAIL_SLOTS); 6: device_times;
# 7: modules.file and .line (where each module's forward is), tensors.sat_frac.
# A change to the tables here raises SCHEMA_FLOOR; a tensor summary field declared with a
# later ``since`` (hookdbg/store/summary.py) raises the version by itself.
SCHEMA_FLOOR = 7
SCHEMA_VERSION = max(SCHEMA_FLOOR, *(f.since for f in summary.FIELDS))


class StepKind(IntEnum):
    """What a segment of the run was (hookdbg/recorder/steps/steps.py)."""

    TRAIN = 0  # a training step: a backward ran or an optimizer stepped
    EVAL = 1  # an eval batch: forwards only (validation, test, inference)

    @property
    def label(self) -> str:
        return ("step", "eval")[self]


class Phase(IntEnum):
    """When a row was observed."""

    FWD = 0
    BWD = 1
    OPT = 2  # an optimizer step

    @property
    def label(self) -> str:
        return ("fwd", "bwd", "opt")[self]


class Slot(IntEnum):
    """Which tensor of a module call a summary describes."""

    INPUT = 0
    OUTPUT = 1
    GRAD_OUTPUT = 2  # gradient of the loss w.r.t. an output
    GRAD_INPUT = 3  # gradient of the loss w.r.t. an input
    PARAM_GRAD = 4  # a parameter's .grad after accumulation (before any all-reduce)
    PARAM = 5  # a parameter's value after an optimizer step
    STEP_GRAD = 6  # a parameter's .grad as the optimizer step uses it (after all-reduce)
    LOSS = 7  # what backward() was called on (alerts only: values are in ``losses``)

    @property
    def label(self) -> str:
        return (
            "input",
            "output",
            "grad_output",
            "grad_input",
            "param_grad",
            "param",
            "step_grad",
            "loss",
        )[self]


class ModuleKind(IntEnum):
    MODULE = 0
    OPTIMIZER = 1
    WRAPPER = 2  # DistributedDataParallel, DataParallel: transparent, named as its model
    # a place in the script that calls backward() (hookdbg/recorder/hooks/backward.py): named
    # after what it is called on (``loss``, ``errD``), its type is its file and line
    LOSS = 3


class CaptureReason(IntEnum):
    EXPLICIT = 0  # --capture
    FLIGHT = 1  # the flight recorder, written when an alert fired


NAME_BYTES = 256
TYPE_BYTES = 64
PATH_BYTES = 64
MESSAGE_BYTES = 512
SOURCE_BYTES = 256  # a longer file name is not recorded: cut short, it would name no file

MODULES = np.dtype(
    [
        ("id", "<i4"),
        ("name", f"S{NAME_BYTES}"),
        ("type", f"S{TYPE_BYTES}"),
        ("parent", "<i4"),
        ("root", "<i4"),
        ("depth", "<i2"),
        ("kind", "u1"),
        ("params", "<i8"),
        # where its class's forward is defined (a loss site: its backward() call), so a
        # report can open it: an absolute file name and its first line ("", 0: unknown)
        ("file", f"S{SOURCE_BYTES}"),
        ("line", "<i4"),
    ]
)

CALLS = np.dtype(
    [
        ("call", "<i8"),
        ("phase", "u1"),
        ("step", "<i4"),
        ("segment", "<i4"),
        ("module", "<i4"),
        ("index", "<i4"),
        ("parent", "<i8"),
        ("depth", "<i2"),
        ("start", "<f8"),
        ("total", "<f8"),
        ("self", "<f8"),
    ]
)

# One row per recorded module call (and loss site) timed on a CUDA device, by phase:
# seconds between CUDA events on the current stream (hookdbg/recorder/hooks/devicetime.py),
# written a step after the call's calls row. Joined to it by (call, phase).
DEVICE_TIMES = np.dtype(
    [
        ("call", "<i8"),
        ("phase", "u1"),
        ("step", "<i4"),
        ("segment", "<i4"),
        ("total", "<f8"),
        ("self", "<f8"),
    ]
)

# Where a tensor row is, then its summary: the fields of hookdbg/store/summary.py (the
# recorder's summary tuples hold them in the same order)
WHERE_COLUMNS = ("call", "step", "segment", "module", "phase", "slot", "path")
TENSORS = np.dtype(
    [
        ("call", "<i8"),
        ("step", "<i4"),
        ("segment", "<i4"),
        ("module", "<i4"),
        ("phase", "u1"),
        ("slot", "u1"),
        ("path", f"S{PATH_BYTES}"),
        *((f.name, f.dtype) for f in summary.FIELDS),
    ]
)
SUMMARY_COLUMNS = summary.NAMES
assert TENSORS.names == (*WHERE_COLUMNS, *SUMMARY_COLUMNS)

STEPS = np.dtype(
    [
        ("step", "<i4"),
        ("segment", "<i4"),
        ("kind", "u1"),
        ("start", "<f8"),
        ("end", "<f8"),
        ("calls", "<i4"),
        ("optimizer_steps", "<i4"),
        ("backward", "u1"),
        ("recorded", "u1"),
        ("scale", "<f8"),  # the loss scale AMP's GradScaler used (NaN: none)
        ("skipped", "<i4"),  # optimizer steps it skipped (their scaled gradients overflowed)
        # seconds hookdbg's own hooks took on the training thread in it: the segment's
        # wall time is end - start + overhead (start and end leave hookdbg out)
        ("overhead", "<f8"),
    ]
)

# One row per backward pass the script started (backward() or torch.autograd.grad called
# outside any other pass): the loss it started from, summarised, and which loss site
# (a modules row of kind LOSS) called it. ``value`` is the mean of its finite values (the
# loss itself, for the usual scalar), divided by ``scale`` where a GradScaler had scaled
# it (NaN: not scaled).
LOSSES = np.dtype(
    [
        ("step", "<i4"),
        ("segment", "<i4"),
        ("module", "<i4"),
        ("index", "<i4"),  # its place among the segment's backward passes
        ("numel", "<i8"),
        ("value", "<f8"),
        ("nan", "<i8"),
        ("posinf", "<i8"),
        ("neginf", "<i8"),
        ("scale", "<f8"),
    ]
)

ALERTS = np.dtype(
    [
        ("step", "<i4"),
        ("segment", "<i4"),
        ("call", "<i8"),
        ("module", "<i4"),
        ("phase", "u1"),
        ("slot", "u1"),
        ("path", f"S{PATH_BYTES}"),
        ("numel", "<i8"),
        ("nan", "<i8"),
        ("posinf", "<i8"),
        ("neginf", "<i8"),
        ("first", "u1"),
        ("time", "<f8"),
        ("message", f"S{MESSAGE_BYTES}"),
    ]
)

CAPTURES = np.dtype(
    [
        ("step", "<i4"),
        ("segment", "<i4"),
        ("call", "<i8"),
        ("module", "<i4"),
        ("phase", "u1"),
        ("slot", "u1"),
        ("path", f"S{PATH_BYTES}"),
        ("dtype", "S16"),
        ("shape", f"S{SHAPE_BYTES}"),
        ("offset", "<i8"),
        ("nbytes", "<i8"),
        ("reason", "u1"),
    ]
)

INFO = np.dtype([("time", "<f8"), ("key", "S32"), ("value", f"S{MESSAGE_BYTES}")])

# One row per tensor place (module, phase, slot, path) that held a DTensor, written the
# first time it did (and again if its placement changes): each of its tensor rows
# summarises this rank's local shard. ``placements`` has one entry per mesh dimension,
# as torch prints them (``S(0)`` a shard of dim 0, ``R`` a replica, ``P(sum)`` a partial
# sum, ``_S(0, 2)`` a strided shard); ``mesh`` is the mesh's ranks as a JSON nested list,
# ``dims`` its dimension names, ``coordinate`` this rank's place in it, and ``shape``
# the global tensor's shape. Readers merge the shards of the ranks that hold the other
# pieces into the global tensor's statistics (hookdbg/read/shards.py).
SHARDS = np.dtype(
    [
        ("module", "<i4"),
        ("phase", "u1"),
        ("slot", "u1"),
        ("path", f"S{PATH_BYTES}"),
        ("placements", "S64"),
        ("mesh", "S256"),
        ("dims", "S64"),
        ("coordinate", "S32"),
        ("shape", f"S{SHAPE_BYTES}"),
    ]
)

PROGRESS = np.dtype(
    [
        ("time", "<f8"),
        ("steps", "<i4"),
        ("rows", "<i8"),
        ("dropped", "<i8"),
    ]
)

END = np.dtype(
    [
        ("time", "<f8"),
        ("status", "S16"),
        ("exit_code", "<i4"),
        ("steps", "<i4"),
        ("calls", "<i8"),
        ("alerts", "<i4"),
        ("dropped", "<i8"),
        ("message", f"S{MESSAGE_BYTES}"),
        ("write_failed", "<f8"),  # when writing stopped (disk full...), NaN if it never did
        ("write_error", f"S{MESSAGE_BYTES}"),  # why
    ]
)

# name -> (row dtype, rows per chunk of each column): the tables rows are appended to
TABLES: dict[str, tuple[np.dtype, int]] = {
    "modules": (MODULES, 1024),
    "calls": (CALLS, 8192),
    "tensors": (TENSORS, 8192),
    "steps": (STEPS, 4096),
    "alerts": (ALERTS, 256),
    "captures": (CAPTURES, 256),
    "progress": (PROGRESS, 1024),
    "info": (INFO, 64),  # facts learned during the run (e.g. the distributed backend)
    "losses": (LOSSES, 4096),
    "shards": (SHARDS, 256),
    "device_times": (DEVICE_TIMES, 8192),  # the order is the committed table's: new last
}
# Written in place, never appended: their file space is allocated (and filled) when the
# file is created, so that they can be written when the disk is full.
#   end: one row, the recording's last word; its status is empty until it ends
#   committed: for each table in TABLES (in that order), three numbers, one row each:
#     its rows in its columns, known to be whole on disk (SEALED); how many times its
#     tail was written (GENERATION: the tail is in slot GENERATION % 3); and how many
#     bytes the tail is (TAIL_BYTES, 0: none)
#     (before version 5, one row: the rows known to be whole, all in the columns)
END_TABLE = "end"
COMMITTED = "committed"
SEALED, GENERATION, TAIL_BYTES = range(3)

# Rows reach the file every flush interval, but a table's columns get only whole chunks,
# each compressed and written once: under SWMR HDF5 never reuses file space, so a chunk
# rewritten at every flush as it fills would leave a copy behind each time, and the
# file would grow with wall time rather than with what it holds. The rows after the
# last whole chunk, its *tail*, are kept in one of three byte datasets of the table's
# group, ``tail0`` to ``tail2``: a zlib stream of those rows as a numpy array of the
# table's row dtype (``np.frombuffer(zlib.decompress(data), dtype)``), rewritten in
# place (uncompressed datasets keep their space). Each flush writes the next slot
# round, then ``committed`` names it: a slot is rewritten two commits after it was
# named, so a reader that sees ``committed`` move on by at most one while it read has
# read whole tails. A closed recording has empty tails: every row is in the columns,
# its last chunk partly filled.
TAIL_SLOTS = ("tail0", "tail1", "tail2")
# the table group's attribute naming its columns in the order of a tail row's fields
# (each field as its column's dtype and per-row shape)
TAIL_COLUMNS = "columns"
TAIL_CHUNK = 16384  # bytes per chunk of a tail slot

# A closed recording's small tables, whole, in one object: each of their columns is an
# HDF5 dataset that costs a reader about 0.15 ms to open and check, some 45 of them per
# file, and a report on a run of many ranks reads them from every rank's file. As the
# writer closes a file normally it keeps every row of SMALL_TABLES, the last progress
# row and the end row in the byte dataset SMALL (made empty with the file, its
# attribute "parts" naming SMALL_PARTS: under SWMR no object can be added later): two
# int64 rows, the row count of each part (in SMALL_PARTS' order; of the progress
# table, its rows) and the bytes of its stream, then each part's zlib stream of its
# rows as a numpy array of its row dtype (a tail row's): a reader inflates only the
# parts it reads. It is written before the end row, so a file whose end row says it
# closed normally has it whole; an empty one (the file is live, was cut short, or
# writing failed) says nothing. Readers that do not know it ignore it; the tables stay
# the record, and a copy whose counts disagree with ``committed`` (a table rewritten
# since) is not used. Added without a schema version: its presence says it.
SMALL = "small_tables"
SMALL_TABLES = ("modules", "steps", "alerts", "captures", "info", "losses", "shards")
# and the last progress row (a reader needs no other) and the end row
SMALL_PARTS = (*SMALL_TABLES, "progress", END_TABLE)
SMALL_CHUNK = 4096
# Raw bytes of captured tensors; "captures" rows point into it (offset, nbytes).
CAPTURE_DATA = "capture_data"
CAPTURE_CHUNK = 1 << 20

# The HDF5 filters the writer compresses with, as pipelines in the order applied (ids:
# deflate 1, shuffle 2, LZF 32000, which h5py registers itself: all built in, none a
# plugin). A table's columns: shuffle, then LZF (floats) or deflate (the rest); some
# version 2 files keep texts with deflate alone. The capture bytes: deflate. The tails'
# slots, ``committed`` and ``end`` (written in place) have none, but a version 1 file's
# ``end`` is compressed like a column. A reader refuses any other pipeline unread.
DEFLATE, SHUFFLE, LZF = 1, 2, 32000
COLUMN_FILTERS = frozenset({(SHUFFLE, LZF), (SHUFFLE, DEFLATE), (DEFLATE,)})
CAPTURE_FILTERS = frozenset({(DEFLATE,)})
NO_FILTERS = frozenset({()})
END_FILTERS = COLUMN_FILTERS | NO_FILTERS
# No chunk the writer makes holds more (a column's are at most 512 kB: 8,192 shapes of
# 64 bytes; the capture bytes' exactly this): HDF5 decompresses a whole chunk to read a row.
MAX_CHUNK_BYTES = 1 << 20

# Value histograms (``record --histograms N``): an optional 2-D column of the tensors
# table, ``tensors/histogram`` (int64, [rows, N]), present only in recordings made with
# histograms on, appended with the rest of each row (so the committed lengths cover
# it). Row i holds the counts of the finite values of tensor row i in N equal bins from
# its ``min`` to its ``max``, the last bin closed, as numpy.histogram(values, N) counts
# them in float64: the edges are numpy.linspace(min, max, N + 1). Finite values all
# equal (min == max): all in bin N // 2. Rows without statistics, or with no finite
# values: all zeros. So a floating tensor's counts sum to numel - nan - posinf - neginf.
# Readers that do not know the column ignore it (read/checks.py), so it needed no new
# schema version: version 2 files without it read with no histograms.
HISTOGRAM = "histogram"
MAX_HISTOGRAM_BINS = 1024


@functools.lru_cache(maxsize=8)
def tensors_dtype(bins: int) -> np.dtype:
    """The tensors table's row with its histogram column (``bins`` counts)."""
    return np.dtype([*TENSORS.descr, (HISTOGRAM, "<i8", (bins,))])


def tables(histogram_bins: int = 0) -> dict[str, tuple[np.dtype, int]]:
    """``TABLES`` as a recorder creates them: with histograms, the tensors table has
    the ``histogram`` column (and fewer rows per chunk of it: see the writer)."""
    if not histogram_bins:
        return TABLES
    out = dict(TABLES)
    out["tensors"] = (tensors_dtype(histogram_bins), TABLES["tensors"][1])
    return out


def slot_label(slot: int, path: str) -> str:
    """How a tensor's place is written everywhere: ``input[0]``, ``output``,
    ``grad_output[1.0]``, ``param_grad[weight]``."""
    name = Slot(slot).label
    return f"{name}[{path}]" if path else name


def parse_slot_label(text: str) -> tuple[Slot, str]:
    """The inverse of ``slot_label``: ``output[0]`` -> (Slot.OUTPUT, "0")."""
    name, _, rest = text.strip().partition("[")
    if rest and not rest.endswith("]"):
        raise ValueError(f"bad slot {text!r}: write e.g. output, input[0], param_grad[weight]")
    labels = {s.label: s for s in Slot}
    if name not in labels:
        raise ValueError(f"unknown slot {name!r}; use one of {', '.join(labels)}")
    return labels[name], rest[:-1]
