"""Every engine that summarises a tensor, against one float64 reference, on tensors
chosen to break them: the C pass (stats._one_pass), the torch fallback
(stats._torch_summary), the device path's arena (deferred.arena_stats) and its
tensor-at-a-time reductions (deferred.tensor_stats), and the two Triton kernels
(blockkernel.py, in Triton's interpreter on CPU tensors where there is no GPU): the one
over many tensors a launch that every held tensor goes through (table_stats), and the
one over a tensor at a time (block_stats, where histograms are asked for).

The contract for floating tensors: min and max exact; mean, population std (ddof 0)
and L2 norm within 1e-12 (relative) of numpy's on the values converted to float64,
over the finite values; the std of a constant tensor exactly 0; NaN, +inf and -inf
counted exactly, and the values equal to the finite min or max (``sat_frac``, a
fraction of all values), and the values below 0, -inf among them (``neg_frac``, a
fraction of all values, also where NaN or inf withhold the others); the mean of |x|
over the finite values (``absmean``) within 1e-12 as well. A mean may also be off by
1e-14 of the values' mean magnitude: where the values cancel to a mean near 0, no
float64 sum (numpy's neither) resolves it more finely. On the device path a tensor
holding NaN or inf gets its counts and no statistics (deferred.from_raw). A recording
must not depend on which engine made it: ``hookdbg diff`` compares them at 1e-5.

For integer and bool tensors (token ids, labels, masks; stats.INTEGER_CONTRACT): min
and max exact (the values converted to float64, a bool as 0 or 1), the fractions of
zeros (padding, a mask's False) and of values below 0 (an ignored label's -100) exact,
no NaN or inf; their mean, std, norm, absmean and
sat_frac are not measured (NaN), by every engine alike.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import numpy as np
import pytest
import torch

from hookdbg.recorder.summaries import blockstats, deferred, stats
from hookdbg.recorder.summaries.deferred import StepBatch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAN, INF = float("nan"), float("inf")
REL = 1e-12
MEAN_FLOOR = 1e-14  # of the mean magnitude, see the module docstring

Engine = Callable[[torch.Tensor, pytest.MonkeyPatch], stats.Summary]


def randn(n: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)


def with_values(t: torch.Tensor, at: dict[int, float]) -> torch.Tensor:
    t = t.clone()
    for i, value in at.items():
        t[i] = value
    return t


def cases() -> dict[str, torch.Tensor]:
    f64 = torch.float64
    mixed = randn(30_000, 1, f64)
    mixed[::3] *= 1e8
    mixed[1::3] *= 1e-8
    return {
        # the tensor: float32 sums put its mean off by 1e-5
        "mean 1e-3, 49152": randn(49_152, 2) + 1e-3,
        "1e7 + noise": 1e7 + randn(10_000, 3),
        "1e7 + noise float64": 1e7 + 0.1 * randn(10_000, 4, f64),
        "magnitude 1e30": 1e30 * randn(5_000, 5),
        "magnitude 1e100 float64": 1e100 * randn(3_000, 6, f64),
        "1e-8 next to 1e8": mixed.float(),
        "1e-8 next to 1e8 float64": mixed,
        "an outlier first": torch.cat([torch.tensor([1e8]), randn(20_000, 7)]),
        "a cluster, then another": torch.cat([torch.full((2_048,), 1e7), 1e-3 * randn(12_000, 8)]),
        "constant": torch.full((5_000,), 0.1),
        "constant float64": torch.full((3_000,), 1e7 + 0.1, dtype=f64),
        "one value": torch.tensor(-2.5),
        "two values": torch.tensor([1e7, 1e7 + 1]),
        **{f"{n} values": 2 + randn(n, n) for n in (15, 16, 17, 31, 33, 257)},
        **{f"{n} values offset": 1e4 + randn(n, n) for n in (2_047, 2_049, 8_191, 8_193, 16_385)},
        "float16": (300 + 10 * randn(3_000, 9)).half(),
        "float16, converted to float32 first": (randn(70_000, 10) - 2).half(),
        "bfloat16": (3_000 + 100 * randn(3_000, 11)).bfloat16(),
        "transposed": (5 + randn(4_000, 12)).view(40, 100).t(),
        "NaN and infinities": with_values(
            1e7 + randn(20_000, 13), {0: NAN, 7: NAN, 8_191: NAN, 8_192: NAN, 1: INF, 3: -INF}
        ),
        "NaN in float64": with_values(randn(3_000, 14, f64) - 7, {100: NAN, 2_999: -INF}),
        "all NaN": torch.full((100,), NAN),
        "one inf": torch.tensor([INF]),
        # saturated: a ReLU6's output, at 0 and at its cap; -0.0 counts as 0
        "ReLU6": torch.nn.functional.relu6(3 * randn(5_000, 15)),
        "ReLU6 float16": torch.nn.functional.relu6(3 * randn(3_000, 16)).half(),
        "-0.0 and 0.0 at the min": with_values(torch.rand(3_000) + 1, {5: -0.0, 900: 0.0}),
        "the max in every chunk": randn(9_000, 17).clamp(max=0.5),
        "subnormal float32": torch.tensor([1e-45, 2e-45, -1e-44, 0.0] * 500),
        "subnormal float64": torch.tensor([5e-324, 1e-310, -2e-320] * 700, dtype=f64),
        "subnormal float16": torch.tensor([6e-8, 1.2e-7, -6e-8] * 700).half(),
        "largest float32": with_values(randn(3_000, 18), {0: 3.4e38, 9: -3.4e38, 17: 3.4e38}),
        "largest float16": torch.tensor([65504.0, -65504.0, 1.0] * 600).half(),
        "tiny and huge float64": torch.tensor([1e-300, 1e150, -1e-300] * 700, dtype=f64),
        # a vanishing activation: what absmean is for
        "vanishing, 1e-30 float32": randn(5_000, 22) * 1e-30,
        "bfloat16 at its cap": torch.nn.functional.relu6(4 * randn(3_000, 19)).bfloat16(),
        "every other value": randn(8_000, 20)[::2],
        "a column of a matrix": (1 + randn(6_000, 21)).view(200, 30)[:, 3],
    }


CASES = cases()


def reference(t: torch.Tensor) -> dict[str, float]:
    """numpy's statistics of the values converted to float64, over the finite ones."""
    a = t.detach().cpu().double().numpy().ravel()
    finite = a[np.isfinite(a)]
    counts: dict[str, float] = {
        "nan": int(np.isnan(a).sum()),
        "posinf": int(np.isposinf(a).sum()),
        "neginf": int(np.isneginf(a).sum()),
        "neg_frac": np.count_nonzero(a < 0) / a.size,
    }
    if finite.size == 0:
        return counts
    counts["sat_frac"] = ((a == finite.min()) | (a == finite.max())).sum() / a.size
    constant = finite.min() == finite.max()  # numpy's float64 mean may round: std 1e-17
    return {
        **counts,
        "min": finite.min(),
        "max": finite.max(),
        "mean": finite.mean(),
        "std": 0.0 if constant else finite.std(),  # ddof 0
        "norm": np.linalg.norm(finite),
        "absmean": np.abs(finite).mean(),
    }


