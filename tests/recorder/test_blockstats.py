"""The one-launch statistics of large device tensors (recorder/summaries/blockstats.py), checked
against float64 references. Without a GPU the Triton kernel runs in Triton's
interpreter on CPU tensors (tests/conftest.py sets ``TRITON_INTERPRET=1``), with small
chunks so that each tensor takes a fraction of a second; with one, on CUDA tensors."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes

from hookdbg.options import RecordOptions
from hookdbg.recorder import Recorder
from hookdbg.recorder.summaries import blockstats, deferred, stats
from hookdbg.recorder.summaries.deferred import StepBatch
from hookdbg.recorder.summaries.histograms import HISTOGRAM
from hookdbg.store import summary as layout
from hookdbg.store.schema import CHANGED_IN_PLACE
from tests.helpers import ROOT, tables
from tests.recorder.test_deferred import KernelCounter, counted_training

pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INF, NAN = float("inf"), float("nan")


@pytest.fixture(autouse=True)
def kernel(monkeypatch):
    """The kernel on this machine's device, over few programs of a few chunks each."""
    if DEVICE == "cpu":
        assert os.environ.get("TRITON_INTERPRET") == "1", "set before triton is imported"
    monkeypatch.setattr(blockstats, "KERNEL_DEVICES", frozenset({DEVICE}))
    monkeypatch.setattr(blockstats, "BLOCK", 2048)
    monkeypatch.setattr(blockstats, "PROGRAMS", 4)
    monkeypatch.setattr(blockstats, "LARGE", 4096)


def raw_rows(tensors: list[torch.Tensor]) -> torch.Tensor:
    partials = blockstats.Partials(tensors[0].device)
    for t in tensors:
        assert partials.add(blockstats.flat_input(t))
    return partials.combine().cpu()


