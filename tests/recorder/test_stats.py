import math

import numpy as np
import pytest
import torch

from hookdbg.recorder.summaries import stats


def reference(t: torch.Tensor) -> dict[str, float]:
    a = t.detach().double().numpy().ravel()
    finite = a[np.isfinite(a)]
    return {
        "min": finite.min(),
        "max": finite.max(),
        "mean": finite.mean(),
        "std": finite.std(),
        "norm": np.linalg.norm(finite),
        "nan": int(np.isnan(a).sum()),
        "posinf": int(np.isposinf(a).sum()),
        "neginf": int(np.isneginf(a).sum()),
        "zero_frac": float((a == 0).mean()),
    }


def as_dict(summary: tuple) -> dict[str, object]:
    return dict(zip(stats.FIELDS, summary, strict=True))


@pytest.mark.parametrize("shape", [(1,), (7,), (64, 33), (3, 5, 16, 16)])
def test_summary_matches_numpy(shape):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(0)) * 3 + 1
    got, want = as_dict(stats.summarise(t)), reference(t)
    assert got["shape"] == shape and got["numel"] == t.numel() and got["dtype"] == "float32"
    assert got["device"] == "cpu"
    for key in ("min", "max", "mean", "std", "norm"):
        assert got[key] == pytest.approx(want[key], rel=1e-12), key
    assert (got["nan"], got["posinf"], got["neginf"]) == (0, 0, 0)


def test_std_is_exact_for_constants_and_scalars():
    assert as_dict(stats.summarise(torch.tensor(1.4225)))["std"] == 0.0
    assert as_dict(stats.summarise(torch.full((1000,), 0.1)))["std"] == 0.0
    # a large mean over a tiny spread: the one-pass shortcut would cancel to noise
    t = torch.randn(5000, generator=torch.Generator().manual_seed(1)) * 1e-3 + 100
    assert as_dict(stats.summarise(t))["std"] == pytest.approx(reference(t)["std"], rel=1e-12)


def test_nonfinite_counts_and_stats_over_finite_values():
    t = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 3.0, 0.0, float("nan")])
    got = as_dict(stats.summarise(t))
    assert (got["nan"], got["posinf"], got["neginf"]) == (2, 1, 1)
    assert (got["min"], got["max"], got["mean"]) == (0.0, 3.0, pytest.approx(4 / 3))
    assert not stats.is_finite(stats.summarise(t))
    assert stats.is_finite(stats.summarise(torch.ones(3)))


