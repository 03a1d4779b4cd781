"""Full tensors in the file: --capture and the flight recorder store what was computed."""

import runpy
import sys

import numpy as np
import torch
from torch import nn

import hookdbg
from hookdbg.read import open_recording
from hookdbg.store.schema import CaptureReason, Phase, Slot
from tests.helpers import SAMPLES
from tests.helpers import hookdbg as run_hookdbg


def reference_run(argv: list[str], module_type: str) -> list[dict[str, np.ndarray]]:
    """Run the NaN sample in this process without hookdbg, keeping the input and output
    of every call of one module type (a plain forward hook), one dict per call."""
    calls: list[dict[str, np.ndarray]] = []

    def keep(module, args, output):
        if type(module).__name__ == module_type:
            calls.append(
                {
                    "input": args[0].detach().clone().numpy(),
                    "output": output.detach().clone().numpy(),
                }
            )

    handle = nn.modules.module.register_module_forward_hook(keep)
    saved = sys.argv
    sys.argv = [str(SAMPLES / "nan_blowup.py"), *argv]
    try:
        runpy.run_path(str(SAMPLES / "nan_blowup.py"), run_name="__main__")
    finally:
        sys.argv = saved
        handle.remove()
    return calls


def test_flight_recorder_keeps_the_values_of_the_origin_step_and_the_one_before(tmp_path):
    args = ["--nan-step", "3", "--steps", "5"]
    out = run_hookdbg("record", "-o", tmp_path / "run.h5", SAMPLES / "nan_blowup.py", *args)
    assert out.returncode == 0, out.stderr
    assert "flight recorder: wrote" in out.stderr
    reference = reference_run(args, "Standardize")
    with open_recording(tmp_path / "run.h5") as rec:
        origin = rec.modules.resolve("standardize")
        stored = rec.captured(origin.id)
        assert {(c.step, c.label) for c in stored} == {
            (2, "input[0]"),
            (2, "output"),
            (3, "input[0]"),
            (3, "output"),
        }
        assert all(c.reason == CaptureReason.FLIGHT for c in stored)
        for c in stored:
            want = reference[c.step]["input" if c.slot == Slot.INPUT else "output"]
            np.testing.assert_array_equal(rec.tensor(c), want)  # NaNs in the same places
        assert np.isnan(
            rec.tensor(next(c for c in stored if c.step == 3 and c.slot == Slot.OUTPUT))
        ).any()


def test_explicit_capture_of_chosen_modules_and_steps(tmp_path):
    args = ["--nan-step", "9", "--steps", "4"]
    out = run_hookdbg(
        "record",
        "-o",
        tmp_path / "run.h5",
        "--capture",
        "proj",
        "--capture-steps",
        "1:3",
        SAMPLES / "nan_blowup.py",
        *args,
    )
    assert out.returncode == 0, out.stderr
    reference = reference_run(args, "Linear")  # proj, head, proj, head, ...
    with open_recording(tmp_path / "run.h5") as rec:
        proj = rec.modules.resolve("proj")
        stored = rec.captured()
        assert {c.module.name for c in stored} == {"model.proj"} and {c.step for c in stored} == {
            1,
            2,
        }
        labels = {(c.phase, c.label) for c in stored if c.step == 1}
        assert labels == {
            (Phase.FWD, "input[0]"),
            (Phase.FWD, "output"),
            (Phase.BWD, "grad_output"),
            (Phase.BWD, "param_grad[weight]"),
            (Phase.BWD, "param_grad[bias]"),
        }
        for step in (1, 2):
            got = {c.label: rec.tensor(c) for c in rec.captured(proj.id, step)}
            np.testing.assert_array_equal(got["input[0]"], reference[2 * step]["input"])
            np.testing.assert_array_equal(got["output"], reference[2 * step]["output"])


def test_capture_budget_too_small_for_one_tensor(tmp_path, capsys):
    model = nn.Linear(64, 64)
    with hookdbg.record(tmp_path / "run.h5", capture=["model"], capture_budget_mb=0.0001):
        model(torch.randn(4, 64))
    err = capsys.readouterr().err
    assert (
        "--capture-budget (104 B) cannot hold even one tensor (step 0, input[0] needs 1.0 kB)"
        in err
    )
    with open_recording(tmp_path / "run.h5") as rec:
        assert rec.captured() == []


def test_capture_budget_reached_part_way(tmp_path, capsys):
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU())
    with (
        hookdbg.record(tmp_path / "run.h5", capture=["model*"], capture_budget_mb=0.01),
        torch.no_grad(),
    ):
        model(torch.randn(4, 256))  # 4 KB per activation: two fit in 10 KB
    assert "--capture-budget (10.5 kB) reached at step 0" in capsys.readouterr().err
    with open_recording(tmp_path / "run.h5") as rec:
        assert 1 <= len(rec.captured()) <= 2


def test_flight_recorder_leaves_out_tensors_changed_in_place(tmp_path, capsys):
    class Explode(nn.Module):
        def forward(self, x):
            return x / 0.0  # inf (or NaN where x is 0)

    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True), Explode())
    with hookdbg.record(tmp_path / "run.h5"), torch.no_grad():
        model(torch.randn(3, 2))
    assert "1 tensor changed in place since it was seen, so it was left out" in (
        capsys.readouterr().err
    )
    with open_recording(tmp_path / "run.h5") as rec:
        relu = rec.modules.resolve("model.1")
        kept = {c.label for c in rec.captured(relu.id)}
        assert kept == {"output"}  # its input was overwritten by the in-place ReLU


