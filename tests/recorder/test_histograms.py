"""Value histograms (``--histograms N``) recorded on the CPU path and on the deferred
(device) path, checked against numpy.histogram of the very tensors, as stored in the
same recording by ``--capture``."""

import runpy
import sys

import h5py
import numpy as np
import pytest
import torch
from torch import nn

from hookdbg.options import OptionError, RecordOptions
from hookdbg.read import open_recording
from hookdbg.recorder import Recorder, record
from hookdbg.recorder.summaries.deferred import ARENA, StepBatch
from hookdbg.recorder.summaries.histograms import HISTOGRAM
from tests.helpers import SAMPLES

BINS = 8


def record_sample(path, defer: bool, *argv: str) -> None:
    options = RecordOptions.build(quiet=True, histograms=BINS, capture=["*"])
    saved = sys.argv
    sys.argv = [str(SAMPLES / "nan_blowup.py"), *argv]
    try:
        with Recorder(path, options, defer_cpu=defer):
            runpy.run_path(str(SAMPLES / "nan_blowup.py"), run_name="__main__")
    finally:
        sys.argv = saved


def finite_counts(rows) -> np.ndarray:
    return rows["numel"] - rows["nan"] - rows["posinf"] - rows["neginf"]


@pytest.mark.parametrize("defer", [False, True], ids=["cpu", "deferred"])
def test_histograms_equal_numpy_of_the_recorded_tensors(tmp_path, defer):
    path = tmp_path / "run.h5"
    # NaN born in a forward at step 2: histograms of tensors holding NaN/inf too
    record_sample(path, defer, "--where", "forward", "--nan-step", "2", "--steps", "4")
    with open_recording(path) as rec:
        assert rec.histogram_bins == BINS
        rows = rec.tensors(
            columns=[
                "call",
                "step",
                "phase",
                "slot",
                "path",
                "numel",
                "nan",
                "posinf",
                "neginf",
                "min",
                "max",
                "histogram",
            ]
        )
        counts = rows["histogram"]
        assert counts.shape == (len(rows), BINS) and (counts >= 0).all()
        # every row with statistics: the counts add up to its finite values
        summarised = ~np.isnan(rows["min"]) | (finite_counts(rows) == 0)
        assert summarised.sum() > 0.9 * len(rows)
        np.testing.assert_array_equal(counts.sum(1)[summarised], finite_counts(rows)[summarised])
        keys = {
            (int(r["call"]), int(r["step"]), int(r["phase"]), int(r["slot"]), bytes(r["path"])): i
            for i, r in enumerate(rows)
        }
        compared = nonfinite = 0
        for capture in rec.captured():
            key = (capture.call, capture.step, capture.phase, capture.slot, capture.path.encode())
            values = rec.tensor(capture).astype(np.float64).ravel()
            finite = values[np.isfinite(values)]
            if key not in keys or not finite.size or finite.min() == finite.max():
                continue
            i = keys[key]
            want, edges = np.histogram(finite, bins=BINS)
            np.testing.assert_array_equal(counts[i], want, err_msg=str(capture))
            assert (rows["min"][i], rows["max"][i]) == (edges[0], edges[-1])
            compared += 1
            nonfinite += finite.size < values.size
        assert compared > 40 and nonfinite > 0


class Odd(nn.Module):
    """Outputs a constant, and a tensor with no finite value at all."""

    def forward(self, x):
        return torch.ones_like(x) * 3.0, x * float("nan")


@pytest.mark.parametrize("defer", [False, True], ids=["cpu", "deferred"])
def test_constant_and_non_finite_tensors(tmp_path, defer):
    path = tmp_path / "odd.h5"
    model = nn.Sequential(nn.Linear(4, 6), Odd())
    with Recorder(path, RecordOptions.build(quiet=True, histograms=5), defer_cpu=defer):
        for _ in range(2):
            model(torch.randn(3, 4))
    with open_recording(path) as rec:
        rows = rec.tensors(columns=["module", "slot", "path", "numel", "histogram"], kind=None)
        odd = rows[(rows["module"] == rec.modules.resolve("1").id) & (rows["slot"] == 1)]
        constant, nan = odd[odd["path"] == b"0"], odd[odd["path"] == b"1"]
        assert len(constant) == len(nan) == 2
        assert (constant["histogram"] == [0, 0, 18, 0, 0]).all()  # all in the middle bin
        assert (nan["histogram"] == 0).all()


