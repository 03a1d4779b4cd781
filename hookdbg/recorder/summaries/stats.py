"""Tensor summaries: the numbers hookdbg keeps for every tensor it sees.

A summary is a plain tuple of the fields hookdbg/store/summary.py declares (``FIELDS``;
``NAN``, ``POSINF``... name the positions), of ints, floats and strings, cheap to build
on the training thread and invisible to Python's cyclic garbage collector (a tuple
holding a ``torch.dtype`` stays tracked for ever and makes full collections, which scan
torch's ~300,000 objects, come sooner).
The writer thread turns it into an HDF5 row.

Speed matters more here than anywhere else in hookdbg (it runs once per new tensor per
step). A CPU tensor's statistics come from one pass of a small C function
(``_cstats.c``): min and max over the finite values, their mean, population std and
norm, the NaN, +inf, -inf and zero counts, the mean of |x| and the values at the min or
the max.
Three torch reductions cost three dispatches (2.5-5 us each, most of the cost on a
small tensor) and three reads of a large one; the C pass costs 0.4 us on a small tensor
and about 185 us per million floats, and gives the exact zero fraction and finite-only
statistics at no extra cost.
Without the compiled extension (an install that could not build it) the torch
reductions below are used.

Every path (this one, the torch fallback, the device arena and kernel of deferred.py
and blockstats.py) gives min and max exactly and mean, population std and norm within
1e-12 of a float64 two-pass computation over the finite values
(tests/recorder/test_engines.py), so that a recording does not depend on which path
made it: float32 sums, numpy's and torch's own reductions of float32 among them, are
off by 1e-7 of the mean, enough for ``hookdbg diff`` to tell two recordings of one
seeded run apart. Of an integer or bool tensor every path measures the same fields
(``INTEGER_CONTRACT``): its range and its exact fractions of zeros and of values below 0.

On a CUDA (or other non-CPU) device nothing may be read back inside a hook: tensors
are copied into a per-step device buffer and summarised together at the step's end
(hookdbg/recorder/summaries/deferred.py).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch._C import _functorch

from hookdbg.store import summary as layout

try:
    from hookdbg.recorder._cstats import norms as _norms
    from hookdbg.recorder._cstats import summary as _one_pass
except ImportError:  # not built: torch's reductions instead
    _one_pass = _norms = None

# The order of values in a summary tuple: that of the tensors table's summary columns.
FIELDS = layout.NAMES
# A summary: the fields of ``FIELDS``, with one more value where histograms are recorded
# (hookdbg/recorder/summaries/histograms.py)
Summary = tuple[Any, ...]
SHAPE, DTYPE, DEVICE, NUMEL = layout.SHAPE, layout.DTYPE, layout.DEVICE, layout.NUMEL
MIN, MAX, MEAN, STD, NORM = layout.MIN, layout.MAX, layout.MEAN, layout.STD, layout.NORM
NAN, POSINF, NEGINF, ZERO_FRAC = layout.NAN, layout.POSINF, layout.NEGINF, layout.ZERO_FRAC
COUNTS = layout.COUNTS

ZERO_SAMPLE = 4096
NUMPY_MAX = 16384  # above this, torch's kernels beat numpy's (measured on 256x256)
_FLOATS = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})
_INTEGERS = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool})
_MEASURED = _FLOATS | _INTEGERS
# What every engine measures of an integer or bool tensor (tests/recorder/test_engines.py):
# its range, its fractions of zeros and of values below 0 (exact), and NaN/inf counts of
# 0; the other values read as not measured
INTEGER_CONTRACT = ("min", "max", "nan", "posinf", "neginf", "zero_frac", "neg_frac")
INTEGER_NAMES = frozenset(str(d).removeprefix("torch.") for d in _INTEGERS)  # dtype names
_NATIVE = frozenset({torch.float32, torch.float64})
# the 8-bit floating formats: summarised on the host in float32, which holds them exactly
# (the one-pass kernel and the device's batched statistics leave them shape-only)
_FP8 = frozenset(
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
    if hasattr(torch, name)
)
_NAN = float("nan")


def values(**named: float | int) -> tuple:
    """A summary's values (``layout.VALUES``): those named, and what the others hold
    where nothing was measured (NaN; counts ``NOT_LOOKED``)."""
    out = list(layout.NO_VALUES)
    for name, value in named.items():
        out[_VALUE_AT[name]] = value
    return tuple(out)


_VALUE_AT = {name: layout.at(name) - layout.VALUES.start for name in layout.NAMES[layout.VALUES]}


_NO_STATS = layout.NO_VALUES
_EMPTY_FLOAT_STATS = values(norm=0.0, nan=0, posinf=0, neginf=0)
_FINITE = {"nan": 0, "posinf": 0, "neginf": 0}
_DTYPE_NAMES: dict[torch.dtype, str] = {}


_SHAPES: dict[tuple[int, ...], tuple[int, ...]] = {}
_SHAPES_KEPT = 4096  # distinct shapes shared; past that (shapes that vary), a copy each


def shape_of(t: torch.Tensor) -> tuple[int, ...]:
    """``t``'s shape as a plain tuple, one shared object per distinct shape: a summary
    lives until the writer has its row, and a new tuple each would count towards the
    garbage collector's next collection (torch.Size hashes and compares as a tuple)."""
    size = t.shape
    shape = _SHAPES.get(size)
    if shape is None:
        shape = tuple(size)
        if len(_SHAPES) < _SHAPES_KEPT:
            _SHAPES[shape] = shape
    return shape


