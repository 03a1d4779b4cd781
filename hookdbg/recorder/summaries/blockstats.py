"""Statistics of large device tensors in one kernel launch each, without waiting.

Why: deferred.py copies a small device tensor into the step's float64 arena (one
launch) and summarises the whole arena at its flush. A large tensor fills the arena (on
a 64x64 convnet the arena was flushed every two tensors, each flush a dozen launches) or,
past ``deferred.ARENA``, goes through ``tensor_stats``: a dozen torch kernels and about
ten passes over memory with temporaries as large as the tensor. On an H100 that path
makes a recorded step of resnet18 at 224x224 (batch 64) cost 13.8 times an unrecorded one.

How: a tensor of more than ``LARGE`` elements is read once, in its own dtype, by the
Triton kernel of blockkernel.py: at most ``PROGRAMS`` programs, each over a contiguous
range of whole ``BLOCK``-sized chunks. Each program writes one float64 row (min, max,
sum, M2 about its mean, NaN, +inf, -inf and zero counts, its element count, and the
sum of x - shift, the shift being the tensor's first value; rawrow.PARTIAL) into the step's
``Partials``, a buffer of ``CAPACITY`` rows on the device; a full one is combined and
another started. The kernel writes its own element counts, so that the host never
builds a list as long as the partials.

At the flush, ``Partials.combine`` turns each tensor's rows into the raw row that
``deferred.arena_stats`` makes, M2 by Chan's formula (the programs' M2 plus
n_p * (mean_p - mean)^2 for each, the means less the shift, so that no mean of 1e7
rounds away the spread of its noise), in a fixed number of launches however many
tensors it holds; from there on (``deferred.from_raw``) both kinds of row are one.

The kernel reads any tensor of a floating or integer dtype (a bool as its bytes) whose
elements fill one dense block of memory, whatever their order (contiguous,
channels_last, a transpose: the statistics do not depend on it); of an integer one
``from_raw`` keeps what stats.INTEGER_CONTRACT says. Elsewhere deferred.py summarises
with torch ops: without Triton, for tensors on devices not in ``KERNEL_DEVICES``
(CPU), for other dtypes (complex), for tensor subclasses, and
for expanded or sliced views (copying those first would cost what the torch ops cost).
The tests set ``KERNEL_DEVICES`` to ``{"cpu"}`` under ``TRITON_INTERPRET=1`` to check the
kernel's arithmetic in Triton's interpreter on machines without a GPU.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import TYPE_CHECKING

import numpy as np
import torch

from hookdbg.recorder.summaries.rawrow import PARTIAL as PARTIAL
from hookdbg.recorder.summaries.rawrow import RAW as RAW
from hookdbg.recorder.summaries.rawrow import SUMMED as SUMMED

if TYPE_CHECKING:
    from triton.runtime.jit import KernelInterface

LARGE = 1 << 16  # elements: device tensors larger than this are summarised by the kernel
BLOCK = 1024  # elements per chunk: exact two-pass statistics within one
WARPS = 8  # per program: 4 elements of a chunk per thread (92 registers on sm_90)
PROGRAMS = 1024  # at most, per tensor: a few per streaming multiprocessor, several times over
TABLE_PROGRAMS = 256  # at most, per tensor, in one launch over many (``summarise_table``)
CAPACITY = 1 << 16  # rows of partials (4.5 MB of float64) combined at once
COLUMNS = len(PARTIAL)
_P = {name: i for i, name in enumerate(PARTIAL)}
KERNEL_DEVICES = frozenset({"cuda"})  # device types whose tensors the kernel reads
DTYPES = frozenset(
    {torch.float16, torch.bfloat16, torch.float32, torch.float64}
    | {torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool}
)


@functools.cache
def _kernel() -> KernelInterface | None:
    """The Triton kernel, imported on first use; None where Triton is not installed."""
    try:
        from hookdbg.recorder.summaries.blockkernel import block_stats
    except ImportError:
        return None
    return block_stats


def _turn_off(error: Exception) -> None:
    global KERNEL_DEVICES
    KERNEL_DEVICES = frozenset()
    warnings.warn(
        f"hookdbg: the Triton statistics kernel failed ({error!r}); large tensors are "
        "summarised with torch's kernels from now on",
        RuntimeWarning,
        stacklevel=2,
    )


def flat_input(t: torch.Tensor) -> torch.Tensor | None:
    """The 1-D view of ``t`` the kernel reads, or None where the kernel does not apply
    (see the module docstring)."""
    if t.device.type not in KERNEL_DEVICES or _kernel() is None:
        return None
    return dense_view(t)


def dense_view(t: torch.Tensor) -> torch.Tensor | None:
    """``t``'s elements as a 1-D view in memory order, where they fill one dense block
    of memory and are of a dtype the kernels read; None otherwise. A view, never a
    copy. Tensor subclasses (DTensor, FakeTensor...) are left to torch's own ops: their
    ``data_ptr`` need not be the memory the values are in."""
    if t.dtype not in DTYPES or type(t) is not torch.Tensor:
        return None
    if t.dtype == torch.bool:  # its bytes, 0 or 1, are what the kernel reads
        t = t.view(torch.uint8)
    if t.is_contiguous():
        return t.view(-1)
    dense = t.permute(sorted(range(t.dim()), key=lambda d: t.stride(d), reverse=True))
    return dense.view(-1) if dense.is_contiguous() else None


def split(numel: int) -> tuple[int, int]:
    """(programs, elements per program) for a tensor of ``numel`` elements: whole
    chunks each, and no more than ``PROGRAMS`` programs."""
    return split_into(numel, BLOCK, PROGRAMS)


def split_into(numel: int, block: int, programs: int) -> tuple[int, int]:
    """``split`` with other chunk and program counts (blockhist.py's kernels)."""
    chunks = -(-numel // block)
    per_program = -(-chunks // programs) * block
    return -(-numel // per_program), per_program


class Partials:
    """The per-program rows of the large tensors summarised since it was started, on
    one device, and how many rows each tensor has."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.rows = torch.empty(
            max(CAPACITY, PROGRAMS), COLUMNS, dtype=torch.float64, device=device
        )
        self.used = 0
        self.programs: list[int] = []  # rows of each tensor, in the order added
        self.extra: list[torch.Tensor] = []  # columns appended to each tensor's row

    def __len__(self) -> int:
        return len(self.programs)

    def fits(self, numel: int) -> bool:
        return self.used + split(numel)[0] <= self.rows.shape[0]

    def add(self, flat: torch.Tensor) -> bool:
        """Launch the kernel over ``flat`` (from ``flat_input``), which must fit. False
        where Triton cannot build or launch it on this machine: the kernel is then off
        for the rest of the process, and deferred.py summarises with torch ops."""
        programs, per_program = split(flat.numel())
        kernel = _kernel()
        assert kernel is not None and self.used + programs <= self.rows.shape[0]
        # Triton launches on the current device (asking costs less than switching)
        index = flat.get_device()
        switch = index >= 0 and flat.is_cuda and index != torch.cuda.current_device()
        on_device = torch.cuda.device(index) if switch else contextlib.nullcontext()
        try:
            with on_device:
                kernel[(programs,)](
                    flat,
                    self.rows,
                    self.used,
                    flat.numel(),
                    per_program,
                    BLOCK=BLOCK,
                    COLUMNS=COLUMNS,
                    num_warps=WARPS,
                )
        except Exception as error:  # a compiler or driver that does not fit this machine
            _turn_off(error)
            return False
        self.used += programs
        self.programs.append(programs)
        return True

    def combine(self) -> torch.Tensor:
        """One raw row per tensor added ([tensors, RAW], as ``deferred.arena_stats``), in
        a fixed number of launches and without reading anything back."""
        raw = combine(self.rows[: self.used], torch.tensor(self.programs, dtype=torch.int64))
        return torch.cat([raw, torch.cat(self.extra)], dim=1) if self.extra else raw


def combine(rows: torch.Tensor, programs: torch.Tensor) -> torch.Tensor:
    """The raw row of each tensor ([tensors, RAW], as ``deferred.arena_stats``) from the
    partial rows of its programs, consecutive in ``rows``; ``programs`` (int64, on the
    host) says how many each tensor has. A fixed number of launches, no read back."""
    programs = programs.to(rows.device, non_blocking=True)

    def per_tensor(x: torch.Tensor, how: str) -> torch.Tensor:
        return torch.segment_reduce(x, how, lengths=programs, unsafe=True)  # no sync

    n, shifted = rows[:, _P["count"]], rows[:, _P["shifted"]]
    summed = {name: i - _P["sum"] for i, name in enumerate(PARTIAL) if i >= _P["sum"]}
    sums = per_tensor(rows[:, _P["sum"] :], "sum")  # the columns from ``sum`` on
    mean = sums[:, summed["shifted"]] / sums[:, summed["count"]]  # less the shift
    apart = shifted / n - mean.repeat_interleave(programs, output_size=rows.shape[0])
    m2 = sums[:, summed["m2"]] + per_tensor(n * apart.square(), "sum")
    out = {name: sums[:, summed[name]] for name in ("sum", *SUMMED)}
    lo, hi = per_tensor(rows[:, _P["min"]], "min"), per_tensor(rows[:, _P["max"]], "max")
    out.update(m2=m2, min=lo, max=hi)
    # the values at the tensor's ends: those of the programs whose ends are its own
    ends = {}
    for end, name, at in ((lo, "min", "at_min"), (hi, "max", "at_max")):
        each = end.repeat_interleave(programs, output_size=rows.shape[0])
        mine = torch.where(rows[:, _P[name]] == each, rows[:, _P[at]], 0.0)
        ends[at] = per_tensor(mine, "sum")
    both = ends["at_min"] + ends["at_max"]
    out["sat"] = torch.where(lo == hi, ends["at_min"], both)  # a constant's: counted once
    return torch.stack([out[name] for name in RAW], dim=1)


# -- many tensors in one launch ---------------------------------------------------------


@functools.cache
def _table_kernel() -> KernelInterface | None:
    try:
        from hookdbg.recorder.summaries.blockkernel import table_stats
    except ImportError:
        return None
    return table_stats


def readable(t: torch.Tensor) -> bool:
    """Whether ``summarise_table`` can read ``t`` where it is (its device and dtype; its
    layout is looked at when it is read: ``address``)."""
    return (
        t.dtype in DTYPES
        and t.device.type in KERNEL_DEVICES
        and type(t) in _PLAIN
        and _table_kernel() is not None
    )


# tensor types whose data_ptr is where their values are (not so for DTensor, FakeTensor)
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def address(t: torch.Tensor) -> int | None:
    """Where the first of ``t``'s elements is in memory, where they fill one dense block
    of it in any order (contiguous, channels_last, a transpose); None otherwise (an
    expanded or sliced view), and 0 where its memory was released (a storage resized
    to nothing). Read from its metadata alone: no torch op."""
    if not t.is_contiguous():
        expected = 1
        for stride, size in sorted(zip(t.stride(), t.shape, strict=True)):
            if size == 1:
                continue
            if stride != expected:
                return None
            expected *= size
    return int(t.data_ptr())


def table(addresses: list[int], numels: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The entries of ``table_stats``'s table for tensors at these addresses with these
    element counts (each cut into at most ``TABLE_PROGRAMS`` ranges of whole chunks),
    and how many entries each tensor has."""
    n = np.asarray(numels, dtype=np.int64)
    chunks = -(-n // BLOCK)
    per = -(-chunks // np.minimum(chunks, TABLE_PROGRAMS)) * BLOCK
    programs = -(-n // per)
    owner = np.repeat(np.arange(n.size), programs)
    first = np.cumsum(programs) - programs
    starts = (np.arange(owner.size) - first[owner]) * per[owner]
    ends = np.minimum(starts + per[owner], n[owner])
    where = np.asarray(addresses, dtype=np.uint64).astype(np.int64)
    return np.stack([where[owner], starts, ends], axis=1), programs


def table_partials(
    device: torch.device, dtype: torch.dtype, addresses: list[int], numels: list[int]
) -> tuple[torch.Tensor, np.ndarray] | None:
    """The partial rows of tensors of one dtype on one device, given by where they are
    and their element counts (none empty), from one kernel launch for all of them, and
    how many rows each tensor has: ``combine`` makes them raw rows ([tensors, RAW], as
    ``deferred.arena_stats``), for many launches at once. None where Triton cannot build
    or launch the kernel on this machine (then it is off for the rest of the process)."""
    kernel = _table_kernel()
    assert kernel is not None
    entries, programs = table(addresses, numels)
    rows = torch.empty(entries.shape[0], COLUMNS, dtype=torch.float64, device=device)
    where = torch.from_numpy(entries).to(device, non_blocking=True)
    index = device.index if device.type == "cuda" else None
    switch = index is not None and index != torch.cuda.current_device()
    try:
        with torch.cuda.device(index) if switch else contextlib.nullcontext():
            kernel[(entries.shape[0],)](
                where, rows, DTYPE=_triton_dtype(dtype), BLOCK=BLOCK, COLUMNS=COLUMNS,
                num_warps=WARPS,
            )  # fmt: skip
    except Exception as error:  # a compiler or driver that does not fit this machine
        _turn_off(error)
        return None
    return rows, programs


def _triton_dtype(dtype: torch.dtype) -> object:
    from hookdbg.recorder.summaries.blockkernel import TRITON_DTYPES

    return TRITON_DTYPES[dtype]