def test_zero_cost_when_off_no_column_and_old_files_read(tmp_path):
    path = tmp_path / "plain.h5"
    with record(path, quiet=True) as recorder:
        nn.Linear(3, 3)(torch.randn(2, 3))
    assert recorder.observer.histogram_bins == 0
    with h5py.File(path) as f:
        assert "histogram" not in f["tensors"]
        assert "histograms" not in f.attrs["options"] or '"histograms": 0' in f.attrs["options"]
    old = SAMPLES.parent / "tests" / "data" / "nan_a.h5"
    for recording in (path, old):
        with open_recording(recording) as rec:
            assert rec.histogram_bins == 0
            assert len(rec.tensors(kind=None)) > 0


@pytest.mark.parametrize("bad", ["0", -1, 1025, 2.5, True, "abc"])
def test_bad_bin_counts_are_refused(bad):
    """(0 or None from Python means off; typed on the command line, "0" is refused.)"""
    with pytest.raises(OptionError, match="--histograms must be a whole number of bins"):
        RecordOptions.build(histograms=bad)


def test_histograms_need_stats():
    with pytest.raises(OptionError, match="needs --level stats"):
        RecordOptions.build(level="shapes", histograms=8)


def test_a_damaged_histogram_column_is_one_line(tmp_path):
    path = tmp_path / "run.h5"
    with record(path, quiet=True, histograms=4):
        nn.Linear(3, 3)(torch.randn(2, 3))
    with h5py.File(path, "a") as f:
        del f["tensors/histogram"]
        f["tensors"].create_dataset("histogram", data=np.zeros(3))  # 1-D, float
    from hookdbg.read import RecordingError

    with pytest.raises(RecordingError, match="tensors/histogram has shape"):
        open_recording(path)


def binned_in_one_batch(tensors: list[torch.Tensor], bins: int) -> list[tuple]:
    """The tensors' summaries from one ``StepBatch`` (added, launched, read), each
    histogram checked against numpy.histogram of the tensor's finite values."""
    batch = StepBatch(0, bins=bins)
    pending = [batch.add(t) for t in tensors]
    batch.launch()
    batch.read()
    for p, t in zip(pending, tensors, strict=True):
        values = t.double().numpy()
        counts = np.frombuffer(p.value[HISTOGRAM], dtype=np.int64)
        np.testing.assert_array_equal(counts, np.histogram(values[np.isfinite(values)], bins)[0])
    return [p.value for p in pending]


def test_a_tensor_larger_than_the_arena_is_binned_in_chunks():
    """The deferred path's tensors too large to copy (deferred.ARENA elements and up)."""
    g = torch.Generator().manual_seed(0)
    big = torch.randn(ARENA + 12345, generator=g)
    big[::1000] = float("inf")
    small = torch.rand(100, generator=g)
    summaries = binned_in_one_batch([big, small], 16)
    for summary, t in zip(summaries, (big, small), strict=True):
        values = t.double().numpy()
        finite = values[np.isfinite(values)]
        assert (summary[4], summary[5]) == (finite.min(), finite.max())  # finite min, max


def test_minus_infinity_in_the_first_segment_is_not_counted():
    """-inf's estimate fell below the first edge, to index -1: out of the counts (an
    IndexError on the CPU, a device-side assertion on a GPU) for the arena's first
    tensor or one binned on its own."""
    g = torch.Generator().manual_seed(1)
    first, big = torch.randn(100, generator=g), torch.randn(ARENA + 1, generator=g)
    first[[0, 50]] = float("-inf")
    big[[7, 8]] = torch.tensor([float("-inf"), float("nan")])
    binned_in_one_batch([first, big], 4)
