"""Histograms of large device tensors in two Triton launches (recorder/summaries/blockhist.py),
checked against numpy.histogram of the finite values and against the torch path they
replace (``histograms.tensor_histogram``), bin for bin. Without a GPU the kernels run
in Triton's interpreter on CPU tensors (tests/conftest.py sets ``TRITON_INTERPRET=1``),
with few programs of a few chunks each; with one, on CUDA tensors."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from hookdbg.options import RecordOptions
from hookdbg.read import open_recording
from hookdbg.recorder.summaries import blockhist, blockstats, deferred, histograms
from hookdbg.recorder.summaries.histograms import HISTOGRAM
from tests.helpers import ROOT
from tests.recorder.test_blockstats import (
    Broken,
    CountedKernel,
    a_mixed_step,
    randn,
    record_convnet,
    summaries,
)

pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INF, NAN = float("inf"), float("nan")
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


@pytest.fixture(autouse=True)
def kernels(monkeypatch):
    """Both kernel sets on this machine's device, over few programs of a few chunks."""
    if DEVICE == "cpu":
        assert os.environ.get("TRITON_INTERPRET") == "1", "set before triton is imported"
    for module in (blockhist, blockstats):
        monkeypatch.setattr(module, "KERNEL_DEVICES", frozenset({DEVICE}))
        monkeypatch.setattr(module, "BLOCK", 2048)
        monkeypatch.setattr(module, "PROGRAMS", 4)
    monkeypatch.setattr(blockstats, "LARGE", 4096)


