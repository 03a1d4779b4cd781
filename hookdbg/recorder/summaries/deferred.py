"""Statistics of device tensors without waiting for the device, in few kernel launches.

On a GPU any ``.item()`` in a hook makes the CPU wait for every kernel queued so far,
and every torch op in a hook is a kernel launch the host pays for (5-10 us each,
whatever the tensor's size). So a device tensor seen by a hook is only copied, in one
launch, into the step's *arena*: a float64 buffer on its device (the copy converts the
dtype, and later in-place changes to the tensor cannot reach it). At the end of the
step, or when the arena is full, every tensor in it is summarised at once by segmented
reductions (``arena_stats``: min, max, sum, two-pass sum of squared deviations, NaN,
+inf, -inf and zero counts, sum of |x|, the sums in runs of at most ``RUN`` values), a fixed number
of launches however many tensors the step saw. A tensor of more than
``blockstats.LARGE`` elements is instead read once, in its own dtype, by one Triton
kernel launch that leaves a row of partial statistics per program; the flush combines
them, again in a fixed number of launches (blockstats.py).
Where that kernel does not apply (no Triton, a CPU tensor forced down this path, a
strided view, a tensor subclass) a tensor larger than the arena is summarised on its
own (``tensor_stats``), and a smaller one goes to the arena.

The step's raw rows come in groups, one per arena flush, per combined partials buffer
or per tensor summarised alone; each ``Pending`` holds its group and its place in it, so
the rows need not be in the order the hooks saw the tensors.

The step's statistics are then copied to pinned host memory in one non-blocking copy
with an event behind it, and read when that event has completed, normally a step
later, so the training thread never waits; then the step's rows are complete and its
NaN/inf checks are replayed in the order the hooks saw them. At the end of the
recording the last batches are waited for.

With ``--histograms N`` each segment's raw row has 2 + N more columns, binned at the
same flush (hookdbg/recorder/summaries/histograms.py) and read back with the rest; a large
tensor's are binned at hook time, by two more Triton kernel launches (blockhist.py).

What this costs: rows and alerts reach the file a step later, and an alert cannot stop
the script inside the hook that saw it. That is why ``--on-nan break`` and ``raise``
check each tensor at once instead (waiting on the device), and say so.
"""

from __future__ import annotations

import itertools
import math
from typing import final

import numpy as np
import torch

from hookdbg.recorder.summaries import blockstats, histograms, stats
from hookdbg.recorder.summaries.rawrow import RAW
from hookdbg.store.schema import CHANGED_IN_PLACE

# bytes of device tensors held for their statistics before they are summarised early;
# they stay alive until their kernel has run (about as many again at most)
HELD = 1 << 30
CHANGED = -1  # a Pending's group: its tensor changed in place before it was summarised
COPIED = -2  # a held tensor's version: a copy made at its hook, which nothing else changes
ARENA = 1 << 21  # float64 elements (16 MB): larger tensors are summarised on their own
# values summed one after another at most: torch's segment_reduce sums each segment in
# one run on the CPU, which is off by 7e-12 on 2M squares; runs of 1024, then the runs'
# sums (at most 2048 a segment), lose a thousand times less
RUN = 1024
_NAN = float("nan")
_FINITE = {"nan": 0, "posinf": 0, "neginf": 0}


@final  # no subclasses: ``type(x) is Pending`` tells a summary from one (mypy narrows it)
class Pending:
    """A summary still on the device; ``value`` is the summary tuple once read back."""

    __slots__ = ("group", "index", "meta", "value")

    def __init__(self, meta: tuple) -> None:
        self.group = 0  # which group of the step's raw rows holds its row
        self.index = 0  # its row in that group
        self.meta = meta
        self.value: stats.Summary | None = None


def resolved(summary: stats.Summary | Pending | None) -> stats.Summary | None:
    """The summary itself, whether it was computed at once or read back later."""
    return summary.value if type(summary) is Pending else summary