def test_all_nan_tensor():
    got = as_dict(stats.summarise(torch.full((4,), float("nan"))))
    assert got["nan"] == 4 and math.isnan(got["mean"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes(dtype):
    t = torch.linspace(-2, 2, 101).to(dtype)
    got = as_dict(stats.summarise(t))
    assert got["dtype"] == str(dtype).removeprefix("torch.")
    assert got["mean"] == pytest.approx(0.0, abs=1e-2) and got["max"] == pytest.approx(2.0)


def test_integer_tensors_get_their_range_and_empty_ones_shape_only():
    ints = as_dict(stats.summarise(torch.tensor([[3, 50_257], [7, 0]])))  # an id out of range
    assert ints["shape"] == (2, 2) and ints["dtype"] == "int64"
    assert (ints["min"], ints["max"]) == (0, 50_257) and ints["nan"] == ints["posinf"] == 0
    assert math.isnan(ints["mean"])
    mask = as_dict(stats.summarise(torch.tensor([True, False, False])))
    assert (mask["min"], mask["max"]) == (0, 1)
    empty = as_dict(stats.summarise(torch.empty(0, 3)))
    assert empty["numel"] == 0 and empty["nan"] == 0 and math.isnan(empty["min"])


def test_zero_fraction_exact_when_small_and_close_when_sampled():
    small = torch.relu(torch.randn(1000, generator=torch.Generator().manual_seed(2)))
    assert as_dict(stats.summarise(small))["zero_frac"] == pytest.approx(
        reference(small)["zero_frac"]
    )
    big = torch.relu(torch.randn(16, 64, 32, 32, generator=torch.Generator().manual_seed(3)))
    big[:, :8] = 0  # whole channels dead: a sample locked onto channels would miss them
    estimate = as_dict(stats.summarise(big))["zero_frac"]
    assert estimate == pytest.approx(reference(big)["zero_frac"], abs=0.03)


def test_non_contiguous_tensor():
    t = torch.randn(8, 6, generator=torch.Generator().manual_seed(4)).t()
    assert as_dict(stats.summarise(t))["mean"] == pytest.approx(reference(t)["mean"], abs=1e-6)


@pytest.mark.skipif(stats._norms is None, reason="the C statistics pass is not built")
def test_norms_of_cpu_parameters_in_c_and_the_rest_by_torch():
    g = torch.Generator().manual_seed(3)
    weights = {
        "float32": torch.randn(33, 17, generator=g),
        "large float32": torch.randn(40_000, generator=g),  # released the GIL
        "float64": torch.randn(9, dtype=torch.float64, generator=g),
        "bfloat16": torch.randn(12, generator=g).bfloat16(),
        "float16 whose norm float16 cannot hold": torch.full((4,), 60_000.0).half(),
        "a parameter": torch.nn.Parameter(torch.randn(5, generator=g)),
        "transposed": torch.randn(4, 6, generator=g).t(),  # not contiguous: torch's
        "empty": torch.zeros(0),
    }
    tensors = list(weights.values())
    read_in_c = stats._norms(tensors, stats.C_KINDS)
    assert [norm is None for norm in read_in_c] == [False] * 6 + [True, True]
    got = stats.norms_of(tensors)
    for (name, t), norm in zip(weights.items(), got, strict=True):
        want = np.linalg.norm(t.detach().double().numpy().ravel())
        assert norm == pytest.approx(want, rel=1e-6), name
    assert got[4] == pytest.approx(120_000.0)  # torch._foreach_norm says inf here


def test_norms_of_non_finite_weights_are_not_finite():
    nan, inf = float("nan"), float("inf")
    got = stats.norms_of([torch.tensor([1.0, nan]), torch.tensor([inf, 1.0]).half()])
    assert math.isnan(got[0]) and got[1] == inf


@pytest.mark.parametrize("n", [2, 100, stats.NUMPY_MAX, stats.NUMPY_MAX + 1])
def test_numpy_and_torch_paths_agree(n):
    t = torch.randn(n, generator=torch.Generator().manual_seed(6))
    t[::5] = 0
    got, want = as_dict(stats.summarise(t)), reference(t)
    for key in ("min", "max", "mean", "std", "norm"):
        assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-15), key
    sampled = n > stats.ZERO_SAMPLE  # and no aliasing with the every-5th pattern
    assert got["zero_frac"] == pytest.approx(want["zero_frac"], abs=0.03 if sampled else 1e-9)


def test_one_value_tensors_without_reductions():
    assert as_dict(stats.summarise(torch.tensor([[-2.5]])))["norm"] == 2.5
    inf = as_dict(stats.summarise(torch.tensor(float("-inf"))))
    assert (inf["nan"], inf["posinf"], inf["neginf"]) == (0, 0, 1)


def test_summaries_are_invisible_to_the_garbage_collector():
    import gc

    rows = [("row", stats.summarise(torch.randn(n))) for n in (1, 50, 20_000)]
    for _ in range(3):  # a tuple is untracked once those inside it are: a pass per level
        gc.collect()
    assert not any(gc.is_tracked(r) for r in rows)


def cases() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    spiky = torch.randn(70_000, generator=g)
    spiky[[5, 40_000]] = torch.tensor([float("nan"), float("-inf")])
    return [
        torch.randn(300, generator=g) * 1e-3 + 5e4,  # tiny spread, large mean
        torch.relu(torch.randn(128, 128, generator=g)),  # many exact zeros
        spiky,  # non-finite values in a large tensor (the block path and its redo)
        torch.randn(9, generator=g) * 1e19,  # squares overflow float32
        torch.full((5000,), float("-3.4e38")),  # an attention mask's finfo.min
        torch.randn(33, 17, generator=g).t(),  # not contiguous
        torch.randn(70_000, generator=g).to(torch.float16),  # half, converted first
        torch.randn(100, generator=g).to(torch.bfloat16),
        torch.randn(64, generator=g, dtype=torch.float64) * 1e30,
    ]


@pytest.mark.parametrize("t", cases(), ids=lambda t: f"{t.dtype}-{t.numel()}")
def test_one_pass_summary_matches_a_float64_reference(t):
    got, want = as_dict(stats.summarise(t)), reference(t)
    for key in ("min", "max", "mean", "std", "norm"):
        assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-15), key
    for key in ("nan", "posinf", "neginf"):
        assert got[key] == want[key], key
    assert got["zero_frac"] == pytest.approx(want["zero_frac"], abs=1e-9)


@pytest.mark.parametrize("t", cases(), ids=lambda t: f"{t.dtype}-{t.numel()}")
def test_the_torch_fallback_says_the_same(t):
    """Installs that could not build the C pass use torch's reductions: the same
    numbers (the zero fraction of large tensors is sampled there)."""
    fast, slow = as_dict(stats.summarise(t)), as_dict(stats._torch_summary(t))
    for key in ("min", "max", "mean", "std", "norm"):
        assert slow[key] == pytest.approx(fast[key], rel=1e-12, abs=1e-15), key
    for key in ("nan", "posinf", "neginf", "shape", "dtype", "numel"):
        assert slow[key] == fast[key], key
    assert slow["zero_frac"] == pytest.approx(fast["zero_frac"], abs=0.03)


def test_the_one_pass_extension_is_built():
    """CI builds it with the package; without it everything still works, slower."""
    assert stats._one_pass is not None


def test_values_not_looked_at_are_not_reported_as_zero():
    summary = stats.shape_only(torch.full((3,), float("nan")))
    assert summary[stats.NAN : stats.NEGINF + 1] == (-1, -1, -1)
    assert all(math.isnan(summary[i]) for i in range(stats.MIN, stats.NORM + 1))
    empty = stats.shape_only(torch.ones(0))  # an empty tensor: nothing to count, truly 0
    assert empty[stats.NAN : stats.NEGINF + 1] == (0, 0, 0)