def both(t: torch.Tensor, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernels' row and ``tensor_histogram``'s (small chunks: several per tensor)."""
    got = blockhist.histogram(t, bins)
    assert got is not None
    want = histograms.tensor_histogram(t, bins, 5000)
    return got.cpu().numpy(), want.cpu().numpy()


def check(t: torch.Tensor, bins: int) -> np.ndarray:
    """The row equals tensor_histogram's, and numpy's histogram of the finite values."""
    got, want = both(t, bins)
    assert got.shape == want.shape == (1, 2 + bins)
    np.testing.assert_array_equal(got, want)
    values = t.double().cpu().numpy().ravel()
    finite = values[np.isfinite(values)]
    counts, edges = np.histogram(finite, bins=bins)
    np.testing.assert_array_equal(got[0, 2:], counts)
    assert (got[0, 0], got[0, 1]) == (finite.min(), finite.max())
    if finite.min() < finite.max():  # (numpy widens a constant's range by 0.5 each way)
        assert (got[0, 0], got[0, 1]) == (edges[0], edges[-1])
    return got[0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bins", [1, 16, 1000])
def test_bins_equal_numpy_and_the_torch_path(dtype, bins):
    """Sizes that are no multiple of the chunk, several chunks per program, a large
    offset (bins narrow next to the values) and values all < 0."""
    check(randn(10_007, seed=1, dtype=dtype), bins)
    check(randn(2048 * 4 * 3 + 1, seed=2, dtype=dtype) * 3 + 100, bins)
    check(-(randn(4099, seed=3, dtype=dtype).abs() + 1), bins)


# (dtype, lo, hi, bins) found by a search: edges i * step + lo that the dtype holds
# exactly, and whose estimate (v - lo) / width * bins falls short of i, so that only the
# check against the edge puts them in their bin
ON_EDGES = [
    (torch.float32, 35.92446517944336, 40.2573356628418, 39),
    (torch.float16, -0.0099639892578125, 0.004337310791015625, 23),
    (torch.bfloat16, -0.05712890625, 0.05712890625, 26),
    (torch.float64, -14.935678399841803, 3.7476173839161158, 37),
]


@pytest.mark.parametrize(("dtype", "lo", "hi", "bins"), ON_EDGES)
def test_values_on_and_next_to_the_edges(dtype, lo, hi, bins):
    """numpy's edges (two roundings; hi last) as values where the dtype holds them,
    and the neighbours of every edge in the dtype: each on the right side."""
    edges = np.linspace(lo, hi, bins + 1)
    exact = edges[torch.from_numpy(edges).to(dtype).double().numpy() == edges]
    short = (exact - lo) / (hi - lo) * bins < np.searchsorted(edges, exact)
    assert short.any()  # the case the search found
    rounded = torch.from_numpy(edges).to(dtype)
    up = rounded.nextafter(torch.tensor(INF, dtype=dtype))
    down = rounded.nextafter(torch.tensor(-INF, dtype=dtype))
    values = torch.cat([torch.from_numpy(exact).to(dtype), rounded, up, down]).clamp(lo, hi)
    if dtype == torch.bfloat16 and DEVICE == "cpu":
        # Triton's interpreter widens bf16 subnormals to 0 (a GPU's cvt.f64.bf16 does not;
        # benchmarks/blockstats.py checks them there): no neighbours of 0 here
        values = values[(values == 0) | (values.abs() >= torch.finfo(dtype).tiny)]
    t = values.repeat(4200 // len(values) + 1).to(DEVICE)  # past one chunk
    t[[0, 1]] = torch.tensor([lo, hi], dtype=dtype, device=DEVICE)
    row = check(t, bins)
    assert row[2:].sum() == t.numel()
    # exact dyadic edges too: -2, -1.5, ..., 2 in 8 bins
    check(torch.linspace(-2, 2, 9, dtype=dtype).repeat(600).to(DEVICE), 8)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the interpreter's numpy
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_and_infinities_are_not_counted_nor_the_range(dtype):
    t = randn(20_000, seed=5, dtype=dtype)
    t[[0, 7, 4095, 4096, 19_999]] = NAN  # first, chunk edges, the last element
    t[[1, 2048, 8191]] = INF
    t[[3, 12_000]] = -INF
    row = check(t, 16)
    assert row[2:].sum() == 20_000 - 10 and np.isfinite(row[:2]).all()


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # 0 / 0: the estimate
def test_a_constant_tensor_is_in_the_middle_bin():
    t = torch.full((9000,), 3.0, device=DEVICE)
    t[[5, 6000]] = torch.tensor([NAN, -INF], device=DEVICE)
    for bins in (1, 4, 7):
        row = check(t, bins)
        assert row[0] == row[1] == 3.0 and row[2 + bins // 2] == 9000 - 2


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_a_tensor_without_finite_values_has_no_range_and_no_counts():
    t = torch.full((5000,), NAN, device=DEVICE)
    t[::3] = INF
    t[1::7] = -INF
    got, want = both(t, 8)
    np.testing.assert_array_equal(got, want)
    assert (got[0, 0], got[0, 1]) == (INF, -INF) and not got[0, 2:].any()
    raw = dict.fromkeys(blockstats.RAW, NAN) | {"nan": 1, "posinf": 1, "neginf": 1, "zeros": 0}
    summary = deferred.from_raw(((5000,), "float32", DEVICE, 5000), list(raw.values()))
    assert histograms.with_histogram(summary, got[0])[HISTOGRAM] is None  # lo > hi


def test_dense_layouts_are_read_in_place_and_others_left_to_torch(monkeypatch):
    x = randn(4, 8, 32, 33, seed=6)
    for dense in (x.transpose(1, 3), x.to(memory_format=torch.channels_last)):
        flat = blockhist.flat_input(dense)
        assert flat is not None and flat.data_ptr() == dense.data_ptr()
        np.testing.assert_array_equal(check(dense, 16), check(x, 16))
    assert blockhist.flat_input(x[:, :, ::2]) is None  # strided
    assert blockhist.flat_input(x.to(torch.int32)) is None
    assert blockhist.flat_input(nn.Parameter(x)) is None  # a subclass: torch's ops
    monkeypatch.setattr(blockhist, "KERNEL_DEVICES", frozenset())
    assert blockhist.histogram(x, 16) is None
    fallback = histograms.large_histogram(x, 16, 5000)
    np.testing.assert_array_equal(fallback.cpu(), histograms.tensor_histogram(x, 16, 5000).cpu())


class Launches(CountedKernel):
    """A kernel counting its launches and keeping their keyword arguments."""

    def __init__(self, kernel) -> None:
        super().__init__(kernel)
        self.options: list[dict] = []

    def __getitem__(self, grid):
        launch = super().__getitem__(grid)

        def keep(*args, **kwargs):
            self.options.append(kwargs)
            launch(*args, **kwargs)

        return keep


class TorchOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_two_launches_and_one_allocation_per_tensor(monkeypatch):
    finite_range, bin_values = (Launches(k) for k in blockhist._kernels())
    monkeypatch.setattr(blockhist, "_kernels", lambda: (finite_range, bin_values))
    t = randn(30_000, seed=7)
    with TorchOps() as torch_ops:
        row = blockhist.histogram(t, 32)
    assert torch_ops.ops == ["aten.empty.memory_format"]  # no fill, nothing read back
    assert finite_range.launches == bin_values.launches == 1
    assert bin_values.options[0]["enable_fp_fusion"] is False  # two roundings, as numpy
    np.testing.assert_array_equal(row.cpu(), histograms.tensor_histogram(t, 32, 5000).cpu())


def test_kernels_that_cannot_run_here_leave_the_torch_path(monkeypatch):
    monkeypatch.setattr(blockhist, "_kernels", lambda: (Broken(), Broken()))
    t = randn(30_000, seed=8)
    with pytest.warns(RuntimeWarning, match="histogram kernels failed.*no compiler"):
        row = histograms.large_histogram(t, 16, 5000)
    assert not blockhist.KERNEL_DEVICES  # off from then on
    np.testing.assert_array_equal(row.cpu(), histograms.tensor_histogram(t, 16, 5000).cpu())


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("stats_kernel", [True, False], ids=["blockstats", "torch-stats"])
def test_a_step_bins_the_same_with_and_without_the_kernels(monkeypatch, stats_kernel):
    """Large tensors among small ones, through ``StepBatch``: beside blockstats's
    launch, or (without it) summarised on their own past the arena."""
    if not stats_kernel:
        monkeypatch.setattr(blockstats, "KERNEL_DEVICES", frozenset())
        monkeypatch.setattr(deferred, "ARENA", 3050)
    tensors = a_mixed_step()
    real = blockhist._kernels()
    launches = Launches(real[1])
    monkeypatch.setattr(blockhist, "_kernels", lambda: (real[0], launches))
    got, _ = summaries(tensors, bins=16)
    assert launches.launches == 4  # the dense tensors past LARGE (and past ARENA)
    monkeypatch.setattr(blockhist, "KERNEL_DEVICES", frozenset())
    want, _ = summaries(tensors, bins=16)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_equal(g, w)  # the histogram, and the finite min and max
        assert len(g) > HISTOGRAM and g[HISTOGRAM] is not None


COLUMNS = ["step", "module", "phase", "slot", "numel", "histogram", "min", "max"]


def test_a_recording_has_the_same_histograms_with_and_without_the_kernels(tmp_path, monkeypatch):
    """The whole path, from the hooks to the file, with ``--histograms 16``."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)  # the same twice

    def record(path, kernel_devices):
        monkeypatch.setattr(blockhist, "KERNEL_DEVICES", kernel_devices)
        record_convnet(path, RecordOptions.build(quiet=True, histograms=16), seed=9)
        with open_recording(path) as rec:
            return rec.tensors(columns=COLUMNS, kind=None)

    real = blockhist._kernels()
    launches = Launches(real[1])
    monkeypatch.setattr(blockhist, "_kernels", lambda: (real[0], launches))
    later = record(tmp_path / "kernels.h5", frozenset({DEVICE}))
    assert launches.launches >= 8  # once per large tensor
    before = record(tmp_path / "before.h5", frozenset())
    assert len(later) == len(before) and later["histogram"].shape[1] == 16
    for name in COLUMNS:
        np.testing.assert_array_equal(later[name], before[name], err_msg=name)
    assert later["histogram"].sum() == later["numel"].sum()  # all finite, all counted


COMPILE = """
import re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from hookdbg.recorder.summaries import blockhist
from hookdbg.recorder.summaries.histkernel import bin_values, finite_range

target = GPUTarget("cuda", 90, 32)
options = {"num_warps": blockhist.WARPS}
for dtype in ("fp32", "fp16", "bf16", "fp64"):
    signature = {"x": "*" + dtype, "ranges": "*fp64", "counts": "*fp64", "numel": "i64",
                 "per_program": "i32", "bins": "i32", "BLOCK": "constexpr"}
    source = ASTSource(fn=finite_range, signature=signature,
                       constexprs={"BLOCK": blockhist.BLOCK})
    assert triton.compile(source, target=target, options=options).asm["cubin"]
for dtype, bins in (("fp32", 1), ("fp32", 1024), ("fp16", 16), ("bf16", 32), ("fp64", 1000)):
    signature = {"x": "*" + dtype, "ranges": "*fp64", "row": "*fp64", "numel": "i64",
                 "per_program": "i32", "programs": "i32", "BLOCK": "constexpr",
                 "RANGES": "constexpr", "BINS": "constexpr", "BINS_POW2": "constexpr"}
    constants = {"BLOCK": blockhist.BLOCK, "RANGES": blockhist.PROGRAMS, "BINS": bins,
                 "BINS_POW2": 1 << (bins - 1).bit_length()}
    source = ASTSource(fn=bin_values, signature=signature, constexprs=constants)
    compiled = triton.compile(
        source, target=target, options={**options, "enable_fp_fusion": False}
    )
    ptx = compiled.asm["ptx"]
    assert compiled.asm["cubin"] and "fma" not in ptx, (dtype, bins)
    assert bins == 1 or re.search(r"mul\\.rn\\.f64", ptx), (dtype, bins)
"""


def test_the_kernels_compile_for_an_h100_without_fused_multiply_adds():
    """What the interpreter does not check: the kernels' types as the compiler sees
    them (sm_90, Triton's own ptxas: no GPU needed), and that ``bin_values`` keeps each
    float64 multiply and add apart (``mul.rn``: ptxas may not fuse it either)."""
    if "nvidia" not in __import__("triton").backends.backends:
        pytest.skip("this Triton has no CUDA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-c", COMPILE], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
