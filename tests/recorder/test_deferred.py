"""Device statistics read back a step later (recorder/summaries/deferred.py), exercised on CPU:
``defer_cpu=True`` sends CPU tensors down the path CUDA tensors take, so a recording
made that way must say what an immediate one says."""

import contextlib
import json
import math
import runpy
import sys

import numpy as np
import pytest
import torch
import torchvision
from torch import nn
from torch.func import functional_call, grad, linearize, vmap
from torch.utils._python_dispatch import TorchDispatchMode

from hookdbg.options import RecordOptions
from hookdbg.read import open_recording
from hookdbg.recorder import NonFiniteStop, Recorder
from hookdbg.recorder.summaries import deferred, stats
from hookdbg.recorder.summaries.deferred import StepBatch
from hookdbg.store.schema import CHANGED_IN_PLACE, Slot
from tests.helpers import SAMPLES, hookdbg, module_names, tables

KEY = ("step", "module", "phase", "slot", "path")


def record_sample(path, argv, defer: bool, **options):
    recorder = Recorder(path, RecordOptions.build(quiet=True, **options), defer_cpu=defer)
    saved = sys.argv
    sys.argv = [str(SAMPLES / "nan_blowup.py"), *argv]
    try:
        with recorder:
            runpy.run_path(str(SAMPLES / "nan_blowup.py"), run_name="__main__")
    finally:
        sys.argv = saved
    return tables(path)


def by_key(rows: np.ndarray) -> dict[tuple, np.void]:
    keyed: dict[tuple, np.void] = {}
    for r in rows:
        keyed.setdefault(tuple(r[k] for k in KEY), r)  # first occurrence of each key
    return keyed


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_deferred_recording_says_what_an_immediate_one_says(tmp_path, where):
    argv = ["--where", where, "--nan-step", "2", "--steps", "4"]
    now = record_sample(tmp_path / "now.h5", argv, defer=False)
    later = record_sample(tmp_path / "later.h5", argv, defer=True)
    a, b = by_key(now["tensors"]), by_key(later["tensors"])
    assert a.keys() == b.keys() and len(now["tensors"]) == len(later["tensors"])
    for key, x in a.items():
        y = b[key]
        assert (x["nan"], x["posinf"], x["neginf"], x["shape"]) == (
            y["nan"],
            y["posinf"],
            y["neginf"],
            y["shape"],
        ), key
        if x["nan"] == 0 and x["posinf"] == 0 and x["neginf"] == 0 and x["slot"] != 5:
            for stat in ("min", "max", "mean", "std", "norm"):
                assert y[stat] == pytest.approx(x[stat], rel=1e-5, abs=1e-7), (key, stat)
    names = module_names(now)
    origins = {
        (names[int(r["module"])], int(r["phase"]), int(r["slot"]), int(r["step"]))
        for r in now["alerts"]
    }
    assert origins == {
        (names[int(r["module"])], int(r["phase"]), int(r["slot"]), int(r["step"]))
        for r in later["alerts"]
    }
    assert len(origins) == 1


def test_deferred_resnet18_matches_and_changes_no_gradient(tmp_path):
    """resnet18 changes tensors in place after their hooks (``ReLU(inplace=True)`` on a
    batch norm's output, ``out += identity``): in the first step those rows say so
    (counts of CHANGED_IN_PLACE, no statistics); from the next step on they are copied at their hook
    and every row says what the immediate path says."""

    def train(path, defer):
        torch.manual_seed(0)
        model = torchvision.models.resnet18(num_classes=10)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        x, y = torch.randn(2, 3, 32, 32), torch.tensor([1, 2])
        with Recorder(path, RecordOptions.build(quiet=True), defer_cpu=defer):
            for _ in range(3):
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
        return [p.detach().clone() for p in model.parameters()]

    now, later = train(tmp_path / "now.h5", False), train(tmp_path / "later.h5", True)
    assert all(torch.equal(p, q) for p, q in zip(now, later, strict=True))
    recorded = tables(tmp_path / "later.h5")
    a, b = tables(tmp_path / "now.h5")["tensors"], recorded["tensors"]
    assert len(a) == len(b)
    changed = b[b["nan"] == CHANGED_IN_PLACE]
    names = module_names(recorded)
    places = {(names[int(r["module"])].rsplit(".", 1)[-1], int(r["slot"])) for r in changed}
    assert set(changed["step"]) == {0} and len(changed) == 34  # 2 + 4 in each of 8 blocks
    assert places == {("bn1", Slot.OUTPUT), ("bn2", Slot.OUTPUT), ("relu", Slot.INPUT)}
    assert np.isnan(changed["std"]).all() and (changed["posinf"] == CHANGED_IN_PLACE).all()
    keep = b["nan"] != CHANGED_IN_PLACE
    a, b = a[keep], b[keep]
    finite = (a["slot"] != 5) & (a["nan"] == 0)  # param rows: norm-only vs full stats
    a, b = a[finite], b[finite]
    a, b = a[np.argsort(a["mean"])], b[np.argsort(b["mean"])]
    # float32 tensors: the host's SIMD float sums agree with float64 to ~1e-6 of the spread
    assert (np.abs(a["mean"] - b["mean"]) <= 1e-5 * a["std"] + 1e-7).all()
    np.testing.assert_allclose(np.sort(a["std"]), np.sort(b["std"]), rtol=1e-5, atol=1e-7)