def test_tensor_command(tmp_path):
    out = run_hookdbg("record", "-o", tmp_path / "run.h5", SAMPLES / "nan_blowup.py")
    assert out.returncode == 0, out.stderr
    listing = run_hookdbg("tensor", tmp_path / "run.h5", "standardize")
    assert listing.returncode == 0 and "flight recorder" in listing.stdout
    shown = run_hookdbg(
        "tensor", tmp_path / "run.h5", "standardize", "--step", "3", "--slot", "output"
    )
    assert (
        shown.returncode == 0 and "NaN 16, inf 0; first non-finite at index (0, 0)" in shown.stdout
    )
    saved = run_hookdbg(
        "tensor",
        tmp_path / "run.h5",
        "standardize",
        "--step",
        "3",
        "--slot",
        "input[0]",
        "--npy",
        tmp_path / "x.npy",
    )
    assert saved.returncode == 0
    with open_recording(tmp_path / "run.h5") as rec:
        [c] = [
            c
            for c in rec.captured(rec.modules.resolve("standardize").id, 3)
            if c.slot == Slot.INPUT
        ]
        np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), rec.tensor(c))
    for args, message in (
        (["head"], "holds no full tensors of model.head"),
        (["standardize", "--slot", "elbow"], "unknown slot 'elbow'"),
        (["standardize", "--slot", "grad_output"], "no stored grad_output"),
    ):
        bad = run_hookdbg("tensor", tmp_path / "run.h5", *args)
        assert bad.returncode == 2 and message in bad.stderr


def test_npy_without_a_slot_saves_the_only_tensor_or_says_what_to_choose(tmp_path):
    """--npy without --slot: where one tensor is stored it is saved; where several
    are, one line names them and nothing is written."""

    class Const(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.arange(3.0))

        def forward(self):
            return self.w * 2

    model = Const()
    with hookdbg.record(tmp_path / "one.h5", quiet=True, capture=["*"]), torch.no_grad():
        model()  # its output, and nothing else
    saved = tmp_path / "only.npy"
    out = run_hookdbg("tensor", tmp_path / "one.h5", "model", "--npy", saved)
    assert out.returncode == 0, out.stderr
    np.testing.assert_array_equal(np.load(saved), [0.0, 2.0, 4.0])
    assert f"saved model output of step 0 (3,) float32 to {saved}" in out.stderr

    out = run_hookdbg("record", "-q", "-o", tmp_path / "run.h5", SAMPLES / "nan_blowup.py")
    assert out.returncode == 0, out.stderr
    target = tmp_path / "x.npy"
    refused = run_hookdbg(
        "tensor", tmp_path / "run.h5", "standardize", "--step", "3", "--npy", target
    )
    assert refused.returncode == 2 and not target.exists() and refused.stdout == ""
    assert refused.stderr.strip().splitlines() == [
        "Error: --npy saves one tensor, and model.standardize at step 3 has 2 stored "
        "tensors (input[0], output): choose one with --slot"
    ]


def test_captures_beyond_the_memory_bound_are_dropped_and_counted(tmp_path):
    """--capture with a budget far above the backlog bound: what the writer cannot take
    is dropped before it is copied, and the file says how much."""
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)])
    with hookdbg.record(
        tmp_path / "run.h5",
        quiet=True,
        capture=["*"],
        capture_budget_mb=10_000,
        max_backlog_mb=1,
        flush_interval=60,  # the writer does not drain during the run
    ) as rec:
        for _ in range(3):
            model(torch.randn(64, 256)).sum().backward()  # 64 kB per activation
    assert rec.dropped_rows > 0
    with open_recording(tmp_path / "run.h5") as done:
        assert done.dropped_rows == rec.dropped_rows
        kept = sum(c.nbytes for c in done.captured())
    assert 0 < kept <= 2 << 20  # about the bound: one batch over it at most


def test_a_capture_larger_than_the_memory_bound_leaves_every_step_in_the_file(tmp_path):
    """A 2 MB activation captured under a 1 MB bound, with the writer asleep: the first
    is taken alone, the others are dropped, and every step's statistics reach the file."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU())
    x = torch.randn(2048, 256)
    with hookdbg.record(
        tmp_path / "run.h5", quiet=True, capture=["model.1"], max_backlog_mb=1, flush_interval=60
    ) as rec:
        for _ in range(3):  # no optimizer: each forward and backward is a step
            model(x).sum().backward()
    with open_recording(tmp_path / "run.h5") as done:
        assert len(done.steps) == 3 and done.dropped_rows == rec.dropped_rows > 0
        assert int((done.calls_table.column("phase") == Phase.FWD).sum()) == 3 * 3
        relu = done.modules.resolve("model.1").id
        assert int((done.tensors()["module"] == relu).sum()) == 3 * 4  # in, out, their grads
        assert [c.step for c in done.captured()] == [0]


def test_a_captured_tensor_under_a_key_that_is_not_ascii(tmp_path):
    """Module outputs are named by their keys, which can be any text: the captured
    tensor is stored under it, UTF-8 encoded, and the recording loses nothing."""

    class Named(nn.Module):
        def forward(self, x):
            return {"größe": x * 2, "ok": x}

    model = nn.Sequential(nn.Linear(3, 3), Named())
    with hookdbg.record(tmp_path / "run.h5", capture=["model.1"], quiet=True), torch.no_grad():
        out = model(torch.ones(2, 3))
    with open_recording(tmp_path / "run.h5") as rec:
        named = rec.modules.resolve("model.1")
        stored = {c.label: c for c in rec.captured(named.id)}
        assert set(stored) >= {"output[größe]", "output[ok]"}
        np.testing.assert_array_equal(rec.tensor(stored["output[größe]"]), out["größe"].numpy())
        assert rec.dropped_rows == 0 and rec.write_error is None