def dtype_name(dtype: torch.dtype) -> str:
    """'float32' for torch.float32 (memoised: called for every tensor)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def device_name(t: torch.Tensor) -> str:
    if t.is_cpu:
        return "cpu"
    if t.is_cuda:  # memoised: str(t.device) makes a device object each time
        index = t.get_device()
        name = _CUDA_NAMES.get(index)
        if name is None:
            name = _CUDA_NAMES[index] = f"cuda:{index}"
        return name
    return str(t.device)


_CUDA_NAMES: dict[int, str] = {}


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_NOT_READ = torch.empty(0, dtype=torch.complex64)  # what the C pass leaves to torch


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's values of ``t``: a DTensor's local shard (its statistics are the
    shard's; the recording says how the tensor is placed: recorder/summaries/shards.py), any other
    tensor itself. Reading a DTensor as a whole would run collectives."""
    if type(t) in _PLAIN:
        return t
    inner = getattr(t, "_local_tensor", None)
    return t if inner is None else inner


def physical(t: torch.Tensor) -> torch.Tensor:
    """The tensor that holds ``t``'s values. Inside torch.func's transforms (``grad``,
    ``vmap``, ``functionalize``...) modules see wrappers with no storage of their own;
    the values are in the tensor under every wrapper. Under ``vmap`` that tensor holds
    every sample at once: its batch dimensions are moved to the front (outermost
    ``vmap`` first), so that its shape reads as the batch's, then the sample's. A
    DTensor's are its local shard's (``local``)."""
    t = local(t)
    bdims = []
    while _functorch.is_functorch_wrapped_tensor(t):
        if torch._is_functional_tensor(t):  # functionalize: in-place changes of its base
            torch._sync(t)  # are replayed on it only when asked
        bdims.append(_functorch.maybe_get_bdim(t) if _functorch.is_batchedtensor(t) else -1)
        t = _functorch.get_unwrapped(t)
    bdims = [b for b in reversed(bdims) if b >= 0]
    if bdims:
        with outside_transforms():  # there, movedim would make a wrapper again
            for moved, bdim in enumerate(bdims):
                t = t.movedim(moved + bdim, moved)
    return t


def _peek() -> bool:
    return _functorch.peek_interpreter_stack() is not None


# Whether a torch.func transform is running: a plain C function, asked of every tensor
# at --level shapes (pybind's peek_interpreter_stack added 5K instructions a module call)
transforms_active: Callable[[], bool] = getattr(torch._C, "_are_functorch_transforms_active", _peek)

outside_transforms: Callable[[], contextlib.AbstractContextManager[object]]
try:
    from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack

    outside_transforms = temporarily_clear_interpreter_stack
except ImportError:  # a torch without it: reading a functorch-wrapped tensor fails
    outside_transforms = contextlib.nullcontext


def has_stats(t: torch.Tensor) -> bool:
    """Non-empty floating-point, integer and bool tensors get statistics (integers and
    bools those of ``_integer``); others get shape and dtype."""
    return t.dtype in _MEASURED and t.numel() > 0


def _summary(t: torch.Tensor, n: int, **named: float | int) -> Summary:
    """The summary of ``t`` (``n`` elements) holding the values ``named``."""
    return (shape_of(t), dtype_name(t.dtype), device_name(t), n, *values(**named))


def shape_only(t: torch.Tensor) -> Summary:
    """Summary of a tensor whose values are not looked at (``--level shapes``, an empty
    or complex one).
    Inside torch.func's transforms, that of the tensor under the wrappers, as at
    ``--level stats`` (``physical``)."""
    t = physical(t) if transforms_active() else local(t)
    stats = _EMPTY_FLOAT_STATS if t.dtype in _FLOATS and t.numel() == 0 else _NO_STATS
    return (shape_of(t), dtype_name(t.dtype), device_name(t), t.numel(), *stats)