def test_deferred_torch_func_transforms_match(tmp_path):
    """Under grad and vmap modules see wrappers: the device path reads the tensors
    under them, as the immediate path does."""

    def record(path, defer):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
        params = {k: v.detach() for k, v in model.named_parameters()}
        x, y = torch.randn(5, 6), torch.randn(5, 1)

        def loss(p, xb, yb):
            return (functional_call(model, p, (xb,)) - yb).pow(2).mean()

        with Recorder(path, RecordOptions.build(quiet=True), defer_cpu=defer):
            grad(loss)(params, x, y)
            vmap(grad(loss), in_dims=(None, 0, 0))(params, x[:, None], y[:, None])
        return tables(path)["tensors"]

    now, later = record(tmp_path / "now.h5", False), record(tmp_path / "later.h5", True)
    assert len(now) == len(later) >= 20 and {b"5,1,6", b"5,1,8"} <= set(now["shape"])
    a, b = by_key(now), by_key(later)
    assert a.keys() == b.keys()
    for key, x in a.items():
        assert x["shape"] == b[key]["shape"], key
        for stat in ("min", "max", "mean", "std"):
            assert b[key][stat] == pytest.approx(x[stat], rel=1e-5, abs=1e-7), (key, stat)


def test_stop_when_deferring_stops_at_the_next_step(tmp_path):
    model = nn.Sequential(nn.Linear(2, 2), nn.Tanh())
    recorder = Recorder(
        tmp_path / "run.h5", RecordOptions.build(on_nan="stop", quiet=True), defer_cpu=True
    )
    steps_run = 0
    with pytest.raises(NonFiniteStop, match="NaN first appeared in eval batch 1"), recorder:
        for step in range(5):
            x = torch.full((1, 2), float("nan")) if step == 1 else torch.ones(1, 2)
            with torch.no_grad():  # inference: each forward is an eval batch
                model(x)
            steps_run += 1
    assert steps_run == 2  # the check of step 1 ran when step 2 began
    t = tables(tmp_path / "run.h5")
    assert t["end"]["status"][0] == b"stopped" and len(t["alerts"]) == 1


def test_checks_queued_for_later_hold_no_tensors(tmp_path):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    recorder = Recorder(tmp_path / "run.h5", RecordOptions.build(quiet=True), defer_cpu=True)
    with recorder:
        model(torch.randn(3, 4)).sum().backward()
        batch = recorder.state.batch
        queued = [a for _, args in batch.checks for a in args]
        assert batch.checks and not any(isinstance(a, torch.Tensor) for a in queued)
        assert not any(
            isinstance(a, tuple) and any(isinstance(x, torch.Tensor) for x in a) for a in queued
        )


def arena_summaries(tensors: list[torch.Tensor]) -> list[tuple]:
    batch = StepBatch(0)
    pending = [batch.add(t) for t in tensors]
    batch.launch()
    batch.read()
    return [p.value for p in pending]