def randn(*shape: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(DEVICE, dtype)


def test_split_reads_every_element_once_in_whole_chunks():
    for numel in (1, 4095, 4096, 4097, 2048 * 4 * 3 + 1, 10**6 + 3):
        programs, per_program = blockstats.split(numel)
        assert per_program % blockstats.BLOCK == 0 and programs <= blockstats.PROGRAMS
        assert (programs - 1) * per_program < numel <= programs * per_program


def test_the_kernel_reads_dense_layouts_in_place_and_not_strided_views():
    x = randn(4, 8, 32, 33)
    for dense in (x, x.transpose(1, 3), x.to(memory_format=torch.channels_last)):
        flat = blockstats.flat_input(dense)
        assert flat is not None and flat.untyped_storage().data_ptr() == (
            dense.untyped_storage().data_ptr()
        )
        assert torch.equal(flat.sort().values, dense.flatten().sort().values)
    assert blockstats.flat_input(x[:, :, ::2]) is None
    assert blockstats.flat_input(randn(1, 8000).expand(3, 8000)) is None
    ids = x.to(torch.int32)
    assert blockstats.flat_input(ids).data_ptr() == ids.data_ptr()  # integers too
    mask = x > 0
    assert blockstats.flat_input(mask).dtype == torch.uint8  # a bool's bytes
    assert blockstats.flat_input(x.to(torch.complex64)) is None
    assert blockstats.flat_input(nn.Parameter(x)) is None  # a subclass: torch's ops


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_statistics_match_float64(dtype):
    """Sizes that are no multiple of the chunk; a large mean (two passes needed)."""
    tensors = [
        randn(100_003, seed=1, dtype=dtype) * 3 + 1000,
        randn(77, 129, seed=2, dtype=dtype).t(),  # dense but transposed
        -(randn(9001, seed=3, dtype=dtype).abs() + 1),  # all < 0: a masked lane is no max
        randn(5000, seed=4, dtype=dtype).abs() + 1,  # all > 0: nor a min
    ]
    tensors[0][::97] = 0
    for row, t in zip(raw_rows(tensors).tolist(), tensors, strict=True):
        got = dict(zip(blockstats.RAW, row, strict=True))
        want = dict(zip(blockstats.RAW, deferred.exact_row(t), strict=True))
        summed = ("sum", "m2", "abssum")
        exact = [name for name in blockstats.RAW if name not in summed]  # range, counts
        assert [got[k] for k in exact] == [want[k] for k in exact]
        assert got["sum"] == pytest.approx(want["sum"], rel=1e-12, abs=1e-9)
        assert got["m2"] == pytest.approx(want["m2"], rel=1e-10)
        assert got["abssum"] == pytest.approx(want["abssum"], rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_one_launch_over_many_tensors_matches_float64(dtype):
    """The table kernel: tensors of one dtype, of any size and dense layout, read in one
    launch through their addresses, each its own row."""
    tensors = [
        randn(100_003, seed=1, dtype=dtype) * 3 + 1000,
        randn(77, 129, seed=2, dtype=dtype).t(),  # dense but transposed
        -(randn(9001, seed=3, dtype=dtype).abs() + 1),  # all < 0: a masked lane is no max
        randn(5000, seed=4, dtype=dtype).abs() + 1,  # all > 0: nor a min
        randn(1, seed=5, dtype=dtype),
        randn(3, 5, 7, seed=6, dtype=dtype).to(memory_format=torch.contiguous_format),
    ]
    tensors[0][::97] = 0
    batch = StepBatch(0)
    pending = [batch.add(t) for t in tensors]
    batch.launch()
    batch.read()
    assert len({p.group for p in pending}) == 1  # one combine for all of them
    for p, t in zip(pending, tensors, strict=True):
        want = deferred.from_raw(p.meta, deferred.exact_row(t))
        got = p.value
        assert got[stats.MIN : stats.MAX + 1] == want[stats.MIN : stats.MAX + 1]
        absmean = layout.at("absmean")
        assert got[stats.NAN : absmean] == want[stats.NAN : absmean]
        assert got[absmean + 1 :] == want[absmean + 1 :]
        assert got[absmean] == pytest.approx(want[absmean], rel=1e-12)
        assert got[stats.MEAN] == pytest.approx(want[stats.MEAN], rel=1e-12, abs=1e-12)
        assert got[stats.STD] == pytest.approx(want[stats.STD], rel=1e-10, abs=1e-12)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the interpreter's numpy
def test_nan_and_infinities_are_counted_exactly_and_stats_withheld():
    t = randn(20_000, seed=5)
    t[[0, 7, 4095, 4096, 19_999]] = NAN  # first, chunk edges, the last element
    t[[1, 2048, 8191]] = INF
    t[[3, 12_000]] = -INF
    t[100:300] = 0
    [row] = raw_rows([t]).tolist()
    got = dict(zip(blockstats.RAW, row, strict=True))
    assert [got[k] for k in ("nan", "posinf", "neginf", "zeros")] == [5, 3, 2, 200]
    assert (got["min"], got["max"]) == (-INF, INF)  # NaN is no min or max
    summary = deferred.from_raw(((20_000,), "float32", DEVICE, 20_000), row)
    assert summary[stats.NAN : stats.NEGINF + 1] == (5, 3, 2)
    assert all(math.isnan(summary[i]) for i in (stats.MIN, stats.MAX, stats.MEAN, stats.STD))


def summaries(tensors: list[torch.Tensor], bins: int = 0) -> tuple[list[tuple], StepBatch]:
    batch = StepBatch(0, bins)
    pending = [batch.add(t) for t in tensors]
    batch.launch()
    batch.read()
    return [p.value for p in pending], batch


def a_mixed_step() -> list[torch.Tensor]:
    """Large tensors between small ones, and one view the kernel does not read."""
    g = torch.Generator().manual_seed(6)
    with_nan = randn(30_000, seed=7)
    with_nan[123] = NAN
    return [
        randn(10, 10, seed=8),
        randn(25_000, seed=9) * 10 - 3,
        randn(3000, seed=10).half(),
        randn(60, 200, seed=11)[:, ::2],  # strided: not read by the kernel
        with_nan,
        torch.rand(64, generator=g).to(DEVICE),
        randn(16, 40, 40, seed=12).bfloat16(),
        randn(5, seed=13, dtype=torch.float64),
        randn(8192, seed=14) + 1e4,
    ]


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_a_step_of_large_and_small_tensors_gives_each_its_own_row(monkeypatch):
    """Four dtypes, each read by one launch over all its tensors, and a strided view
    summarised alone: every Pending gets its own tensor's row back."""
    monkeypatch.setattr(deferred, "ARENA", 3050)
    tensors = a_mixed_step()
    by_kernel = [blockstats.address(t) is not None for t in tensors]
    got, batch = summaries(tensors)
    assert len({p.group for p in batch.pending}) == 1 + 1  # + the strided one, alone
    monkeypatch.setattr(blockstats, "KERNEL_DEVICES", frozenset())
    want, _ = summaries(tensors)
    for g, w, t, kernel in zip(got, want, tensors, by_kernel, strict=True):
        assert g[: stats.MIN] == w[: stats.MIN]
        # the torch ops take float32 deviations of tensors too large for the arena
        assert g[stats.MIN :] == pytest.approx(w[stats.MIN :], rel=1e-6, nan_ok=True), t.shape
        exact = t.double()
        if kernel and not exact.isnan().any():
            assert g[stats.MEAN] == pytest.approx(exact.mean().item(), rel=1e-12, abs=1e-12)
            assert g[stats.STD] == pytest.approx(exact.std(correction=0).item(), rel=1e-10)
    assert sum(by_kernel) == 8


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_histograms_of_large_tensors_travel_with_their_rows():
    tensors = a_mixed_step()
    got, _ = summaries(tensors, bins=16)
    for summary, t in zip(got, tensors, strict=True):
        values = t.double().cpu().numpy().ravel()
        finite = values[np.isfinite(values)]
        counts = np.frombuffer(summary[HISTOGRAM], dtype=np.int64)
        np.testing.assert_array_equal(counts, np.histogram(finite, bins=16)[0])


class CountedKernel:
    """The kernel, counting its launches and hiding the interpreter's own torch ops."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.launches = 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches += 1
            with _disable_current_modes():
                self.kernel[grid](*args, **kwargs)

        return launch


def test_no_torch_op_per_tensor_and_a_launch_per_dtype_per_flush(monkeypatch):
    """A tensor is held at its hook, not copied: ``add`` issues no torch op. A flush
    launches the kernel once per dtype and a fixed number of torch ops however many
    tensors it summarises."""
    kernel = CountedKernel(blockstats._table_kernel())
    monkeypatch.setattr(blockstats, "_table_kernel", lambda: kernel)

    def count(tensors: list[torch.Tensor]) -> tuple[int, int, int]:
        batch, adding, flushing = StepBatch(0), KernelCounter(), KernelCounter()
        launches = kernel.launches
        with adding:
            for t in tensors:
                batch.add(t)
        with flushing:
            batch.launch()
        return adding.count, flushing.count, kernel.launches - launches

    few = [randn(5000 + i, seed=i) for i in range(2)] + [randn(7, dtype=torch.float16)]
    many = [randn(50 * i + 1, seed=i) for i in range(40)] + [randn(9, dtype=torch.float16)]
    assert count(few)[::2] == count(many)[::2] == (0, 2)
    assert count(few)[1] == count(many)[1]


def test_a_tensor_changed_in_place_says_so_and_is_copied_from_then_on():
    """Its version moved between its hook and the flush: its summary is withheld (counts
    of -1), and the next batch copies the tensor in that place at its hook."""
    learned: dict[int, tuple] = {}
    t, kept = randn(3000, seed=1), randn(100, seed=2)
    for step in range(2):
        batch = StepBatch(step, 0, learned)
        changed, same = batch.add(t), batch.add(kept)
        t.mul_(2)  # as ReLU(inplace=True) after a batch norm's hook
        batch.launch()
        batch.read()
        assert same.value[stats.MEAN] == pytest.approx(kept.double().mean().item())
        if step == 0:
            assert changed.value[stats.NAN : stats.NEGINF + 1] == (CHANGED_IN_PLACE,) * 3
            assert math.isnan(changed.value[stats.STD]) and batch.changed == 1
            assert stats.is_finite(changed.value)  # nothing known: no alert
        else:  # copied at its hook: the values it had then
            assert changed.value[stats.MEAN] == pytest.approx(t.double().mean().item() / 2)
            assert batch.changed == 0


def test_held_tensors_are_summarised_early_past_the_budget(monkeypatch):
    monkeypatch.setattr(deferred, "HELD", 50_000)  # bytes
    batch = StepBatch(0)
    tensors = [randn(5000, seed=i) for i in range(6)]  # 20 kB each
    pending = []
    for i, t in enumerate(tensors):
        pending.append(batch.add(t))
        assert len(batch._held) == (i + 1) % 3  # summarised once 3 are held (60 kB)
    batch.launch()
    batch.read()
    for p, t in zip(pending, tensors, strict=True):
        assert p.value[stats.MEAN] == pytest.approx(t.double().mean().item(), rel=1e-12)


class Broken:
    """A kernel whose every launch fails, as on a GPU Triton cannot compile for."""

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            raise RuntimeError("no compiler for this GPU")

        return launch


def test_a_kernel_that_cannot_run_here_leaves_the_earlier_path(monkeypatch):
    tensors = a_mixed_step()
    monkeypatch.setattr(blockstats, "_kernel", Broken)
    monkeypatch.setattr(blockstats, "_table_kernel", Broken)
    with pytest.warns(RuntimeWarning, match="no compiler for this GPU"):
        got, _ = summaries(tensors)
    assert not blockstats.KERNEL_DEVICES  # off from then on
    monkeypatch.setattr(blockstats, "KERNEL_DEVICES", frozenset())
    np.testing.assert_equal(got, summaries(tensors)[0])


COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from hookdbg.recorder.summaries import blockstats
from hookdbg.recorder.summaries.blockkernel import TRITON_DTYPES, block_stats, table_stats

options = {"num_warps": blockstats.WARPS}
constants = {"BLOCK": blockstats.BLOCK, "COLUMNS": blockstats.COLUMNS}
for dtype in ("fp32", "fp16", "bf16", "fp64", "i64", "i32", "i16", "i8", "u8"):
    signature = {"x": "*" + dtype, "rows": "*fp64", "first_row": "i32", "numel": "i64",
                 "per_program": "i32", "BLOCK": "constexpr", "COLUMNS": "constexpr"}
    source = ASTSource(fn=block_stats, signature=signature, constexprs=constants)
    assert triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["cubin"]
for dtype in TRITON_DTYPES.values():
    signature = {"table": "*i64", "rows": "*fp64", "DTYPE": "constexpr", "BLOCK": "constexpr",
                 "COLUMNS": "constexpr"}
    source = ASTSource(fn=table_stats, signature=signature,
                       constexprs={**constants, "DTYPE": dtype})
    assert triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["cubin"]
"""


def test_the_kernel_compiles_for_an_h100():
    """What the interpreter does not check: the kernel's types, as the compiler sees
    them (sm_90, with Triton's own ptxas: no GPU needed)."""
    if "nvidia" not in __import__("triton").backends.backends:
        pytest.skip("this Triton has no CUDA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-c", COMPILE], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr


def record_convnet(path, options: RecordOptions, seed: int = 0) -> None:
    """Two steps of a small convnet whose activations (4 * 8 * 48 * 48 elements) and
    gradients are large enough for the kernels, recorded down the deferred path: the
    whole path, from the hooks to the file, of the kernels' end-to-end checks."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1), nn.Flatten()
    ).to(DEVICE)
    x = randn(4, 3, 48, 48, seed=seed) * 5 + 2
    with Recorder(path, options, defer_cpu=True):
        for _ in range(2):
            model(x).square().mean().backward()


def test_a_recording_says_the_same_with_and_without_the_kernel(tmp_path, monkeypatch):
    """A small convnet's large activations and gradients through the kernel give the
    rows the torch ops give."""

    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)  # the same twice

    def record(path, kernel_devices):
        monkeypatch.setattr(blockstats, "KERNEL_DEVICES", kernel_devices)
        record_convnet(path, RecordOptions.build(quiet=True))
        return tables(path)["tensors"]

    kernel = CountedKernel(blockstats._table_kernel())
    monkeypatch.setattr(blockstats, "_table_kernel", lambda: kernel)
    later = record(tmp_path / "kernel.h5", frozenset({DEVICE}))
    assert kernel.launches == 2  # once a step, at the end of its backward pass
    before = record(tmp_path / "before.h5", frozenset())
    assert len(later) == len(before)
    for name in ("step", "module", "phase", "slot", "numel", "nan", "posinf", "neginf"):
        np.testing.assert_array_equal(later[name], before[name])
    for name in ("min", "max", "mean", "std", "norm", "zero_frac"):
        np.testing.assert_allclose(later[name], before[name], rtol=1e-9, atol=1e-12)


def test_a_recorded_step_issues_a_fixed_number_of_torch_ops(tmp_path, monkeypatch):
    """The device path forced onto CPU tensors: a 48-layer MLP's steps summarise about
    400 tensors each, and cost no more torch ops than 0.05 per summarised tensor plus a
    fixed number per step (the flushes' reductions, the parameters' norms, the copy to
    the host), counted by a TorchDispatchMode."""
    kernel = CountedKernel(blockstats._table_kernel())
    monkeypatch.setattr(blockstats, "_table_kernel", lambda: kernel)

    plain, _ = counted_training(None, 4, layers=48, device=DEVICE)
    recorded, summarised = counted_training(tmp_path / "run.h5", 4, layers=48, device=DEVICE)
    assert summarised > 4 * 96 * 3  # inputs, outputs and gradients of 96 calls a step
    per_step = 40
    assert recorded - plain <= 0.05 * summarised + per_step * 4, (recorded - plain, summarised)
    assert kernel.launches == 2 * 4  # the gradients after backward, the parameters' values


def test_combine_adds_up_every_summed_column_of_the_programs():
    """A column declared summable (rawrow.SUMMED) is each tensor's programs' values
    added up, with no code of its own in combine."""
    g = torch.Generator().manual_seed(7)
    rows = torch.rand(5, blockstats.COLUMNS, generator=g, dtype=torch.float64) * 10
    rows[:, blockstats.PARTIAL.index("count")] = 4.0
    combined = blockstats.combine(rows, torch.tensor([2, 3]))
    for name in blockstats.SUMMED:
        column = rows[:, blockstats.PARTIAL.index(name)]
        want = [float(column[:2].sum()), float(column[2:].sum())]
        assert combined[:, blockstats.RAW.index(name)].tolist() == pytest.approx(want, rel=1e-15)