# element kinds of _cstats.c (its enum), with the dtype's name
C_KINDS = {
    torch.float32: (0, "float32"),
    torch.float64: (1, "float64"),
    torch.float16: (2, "float16"),
    torch.bfloat16: (3, "bfloat16"),
    torch.int64: (4, "int64"),
    torch.int32: (5, "int32"),
    torch.uint8: (6, "uint8"),
    torch.bool: (6, "bool"),
    torch.int8: (7, "int8"),
    torch.int16: (8, "int16"),
}
_HALF_WIDE = 65536  # above this many half elements, convert with torch (vectorised) first


def summarise(t: torch.Tensor) -> Summary:
    """Summary of a host tensor, read back at once (cheap on CPU: no device to wait for).
    Nothing here records an autograd graph, whatever the grad mode. A DTensor's is its
    local shard's."""
    t = local(t)
    spec = C_KINDS.get(t.dtype)
    if spec is not None and _one_pass is not None and t.is_cpu and type(t) in _PLAIN:
        n = t.numel()
        if n:
            kind, name = spec
            v = t if t.is_contiguous() else t.detach().contiguous()
            if kind in (2, 3) and n > _HALF_WIDE:
                v, kind = v.detach().float(), 0
            address = v.data_ptr()
            if not address:  # a torch.func wrapper (functionalize's): values elsewhere
                raise RuntimeError("hookdbg: the tensor's values are not in its storage")
            return _one_pass(address, n, kind, shape_of(t), name)  # type: ignore[no-any-return]
    return _torch_summary(t)


def _torch_summary(t: torch.Tensor) -> Summary:
    if t.is_meta:  # no values at all (torch.func.linearize traces on them)
        return shape_only(t)
    t = t.detach()
    dtype = t.dtype
    n = t.numel()
    if (dtype not in _FLOATS and dtype not in _FP8) or n == 0:
        return _integer(t, n) if n and dtype in _INTEGERS else shape_only(t)
    if n == 1 and dtype not in _FP8:
        return _one_value(t)
    if n <= NUMPY_MAX and dtype in _NATIVE and t.is_cpu:
        return _small(t, n)
    v = t.reshape(-1)
    if dtype not in _NATIVE:
        v = v.float()  # half types: float32 holds them exactly, and torch reduces it fast
    lo_t, hi_t = torch.aminmax(v)
    lo = lo_t.item()
    hi = hi_t.item()
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return _nonfinite_summary(t, v)
    mean, m2, absolute = _moments(v, n)
    std, zeros = _std(lo, hi, m2, n), _zero_fraction(v, n)
    squares = m2 + n * mean * mean
    at_ends, below = _ends_and_negatives(v, lo, hi)
    return _finite(t, n, lo, hi, mean, std, squares, zeros, at_ends / n, absolute / n, below / n)


def _ends_and_negatives(v: torch.Tensor, lo: float, hi: float) -> tuple[int, int]:
    """How many values of ``v`` equal ``lo`` or ``hi``, and how many are below 0, -inf
    among them (one read back)."""
    counts = torch.stack([torch.count_nonzero((v == lo) | (v == hi)), torch.count_nonzero(v < 0)])
    at_ends, below = counts.tolist()
    return at_ends, below


def _integer(t: torch.Tensor, n: int) -> Summary:
    """Integers and bools (token ids, labels, masks) get their range (an index out of
    range) and their exact zero fraction (padding, a mask's False); they cannot hold
    NaN or inf, so those counts are 0. Their mean, std, norm, absmean and sat_frac are
    not measured: no quantity is the mean of token ids (``INTEGER_CONTRACT``). One read
    back, as on a device it waits for it."""
    v = t.reshape(-1)
    if v.dtype == torch.bool:
        v = v.view(torch.uint8)
    lo, hi = torch.aminmax(v)
    zeros, below = n - torch.count_nonzero(v), torch.count_nonzero(v < 0)
    counts = torch.stack([lo.double(), hi.double(), zeros.double(), below.double()]).tolist()
    lo_f, hi_f, zeros_f, below_f = counts
    fractions = {"zero_frac": zeros_f / n, "neg_frac": below_f / n}
    return _summary(t, n, min=lo_f, max=hi_f, **fractions, **_FINITE)