@pytest.mark.parametrize("arena", [deferred.ARENA, 1000])  # 1000: some too large to copy
def test_arena_statistics_match_the_host_summary(monkeypatch, arena):
    monkeypatch.setattr(deferred, "ARENA", arena)
    g = torch.Generator().manual_seed(3)
    with_zeros = torch.randn(3000, generator=g)
    with_zeros[::7] = 0
    tensors = [
        torch.randn(4, 5, generator=g) * 1e3 + 5e3,  # large mean: needs two passes
        torch.randn(64, 32, generator=g).t(),  # not contiguous
        torch.tensor(2.5),
        with_zeros,
        torch.randn(50, generator=g).half(),
        torch.randn(1200, generator=g, dtype=torch.float64),
    ]
    for got, t in zip(arena_summaries(tensors), tensors, strict=True):
        assert got[: stats.NUMEL + 1] == stats.summarise(t)[: stats.NUMEL + 1]
        exact = t.double()
        ends = (exact == exact.min()) | (exact == exact.max())
        want = {
            "min": exact.min().item(),
            "max": exact.max().item(),
            "mean": exact.mean().item(),
            "std": exact.std(correction=0).item(),
            "norm": exact.norm().item(),
            "nan": 0,
            "posinf": 0,
            "neginf": 0,
            "zero_frac": (exact == 0).double().mean().item(),
            "sat_frac": ends.double().mean().item(),
        }
        # in the arena: float64 throughout; too large for it: float32 deviations
        close = 1e-12 if t.numel() <= arena else 1e-7
        named = dict(zip(stats.FIELDS, got, strict=True))
        assert {k: named[k] for k in want} == pytest.approx(want, rel=close, abs=close)


def test_arena_counts_non_finite_values_and_keeps_them_apart():
    bad = torch.tensor([1.0, float("nan"), float("inf"), float("-inf"), float("-inf"), 0.0])
    good = torch.arange(4.0)
    first, second = arena_summaries([bad, good])
    assert first[stats.NAN : stats.NEGINF + 1] == (1, 1, 2)
    assert first[stats.ZERO_FRAC] == pytest.approx(1 / 6)
    assert all(math.isnan(first[i]) for i in (stats.MIN, stats.MEAN, stats.STD))
    assert second[stats.MIN : stats.NORM + 1] == pytest.approx(
        (0.0, 3.0, 1.5, math.sqrt(1.25), math.sqrt(14.0))
    )