def exact_row(t: torch.Tensor) -> list[float]:
    """The raw row ``arena_stats`` gives one tensor, the slow and exact way (float64 from
    the start, two passes): what the arena and the kernels (blockstats.py) are checked
    against, by the tests and by benchmarks/blockstats.py on a GPU."""
    v = t.double().flatten()
    usable = v[~v.isnan()]
    row = {
        "min": usable.min().item(),
        "max": usable.max().item(),
        "sum": v.sum().item(),
        "m2": (v - v.mean()).square().sum().item(),
        "nan": v.isnan().sum().item(),
        "posinf": v.isposinf().sum().item(),
        "neginf": v.isneginf().sum().item(),
        "zeros": (v == 0).sum().item(),
        "sat": ((v == usable.min()) | (v == usable.max())).sum().item(),
        "abssum": v.abs().sum().item(),
        "negatives": (v < 0).sum().item(),
    }
    return [row[name] for name in RAW]


def runs(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Segments of these lengths cut into runs of at most ``RUN`` values: the runs'
    lengths, and how many runs each segment has (int64, on the host)."""
    sizes = np.asarray(lengths, dtype=np.int64)
    counts = -(-sizes // RUN)
    lengths_of_runs = np.full(int(counts.sum()), RUN, dtype=np.int64)
    some = counts > 0
    lengths_of_runs[np.cumsum(counts)[some] - 1] = sizes[some] - (counts[some] - 1) * RUN
    return torch.from_numpy(lengths_of_runs), torch.from_numpy(counts)


def arena_stats(values: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Raw statistics (one float64 row per segment, see ``from_raw``) of the
    consecutive segments of ``values`` with these lengths, in a fixed number of
    launches and without reading anything back. The sums follow the corrected
    two-pass algorithm: the deviations from the first mean sum to what its rounding
    lost, so that n * mean plus their sum is the sum (exact for a constant tensor,
    where a plain sum of 3000 copies of 1e7 + 0.1 is off by 5e-14), and their squares
    less the square of that sum over n are M2."""
    device = values.device
    n = torch.tensor(lengths, dtype=torch.int64).to(device, non_blocking=True)
    run_lengths, run_counts = (x.to(device, non_blocking=True) for x in runs(lengths))

    def per_segment(x: torch.Tensor, how: str) -> torch.Tensor:
        return torch.segment_reduce(x, how, lengths=n, unsafe=True)  # unsafe: no sync

    def summed(x: torch.Tensor) -> torch.Tensor:
        """Each segment's sum (of each column of ``x``), a run at a time."""
        of_runs = torch.segment_reduce(x, "sum", lengths=run_lengths, unsafe=True)
        return torch.segment_reduce(of_runs, "sum", lengths=run_counts, unsafe=True)

    total = summed(values)
    mean = total / n
    deviation = values - mean.repeat_interleave(n, output_size=values.numel())
    off, squares, absolute = summed(
        torch.stack([deviation, deviation.square(), values.abs()], dim=1)
    ).unbind(1)
    lo, hi = per_segment(values, "min"), per_segment(values, "max")
    at_ends = (values == lo.repeat_interleave(n, output_size=values.numel())) | (
        values == hi.repeat_interleave(n, output_size=values.numel())
    )
    row = {
        "min": lo,
        "max": hi,
        "sum": mean * n + off,
        "m2": squares - off.square() / n,
        "nan": per_segment(values.isnan().double(), "sum"),
        "posinf": per_segment(values.isposinf().double(), "sum"),
        "neginf": per_segment(values.isneginf().double(), "sum"),
        "zeros": per_segment((values == 0).double(), "sum"),
        "sat": per_segment(at_ends.double(), "sum"),
        "abssum": absolute,
        "negatives": per_segment((values < 0).double(), "sum"),
    }
    return torch.stack([row[name] for name in RAW], dim=1)


def tensor_stats(t: torch.Tensor) -> torch.Tensor:
    """The same row as ``arena_stats`` for one tensor too large to copy: its reductions
    read it in its own dtype and accumulate in float64 (torch's float64 sums: tree or
    cascade, exact to a few units in the last place). The deviations from the mean
    are float64 as well (in float32 they lose 1e-7 of the std): one temporary of 8
    bytes a value. Of an integer or bool tensor, only the columns its summary keeps
    (``stats.INTEGER_CONTRACT``: ``from_raw``), the others 0."""
    v = t.reshape(-1)
    n = v.numel()
    if not v.is_floating_point():
        v = v.view(torch.uint8) if v.dtype == torch.bool else v
        lo, hi = torch.aminmax(v)
        columns = dict.fromkeys(RAW, torch.zeros((), dtype=torch.float64, device=v.device))
        zeros, negatives = n - torch.count_nonzero(v), torch.count_nonzero(v < 0)
        columns |= {"min": lo, "max": hi, "zeros": zeros, "negatives": negatives}
        return torch.stack([columns[name].to(torch.float64) for name in RAW])[None]
    total = v.sum(dtype=torch.float64)
    lo, hi = torch.aminmax(v)
    mean = total / n
    centred = v.to(torch.float64, copy=True).sub_(mean)
    off = centred.sum()  # the corrections of ``arena_stats``
    row = {
        "min": lo,
        "max": hi,
        "sum": mean * n + off,
        "m2": centred.square_().sum() - off.square() / n,
        "nan": torch.isnan(v).sum(),
        "posinf": torch.isposinf(v).sum(),
        "neginf": torch.isneginf(v).sum(),
        "zeros": v.numel() - torch.count_nonzero(v),
        "sat": torch.count_nonzero((v == lo) | (v == hi)),
        "abssum": v.abs().sum(dtype=torch.float64),
        "negatives": torch.count_nonzero(v < 0),
    }
    return torch.stack([row[name].to(torch.float64) for name in RAW])[None]


def changed(meta: tuple, bins: int) -> tuple:
    """The summary of a tensor changed in place between its hook and its statistics:
    nothing is known of its values then (NaN statistics, counts CHANGED_IN_PLACE)."""
    gone = CHANGED_IN_PLACE
    summary = (*meta, *stats.values(nan=gone, posinf=gone, neginf=gone))
    return (*summary, None) if bins else summary  # no histogram either


def from_raw(meta: tuple, raw: list[float]) -> tuple:
    """Turn one row of raw statistics (read back to the host) into a summary tuple;
    ``meta`` is (shape, dtype name, device name, numel). Unlike the CPU path, a tensor
    with non-finite values gets no min/max/mean/std/norm (not over its finite values).
    The std is the population std (ddof 0), exactly 0 for a constant tensor (whose M2
    may hold the rounding of its mean), as on the CPU path. An integer or bool tensor
    keeps what its contract measures (``stats.INTEGER_CONTRACT``)."""
    n = meta[stats.NUMEL]
    lo, hi, total, m2, nan, posinf, neginf, zeros, abssum, negatives, sat = raw  # RAW's names
    fractions = {"zero_frac": zeros / n, "neg_frac": negatives / n}
    if meta[stats.DTYPE] in stats.INTEGER_NAMES:
        return (*meta, *stats.values(min=lo, max=hi, **fractions, **_FINITE))
    if nan or posinf or neginf:
        lo = hi = mean = std = norm = sat = absmean = _NAN
    else:
        m2 = max(m2, 0.0)  # the correction term may take a rounding below 0
        mean = total / n
        std = 0.0 if lo == hi else math.sqrt(m2 / n)
        norm = math.sqrt(m2 + n * mean * mean)
        sat /= n
        absmean = abssum / n
    counts = {"nan": int(nan), "posinf": int(posinf), "neginf": int(neginf)}
    return (
        *meta,
        *stats.values(
            min=lo,
            max=hi,
            mean=mean,
            std=std,
            norm=norm,
            **counts,
            **fractions,
            sat_frac=sat,
            absmean=absmean,
        ),
    )


class StepBatch:
    """One step's device statistics, the rows waiting for them, and the checks to
    replay once they are read."""

    def __init__(self, step: int, bins: int = 0, learned: dict[int, tuple] | None = None) -> None:
        self.step = step
        self.bins = bins  # histogram bins per tensor (0: none)
        # the tensors copied at their hook: place in the step -> (shape, dtype); they were
        # changed in place before an earlier step's were summarised (shared by every
        # step's batch)
        self.learned: dict[int, tuple] = {} if learned is None else learned
        self.pending: list[Pending] = []
        self.rows: list[tuple] = []  # tensor rows holding Pending summaries
        self.checks: list[tuple] = []  # (function, args) in the order the hooks ran
        self.grad_finite: dict[int, bool] = {}  # this step's parameter gradients
        self.changed = 0  # tensors changed in place before they were summarised
        # the tensors waiting to be summarised: (tensor, its version then, its Pending,
        # its place in the step), and the bytes they hold
        self._held: list[tuple[torch.Tensor, int, Pending, int]] = []
        self._held_bytes = 0
        # the table kernel's partial rows: (rows, rows per tensor, the tensors' Pendings)
        self._tables: list[tuple[torch.Tensor, np.ndarray, list[Pending]]] = []
        self._unowned: list[torch.Tensor] = []  # summarised, kept alive until read back
        # raw statistics by group (None while the group fills), see the module docstring
        self._groups: list[torch.Tensor | None] = []
        self._arena: torch.Tensor | None = None
        self._arena_group = 0
        self._used = 0
        self._lengths: list[int] = []
        self._partials: blockstats.Partials | None = None
        self._partials_group = 0
        self._starts: list[int] = []  # each group's first row in the step's statistics
        self._host: torch.Tensor | None = None
        self._keep: torch.Tensor | None = None
        self._event: torch.cuda.Event | None = None

    def add(self, t: torch.Tensor, hold: bool = True) -> Pending:
        """Queue ``t``'s statistics, without waiting and without a torch op: ``t`` is
        held until ``summarise_held`` (at the end of a backward pass, of the step, or
        once the held tensors reach ``HELD`` bytes). A tensor without a version counter
        (an inference tensor), one whose place in the step was changed in place before
        an earlier step's summary, or one not to ``hold``, is copied now (one launch),
        and the copy held."""
        n = t.numel()
        kind = t.dtype
        shape, dtype = stats.shape_of(t), stats.dtype_name(kind)
        pending = Pending((shape, dtype, stats.device_name(t), n))
        place = len(self.pending)
        self.pending.append(pending)
        learned = self.learned
        try:  # an inference tensor has no version counter
            if hold and (place not in learned or learned[place] != (shape, dtype)):
                version = t._version
            else:
                version = COPIED
        except RuntimeError:
            version = COPIED
        if version == COPIED:
            with torch.no_grad():
                t = t.clone()
        self._held.append((t, version, pending, place))
        self._held_bytes += n * kind.itemsize
        if self._held_bytes > HELD:
            self.summarise_held()
        return pending

    def summarise_held(self) -> None:
        """Summarise the tensors held so far: those of one dtype that the kernel reads
        in one launch (blockstats.table_partials, combined with the step's others at its
        end), the others one by one. A tensor whose version moved since its hook was
        changed in place: its summary says so, and its place in the step is copied at
        its hook from the next step on."""
        held, self._held, self._held_bytes = self._held, [], 0
        if not held:
            return
        groups: dict[tuple[torch.dtype, int], list] = {}
        # no graph of the copies; at the end of a pass inside torch.func.grad, no wrappers
        with torch.no_grad(), stats.outside_transforms():
            for t, version, pending, place in held:
                if version != COPIED and t._version != version:
                    pending.group = CHANGED
                    self.changed += 1
                    self.learned[place] = pending.meta[:2]
                    continue
                members = groups.get((t.dtype, t.get_device()))
                if members is None:
                    members = groups[(t.dtype, t.get_device())] = []
                members.append((t, pending))
            for members in groups.values():
                if self.bins == 0 and blockstats.readable(members[0][0]):
                    members = self._summarise_table(members)
                for t, pending in members:
                    self.summarise_now(pending, t)
        # every read of them is queued: the script may let them go (a stream other than
        # the one reading them reuses their memory only once those reads have run; a
        # tensor whose memory the caching allocator does not own stays until read back)
        for t, _, _, _ in held:
            if t.is_cuda:
                try:
                    t.record_stream(torch.cuda.current_stream(t.device))
                except RuntimeError:
                    self._unowned.append(t)

    def _summarise_table(self, members: list[tuple[torch.Tensor, Pending]]) -> list:
        """One kernel launch over the tensors of ``members`` (of one dtype, on one device)
        whose elements fill one dense block; the others are returned."""
        read, left, addresses = [], [], []
        for t, pending in members:
            where = blockstats.address(t)
            if where is None:
                left.append((t, pending))
            elif where == 0:  # its memory was released: its values are gone
                pending.group = CHANGED
                self.changed += 1
            else:
                read.append(pending)
                addresses.append(where)
        if read:
            t = members[0][0]
            partials = blockstats.table_partials(
                t.device, t.dtype, addresses, [p.meta[stats.NUMEL] for p in read]
            )
            if partials is None:  # the kernel is off: one by one
                return members
            self._tables.append((*partials, read))
        return left

    def summarise_now(self, pending: Pending, t: torch.Tensor) -> None:
        """Queue ``t``'s statistics by its own launches now: one copy into the arena, or
        for a large tensor one kernel launch (three with its histogram)."""
        n = t.numel()
        if n > blockstats.LARGE:
            flat = blockstats.flat_input(t)
            if flat is not None and self._add_large(pending, t, flat):
                return
        if n > ARENA:
            raw = tensor_stats(t)
            if self.bins:
                raw = torch.cat([raw, self._large_histogram(t)], dim=1)
            pending.group = self._new_group()
            self._groups[pending.group] = raw
        else:
            self._add_to_arena(pending, t)

    def _new_group(self) -> int:
        self._groups.append(None)
        return len(self._groups) - 1

    def _add_to_arena(self, pending: Pending, t: torch.Tensor) -> None:
        n = t.numel()
        arena = self._arena
        if arena is not None and (self._used + n > ARENA or arena.device != t.device):
            self._reduce_arena()
            arena = None
        if arena is None:
            arena = self._arena = torch.empty(ARENA, dtype=torch.float64, device=t.device)
            self._arena_group = self._new_group()
        pending.group, pending.index = self._arena_group, len(self._lengths)
        if t.is_contiguous():  # one view op instead of a slice and a view
            arena.as_strided(t.shape, t.stride(), self._used).copy_(t)
        else:
            arena[self._used : self._used + n].view(t.shape).copy_(t)
        self._used += n
        self._lengths.append(n)

    def _add_large(self, pending: Pending, t: torch.Tensor, flat: torch.Tensor) -> bool:
        """One launch of the kernel over ``t`` (and two of blockhist.py's for its
        histogram); False where the statistics kernel cannot run here."""
        partials = self._partials
        if partials is not None and (partials.device != t.device or not partials.fits(t.numel())):
            self._combine_partials()
            partials = None
        if partials is None:
            partials = self._partials = blockstats.Partials(t.device)
        if not partials.add(flat):
            return False
        if len(partials) == 1:
            self._partials_group = self._new_group()
        pending.group, pending.index = self._partials_group, len(partials) - 1
        if self.bins:
            partials.extra.append(self._large_histogram(t))
        return True

    def _large_histogram(self, t: torch.Tensor) -> torch.Tensor:
        """A large tensor's histogram columns; an integer tensor's say it has none."""
        if t.is_floating_point():
            return histograms.large_histogram(t, self.bins, ARENA)
        return histograms.no_histogram(self.bins, t.device)

    def _reduce_arena(self) -> None:
        """Summarise the tensors in the arena; the next tensor starts a new one (the
        caching allocator reuses the memory once the reductions have run)."""
        if self._arena is not None and self._lengths:
            values = self._arena[: self._used]
            raw = arena_stats(values, self._lengths)
            if self.bins:
                raw = torch.cat(
                    [raw, histograms.arena_histograms(values, self._lengths, self.bins)], 1
                )
            self._groups[self._arena_group] = raw
        self._arena, self._used, self._lengths = None, 0, []

    def _combine_tables(self) -> None:
        """The raw rows of every tensor the table kernel read in this step, in a fixed
        number of torch ops (blockstats.combine) whatever the launches."""
        tables, self._tables = self._tables, []
        if not tables:
            return
        group = self._new_group()
        rows = torch.cat([rows for rows, _, _ in tables]) if len(tables) > 1 else tables[0][0]
        programs = np.concatenate([programs for _, programs, _ in tables])
        self._groups[group] = blockstats.combine(rows, torch.from_numpy(programs))
        for i, pending in enumerate(p for _, _, read in tables for p in read):
            pending.group, pending.index = group, i

    def _combine_partials(self) -> None:
        if self._partials is not None and len(self._partials):
            self._groups[self._partials_group] = self._partials.combine()
        self._partials = None

    def launch(self) -> None:
        """Start copying the step's statistics to the host, without waiting (from the
        next step's first hook, which may run inside torch.func's transforms)."""
        with stats.outside_transforms():
            self._launch()

    def settle(self) -> None:
        """Queue the statistics of every tensor added so far (after an optimizer step,
        while the device still runs it), so that ``launch`` has only the copy left."""
        with stats.outside_transforms():
            self.summarise_held()
            self._combine_tables()
            self._reduce_arena()
            self._combine_partials()

    def _launch(self) -> None:
        self.summarise_held()
        self._combine_tables()
        self._reduce_arena()
        self._combine_partials()
        groups = [g for g in self._groups if g is not None]
        assert len(groups) == len(self._groups), "a group of rows was never filled"
        self._groups = []
        if not groups:
            return
        self._starts = [0, *itertools.accumulate(g.shape[0] for g in groups[:-1])]
        device = groups[0].device
        raw = torch.cat([g.to(device) for g in groups])
        if raw.is_cuda:
            self._host = torch.empty(raw.shape, dtype=raw.dtype, pin_memory=True)
            self._host.copy_(raw, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
            self._keep = raw  # alive until the copy is done
        else:
            self._host = raw

    def ready(self) -> bool:
        return self._event is None or self._event.query()

    def read(self) -> None:
        """Fill in every Pending summary (waits for the copy if it is not done)."""
        with stats.outside_transforms():
            self._read()

    def _read(self) -> None:
        if self._event is not None:
            self._event.synchronize()
        if self._host is not None:
            starts = self._starts
            pending = self.pending
            if self.changed:
                for p in pending:
                    if p.group == CHANGED:
                        p.value = changed(p.meta, self.bins)
                pending = [p for p in pending if p.group != CHANGED]
            host = self._host.numpy()[[starts[p.group] + p.index for p in pending]]
            if self.bins:
                rows, extras = host[:, : len(RAW)].tolist(), host[:, len(RAW) :]
                integers = stats.INTEGER_NAMES
                for p, raw, extra in zip(pending, rows, extras, strict=True):
                    value = from_raw(p.meta, raw)
                    binned = p.meta[stats.DTYPE] not in integers  # as on the host: floats
                    p.value = histograms.with_histogram(value, extra) if binned else (*value, None)
            else:
                for p, raw in zip(pending, host.tolist(), strict=True):
                    p.value = from_raw(p.meta, raw)
        elif self.changed:  # every tensor of the step was changed
            for p in self.pending:
                p.value = changed(p.meta, self.bins)
        self._host = self._keep = self._event = None
        self._unowned = []

    def finished_rows(self) -> list[tuple]:
        """The step's tensor rows, with their summaries read back."""
        return [
            (*row[:-1], row[-1].value if type(row[-1]) is Pending else row[-1]) for row in self.rows
        ]