def _finite(
    t: torch.Tensor,
    n: int,
    lo: float,
    hi: float,
    mean: float,
    std: float,
    squares: float,
    zeros: float,
    sat: float,
    absmean: float,
    negatives: float,
) -> Summary:
    return _summary(
        t, n, min=lo, max=hi, mean=mean, std=std, norm=math.sqrt(squares), **_FINITE,
        zero_frac=zeros, sat_frac=sat, absmean=absmean, neg_frac=negatives,
    )  # fmt: skip


def _one_value(t: torch.Tensor) -> Summary:
    x = t.item()
    if math.isfinite(x):
        zero, below = float(x == 0), float(x < 0)
        return _finite(t, 1, x, x, x, 0.0, x * x, zero, 1.0, abs(x), below)
    nan, posinf, neginf = int(math.isnan(x)), int(x == math.inf), int(x == -math.inf)
    counts = {"nan": nan, "posinf": posinf, "neginf": neginf}
    return _summary(t, 1, **counts, zero_frac=0.0, neg_frac=float(neginf))


def _small(t: torch.Tensor, n: int) -> Summary:
    """A small CPU tensor by numpy (fewer dispatches than torch), in float64 and two
    passes: a float32 sum is off by 1e-7 of the mean, and ``E[x^2] - mean^2`` loses
    every digit of a spread that is tiny next to the mean (1e7 plus noise)."""
    a = t.detach().numpy().reshape(-1)
    lo, hi = float(a.min()), float(a.max())
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return _nonfinite_summary(t, t.reshape(-1))
    with np.errstate(over="ignore", invalid="ignore"):  # never a warning in the user's stderr
        wide = a.astype(np.float64)  # a copy: ``centred`` below is made in its place
        mean = float(wide.sum()) / n  # pairwise: exact to a few units of the last place
        absolute = float(np.abs(wide).sum())
        centred = np.subtract(wide, mean, out=wide)
        off = float(centred.sum())  # what the mean's rounding leaves: corrects M2
        m2 = max(float(np.dot(centred, centred)) - off * off / n, 0.0)
    return _finite(
        t,
        n,
        lo,
        hi,
        mean,
        _std(lo, hi, m2, n),
        m2 + n * mean * mean,
        1.0 - int(np.count_nonzero(a)) / n,
        int(np.count_nonzero((a == lo) | (a == hi))) / n,
        absolute / n,
        int(np.count_nonzero(a < 0)) / n,
    )


_CHUNK = 1 << 20  # elements of a float64 temporary of ``_moments`` (8 MB)


def _moments(v: torch.Tensor, n: int) -> tuple[float, float, float]:
    """(mean, M2, sum of |x|) of the ``n`` finite values of the flat tensor ``v``, as a float64
    two-pass computation gives them: the mean from torch's float64 sum (a cascade sum,
    exact to a few units of the last place), M2 from the float64 deviations from it, a
    chunk at a time so that no temporary is larger than 8 MB. One read back, at the
    end. torch's ``vector_norm`` and ``dot`` sum in long runs on the CPU (off by 4e-11
    of 16M values), and ``E[x^2] - mean^2`` cancels where the mean is large."""
    mean = v.sum(dtype=torch.float64) / n
    parts = []
    for chunk in v.split(_CHUNK):
        centred = chunk.to(torch.float64, copy=True).sub_(mean)
        absolute = chunk.abs().sum(dtype=torch.float64)
        parts.append(torch.stack([centred.sum(), centred.square_().sum(), absolute]))
    totals = torch.stack(parts).sum(0) if len(parts) > 1 else parts[0]
    average, off, m2, absolute_sum = torch.cat([mean.reshape(1), totals]).tolist()
    # the correction term of the corrected two-pass algorithm: what the mean's own
    # rounding adds to the squares
    return average, max(m2 - off * off / n, 0.0), absolute_sum


def _std(lo: float, hi: float, m2: float, n: int) -> float:
    """The population std (ddof 0): exactly 0 for a constant tensor, whose M2 may
    hold the rounding of its mean."""
    return 0.0 if lo == hi else math.sqrt(m2 / n)


def _zero_fraction(v: torch.Tensor, n: int) -> float:
    if n <= ZERO_SAMPLE:
        return 1.0 - torch.count_nonzero(v).item() / n
    return 1.0 - torch.count_nonzero(v.index_select(0, _sample(n, v.device))).item() / ZERO_SAMPLE


_SAMPLES: dict[tuple[int, torch.device], torch.Tensor] = {}