class KernelCounter(TorchDispatchMode):
    """Counts the torch ops that would launch a kernel (views launch none)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.count += 1
        return func(*args, **(kwargs or {}))


def counted_training(path, steps: int, layers: int, device: str = "cpu") -> tuple[int, int]:
    """``steps`` of an MLP of ``layers`` Linear+Tanh pairs, recorded down the device path
    to ``path`` (None: not recorded): the torch ops that would launch a kernel, and the
    tensor rows recorded."""
    torch.manual_seed(0)
    model = nn.Sequential(*(m for _ in range(layers) for m in (nn.Linear(16, 16), nn.Tanh())))
    model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 16, device=device)
    recorder = Recorder(path, RecordOptions.build(quiet=True), defer_cpu=True) if path else None
    counter = KernelCounter()
    with recorder or contextlib.nullcontext(), counter:
        for _ in range(steps):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    return counter.count, 0 if path is None else len(tables(path)["tensors"])


def test_device_path_launches_at_most_two_kernels_per_tensor(tmp_path):
    plain, _ = counted_training(None, 6, layers=8)
    recorded, summarised = counted_training(tmp_path / "run.h5", 6, layers=8)
    per_step = 40  # the step's segmented reductions and its copy to the host
    assert summarised > 6 * 16 * 3  # inputs, outputs and gradients of 16 calls a step
    assert recorded - plain <= 2 * summarised + per_step * 6, (recorded - plain, summarised)


@pytest.mark.parametrize("histograms", [0, 8])
def test_parameters_of_modules_never_called_wait_for_the_device_like_the_rest(tmp_path, histograms):
    """A transformer layer uses its attention's out_proj weights without calling
    out_proj: their gradients' rows belong to no call, and on the device path their
    statistics wait for the step's read-back like every other row (handed to the
    writer before that, they stopped it)."""

    def train(path, defer: bool) -> list[tuple]:
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16)
        opt = torch.optim.SGD(layer.parameters(), lr=0.01)
        options = RecordOptions.build(quiet=True, histograms=histograms)
        with Recorder(path, options, defer_cpu=defer) as recorder:
            for _ in range(3):
                opt.zero_grad()
                layer(torch.randn(5, 2, 8)).pow(2).mean().backward()
                opt.step()
        assert recorder.write_error is None and recorder.dropped_rows == 0
        with open_recording(path) as rec:
            names = {m.id: m.name for m in rec.modules}
            rows = rec.tensors(columns=["step", "call", "module", "slot", "path"], kind=None)
        return sorted(
            (int(r["step"]), int(r["call"]), names[int(r["module"])], int(r["slot"]), r["path"])
            for r in rows
        )

    deferred_run, immediate = train(tmp_path / "d.h5", True), train(tmp_path / "i.h5", False)
    orphans = [r for r in immediate if r[1] == -1 and r[3] == Slot.PARAM_GRAD]
    assert any("out_proj" in name for _, _, name, _, _ in orphans)
    assert deferred_run == immediate


@pytest.mark.parametrize("defer", [False, True])
def test_what_linearize_traces_holds_nothing_of_hookdbg(tmp_path, defer):
    """linearize runs the model a second time under make_fx to build its graph: a trace,
    not a step, where any op hookdbg ran (the device path's copies) would be traced in
    and run again at every call of the function it returns."""

    def ops_of_jvp(recording):
        torch.manual_seed(0)
        linear = nn.Linear(16, 2)
        options = RecordOptions.build(quiet=True)
        with (
            Recorder(tmp_path / f"{defer}.h5", options, defer_cpu=defer)
            if recording
            else (contextlib.nullcontext())
        ):
            _, jvp = linearize(linear, torch.randn(2, 16))
        with KernelCounter() as counter:
            jvp(torch.ones(2, 16))
        return counter.count

    assert ops_of_jvp(True) == ops_of_jvp(False)
    assert len(tables(tmp_path / f"{defer}.h5")["tensors"]) > 0  # the run itself recorded


def test_reports_say_a_row_changed_in_place_before_its_statistics(tmp_path):
    """``show`` writes 'changed' where the counts are, with a note that says what it
    means, and its JSON says so per row."""
    path = tmp_path / "run.h5"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(inplace=True))
    with Recorder(path, RecordOptions.build(quiet=True), defer_cpu=True):
        for _ in range(2):
            model(torch.randn(4, 8)).sum().backward()
    out = hookdbg("show", path, "model.1", "--steps", "0")
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if " output " in line)
    assert "changed" in row and "changed in place between its hook and its statistics" in (
        " ".join(out.stdout.split())
    )
    rows = json.loads(hookdbg("show", path, "model.1", "--json").stdout)["rows"]
    flags = {(r["step"], r["slot"]): r["changed_in_place"] for r in rows if r["phase"] == "fwd"}
    assert flags == {
        (0, "input"): False,
        (0, "output"): True,
        (1, "input"): False,
        (1, "output"): False,
    }


class Masked(nn.Module):
    """Token ids and a bool padding mask in, as a language model takes them."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, ids, keep):
        return self.head(self.embed(ids) * keep.unsqueeze(-1)).sum()


@pytest.mark.parametrize("histograms", [0, 8])
def test_integer_and_bool_tensors_say_the_same_on_the_device_path(tmp_path, histograms):
    """Their range, zero fraction and counts of 0, nothing else and no histogram, on
    both paths (stats.INTEGER_CONTRACT)."""
    rows = {}
    for defer in (False, True):
        path = tmp_path / f"{defer}.h5"
        torch.manual_seed(0)
        model = Masked()
        ids = torch.randint(0, 50, (4, 6))
        ids[:, 4:] = 0  # padding
        options = RecordOptions.build(quiet=True, histograms=histograms)
        with Recorder(path, options, defer_cpu=defer):
            for _ in range(2):
                model(ids, ids != 0).backward()
        with open_recording(path) as rec:
            columns = [
                *(rec.tensors_table.dtype.names or ()),
                *(["histogram"] if histograms else []),
            ]
            t = rec.tensors(columns=columns)
        rows[defer] = t[np.isin(t["dtype"], [b"int64", b"bool"])]
    now, later = rows[False], rows[True]
    assert len(now) == len(later) == 2 * 3  # ids into the model and into embed, the mask
    for field in ("shape", "dtype", "min", "max", "nan", "posinf", "neginf", "zero_frac"):
        assert now[field].tolist() == later[field].tolist(), field
    ids_row = now[now["dtype"] == b"int64"][0]
    assert (ids_row["min"], ids_row["nan"]) == (0, 0) and ids_row["zero_frac"] >= 8 / 24
    for field in ("mean", "std", "norm", "sat_frac", "absmean"):
        assert np.isnan(later[field]).all() and np.isnan(now[field]).all(), field
    if histograms:
        assert not later["histogram"].any() and not now["histogram"].any()