def host(t: torch.Tensor) -> torch.Tensor:
    return t.cpu()


def c_pass(t: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> stats.Summary:
    if stats._one_pass is None:
        pytest.skip("the C statistics pass is not built")
    return stats.summarise(host(t))


def torch_fallback(t: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> stats.Summary:
    return stats._torch_summary(host(t))


def on_device(t: torch.Tensor) -> stats.Summary:
    batch = StepBatch(0)
    pending = batch.add(t.to(DEVICE))
    batch.launch()
    batch.read()
    assert pending.value is not None
    return pending.value


def arena(t: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> stats.Summary:
    monkeypatch.setattr(blockstats, "KERNEL_DEVICES", frozenset())
    return on_device(t)


def tensor_at_a_time(t: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> stats.Summary:
    """deferred.tensor_stats: what a tensor too large for the arena gets without the
    kernel."""
    monkeypatch.setattr(blockstats, "KERNEL_DEVICES", frozenset())
    monkeypatch.setattr(deferred, "ARENA", 0)
    return on_device(t)


def _small_kernel_chunks(t: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    """At most 4 programs of about 4 chunks each (of 256 values at least), so that even
    small tensors cross chunk and program boundaries, and the interpreter (a few ms a
    chunk) is quick."""
    pytest.importorskip("triton")
    if DEVICE == "cpu":
        assert os.environ.get("TRITON_INTERPRET") == "1", "set before triton is imported"
    monkeypatch.setattr(blockstats, "KERNEL_DEVICES", frozenset({DEVICE}))
    monkeypatch.setattr(blockstats, "BLOCK", max(256, 1 << (t.numel() // 16).bit_length()))
    monkeypatch.setattr(blockstats, "PROGRAMS", 4)
    monkeypatch.setattr(blockstats, "TABLE_PROGRAMS", 4)


def table_kernel(t: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> stats.Summary:
    """The held tensor read in place by the kernel over a table of tensors."""
    _small_kernel_chunks(t, monkeypatch)
    if blockstats.address(t.to(DEVICE)) is None:
        pytest.skip("a sliced view: not the kernels' (the arena's, tested as such)")
    assert blockstats.readable(t.to(DEVICE))
    return on_device(t)


def triton_kernel(t: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> stats.Summary:
    """Every tensor through the kernel over one tensor, as with --histograms."""
    _small_kernel_chunks(t, monkeypatch)
    monkeypatch.setattr(blockstats, "LARGE", 0)
    monkeypatch.setattr(blockstats, "readable", lambda t: False)  # not the table's
    if blockstats.flat_input(t.to(DEVICE)) is None:
        pytest.skip("a sliced view: not the kernels' (the arena's, tested as such)")
    return on_device(t)


ENGINES: dict[str, tuple[Engine, bool]] = {  # the engine, and whether it is the device's
    "C": (c_pass, False),
    "torch": (torch_fallback, False),
    "arena": (arena, True),
    "tensor_stats": (tensor_at_a_time, True),
    "triton": (triton_kernel, True),
    "table": (table_kernel, True),
}


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the interpreter's numpy
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", CASES)
def test_every_engine_agrees_with_float64(case: str, engine: str, monkeypatch) -> None:
    t = CASES[case]
    run, on_the_device = ENGINES[engine]
    got = dict(zip(stats.FIELDS, run(t, monkeypatch), strict=False))
    want = reference(t)
    assert got["numel"] == t.numel()
    for key in ("nan", "posinf", "neginf", "neg_frac"):
        assert got[key] == want[key], (key, got[key], want[key])
    withheld = on_the_device and (want["nan"] or want["posinf"] or want["neginf"])
    if withheld or "min" not in want:  # no statistics: none, not zeros
        values = ("min", "max", "mean", "std", "norm", "sat_frac", "absmean")
        assert all(math.isnan(got[k]) for k in values), got
        return
    assert (got["min"], got["max"]) == (want["min"], want["max"])
    assert got["sat_frac"] == want["sat_frac"], ("sat_frac", got["sat_frac"], want["sat_frac"])
    floors = {"mean": MEAN_FLOOR * want["absmean"], "std": 0.0, "norm": 0.0, "absmean": 0.0}
    for key, floor in floors.items():
        if got[key] == want[key]:  # past the largest double's square root: inf, as numpy's
            continue
        error = abs(got[key] - want[key])
        assert error <= REL * abs(want[key]) + floor, (key, got[key], want[key])


def integer_cases() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(30)
    ids = torch.randint(0, 50_257, (6_000,), generator=g)
    ids[::7] = 0  # padding
    mask = torch.rand(70_000, generator=g) < 0.3
    return {
        "token ids with padding": ids,
        "int64 past 2**53": torch.tensor([2**62 + 1, -(2**62) - 3, 2**53 + 1, 0, 7] * 300),
        "int64 extremes": torch.tensor([2**63 - 1, -(2**63), 0] * 100),
        "labels int32": torch.randint(-3, 10, (5_000,), generator=g, dtype=torch.int32),
        "int16": torch.randint(-(2**15), 2**15, (3_000,), generator=g, dtype=torch.int16),
        "int8": torch.randint(-128, 128, (3_001,), generator=g, dtype=torch.int8),
        "uint8 at its cap": torch.full((2_049,), 255, dtype=torch.uint8),
        "bool mask": mask,
        "bool all False": torch.zeros(300, dtype=torch.bool),
        "bool one True": torch.tensor([True]),
        "one int": torch.tensor(-5),
        "a large int64 tensor": torch.randint(-9, 9, (70_001,), generator=g),
        "an int64 matrix transposed": ids.view(60, 100).t(),
        "every other id": ids[::2],
        "a column of a bool matrix": mask.view(700, 100)[:, 3],
    }


INTEGER_CASES = integer_cases()


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the interpreter's numpy
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", INTEGER_CASES)
def test_every_engine_follows_the_integer_contract(case: str, engine: str, monkeypatch) -> None:
    t = INTEGER_CASES[case]
    got = dict(zip(stats.FIELDS, ENGINES[engine][0](t, monkeypatch), strict=False))
    a = t.numpy().ravel().astype(np.float64)  # as the reference converts
    assert got["numel"] == t.numel() and (got["nan"], got["posinf"], got["neginf"]) == (0, 0, 0)
    assert (got["min"], got["max"]) == (a.min(), a.max())
    assert got["zero_frac"] == np.count_nonzero(a == 0) / a.size
    assert got["neg_frac"] == np.count_nonzero(a < 0) / a.size
    measured = set(stats.INTEGER_CONTRACT)
    assert measured == {"min", "max", "nan", "posinf", "neginf", "zero_frac", "neg_frac"}
    unmeasured = [k for k in stats.FIELDS[stats.MIN :] if k not in measured]
    assert all(math.isnan(got[k]) for k in unmeasured), {k: got[k] for k in unmeasured}


@pytest.mark.parametrize("engine", ["C", "torch"])
def test_empty_tensors_get_no_statistics_but_their_norm(engine: str, monkeypatch) -> None:
    """The device path never sees them (stats.has_stats); on the host they have no
    min, max, mean or std, nothing to count, and the norm of no values: 0."""
    empty = torch.empty(0, 3)
    assert not stats.has_stats(empty)
    got = dict(zip(stats.FIELDS, ENGINES[engine][0](empty, monkeypatch), strict=False))
    assert got["numel"] == 0 and (got["nan"], got["posinf"], got["neginf"]) == (0, 0, 0)
    assert all(math.isnan(got[k]) for k in ("min", "max", "mean", "std", "sat_frac"))
    assert got["norm"] == np.linalg.norm(np.empty(0)) == 0.0