def _sample(n: int, device: torch.device) -> torch.Tensor:
    """``ZERO_SAMPLE`` sorted positions in ``range(n)``, pseudo-random but the same for
    every tensor of ``n`` elements (memoised): unlike a fixed stride, a random sample
    cannot lock onto a periodic layout (rows, channels, every k-th element)."""
    key = (n, device)
    index = _SAMPLES.get(key)
    if index is None:
        g = torch.Generator().manual_seed(n)
        index = torch.randint(0, n, (ZERO_SAMPLE,), generator=g).sort().values.to(device)
        _SAMPLES[key] = index
    return index


def _nonfinite_summary(t: torch.Tensor, v: torch.Tensor) -> Summary:
    """Counts of NaN/+inf/-inf, with min/max/mean/std/norm over the finite elements."""
    if v.dtype not in _NATIVE:
        v = v.float()
    nan = int(torch.isnan(v).sum())
    posinf = int(torch.isposinf(v).sum())
    neginf = int(torch.isneginf(v).sum())
    finite = v[torch.isfinite(v)]
    n = v.numel()
    stats: dict[str, float] = {}
    below = neginf  # -inf is below 0
    if finite.numel():
        lo_t, hi_t = torch.aminmax(finite)
        m = finite.numel()
        mean, m2, absolute = _moments(finite, m)
        lo, hi = lo_t.item(), hi_t.item()
        stats = {"min": lo, "max": hi, "mean": mean, "std": _std(lo, hi, m2, m)}
        stats["absmean"] = absolute / m
        stats["norm"] = math.sqrt(m2 + m * mean * mean)
        at_ends, finite_below = _ends_and_negatives(finite, lo, hi)
        stats["sat_frac"] = at_ends / n
        below += finite_below
    zero = 1.0 - torch.count_nonzero(v).item() / n
    counts = {"nan": nan, "posinf": posinf, "neginf": neginf}
    return _summary(t, n, **stats, **counts, zero_frac=zero, neg_frac=below / n)


def with_counts(summary: Summary, nan: int, posinf: int, neginf: int) -> Summary:
    """``summary`` (shape-only: nothing else was measured) with NaN/inf counts."""
    counted = list(summary)
    counted[NAN], counted[POSINF], counted[NEGINF] = nan, posinf, neginf
    return tuple(counted)


def check_finite(t: torch.Tensor) -> Summary:
    """Shape, dtype, min and max, and NaN/inf counts when there are any: the cheap NaN
    check of ``--nan-check`` below ``--level stats`` (one pass instead of three)."""
    t = local(t)
    if t.dtype not in _FLOATS or t.numel() == 0 or t.is_meta:
        return shape_only(t)
    v = t.detach().reshape(-1)
    if v.dtype not in _NATIVE:
        v = v.float()
    lo_t, hi_t = torch.aminmax(v)
    lo, hi = lo_t.item(), hi_t.item()
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return _nonfinite_summary(t, v)
    return _summary(t, t.numel(), min=lo, max=hi, **_FINITE)


def reshaped(summary: Summary, t: torch.Tensor) -> Summary:
    """The summary of a view holding the same elements as the summarised tensor (a
    flatten, a transpose): every statistic is the same; only the shape differs."""
    return (*summary[:SHAPE], shape_of(t), *summary[SHAPE + 1 :])


def is_finite(summary: Summary) -> bool:
    """Whether a summary saw no NaN and no inf (shape-only summaries count as finite)."""
    nan, posinf, neginf = summary[COUNTS]
    return nan <= 0 and posinf <= 0 and neginf <= 0


def norms_of(tensors: list[torch.Tensor]) -> list[float]:
    """The L2 norms of many tensors: contiguous CPU ones by the C pass (in double), the
    rest in one fused torch call and one read.

    Used for parameter values after each optimizer step: a full summary of every
    weight every step costs as much as all the activations' summaries together, and
    the norm is what weight tracking and replica comparison need.
    """
    if not tensors:
        return []
    tensors = [local(t) for t in tensors]  # a DTensor's shard: its norm is summed later
    # the C pass reads plain tensors only: a subclass's data_ptr is not its values'
    plain = [t if type(t) in _PLAIN else _NOT_READ for t in tensors]
    norms: list[float | None] = [None] * len(tensors) if _norms is None else _norms(plain, C_KINDS)
    rest = [i for i, norm in enumerate(norms) if norm is None]
    if rest:
        with torch.no_grad():
            fused = torch.stack(torch._foreach_norm([tensors[i] for i in rest])).tolist()
        for i, norm in zip(rest, fused, strict=True):
            norms[i] = norm
    return norms  # type: ignore[return-value]


def norm_summary(t: torch.Tensor, norm: float) -> Summary:
    """A summary holding just ``t``'s (finite) L2 norm."""
    t = local(t)
    return _summary(t, t.numel(), norm=norm, **_FINITE)
