"""NaN/inf alerts name where a non-finite value was born, not everywhere it spread."""

import torch
from torch import nn

import hookdbg
from hookdbg.store.schema import Phase, Slot
from tests.helpers import SAMPLES, module_names, tables
from tests.helpers import hookdbg as run_hookdbg


def origins(path) -> list[tuple[str, int, int, str, int]]:
    t = tables(path)
    names = module_names(t)
    return [
        (
            names[int(a["module"])],
            int(a["phase"]),
            int(a["slot"]),
            a["path"].decode(),
            int(a["step"]),
        )
        for a in t["alerts"]
    ]


def test_forward_origin_of_the_nan_sample(tmp_path):
    out = run_hookdbg(
        "record",
        "-o",
        tmp_path / "nan.h5",
        SAMPLES / "nan_blowup.py",
        "--nan-step",
        "2",
        "--steps",
        "4",
    )
    assert out.returncode == 0, out.stderr
    assert origins(tmp_path / "nan.h5") == [("model.standardize", Phase.FWD, Slot.OUTPUT, "", 2)]
    assert (
        "NaN first appeared at step 2 in model.standardize (Standardize) forward output"
        in out.stderr
    )
    assert "step 3  loss nan" in out.stdout  # the script itself ran on, untouched
    assert tables(tmp_path / "nan.h5")["alerts"]["first"][0] == 1


def test_backward_origin_of_the_nan_sample(tmp_path):
    out = run_hookdbg(
        "record",
        "-o",
        tmp_path / "nan.h5",
        SAMPLES / "nan_blowup.py",
        "--where",
        "backward",
        "--nan-step",
        "1",
        "--steps",
        "3",
    )
    assert out.returncode == 0, out.stderr
    assert origins(tmp_path / "nan.h5") == [("model.length", Phase.BWD, Slot.GRAD_INPUT, "0", 1)]
    assert "in model.length (Length) backward grad_input[0]" in out.stderr


def test_nan_in_the_data_is_named_as_such(tmp_path):
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    x = torch.randn(2, 3)
    x[0, 1] = float("nan")
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        model(x)
    t = tables(tmp_path / "run.h5")
    assert origins(tmp_path / "run.h5") == [("model", Phase.FWD, Slot.INPUT, "0", 0)]
    assert b"came from the data" in t["alerts"]["message"][0]


def test_inf_from_the_loss_computation(tmp_path):
    model = nn.Linear(2, 1)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        out = model(torch.zeros(1, 2)) * 0
        torch.log(out.abs()).sum().backward()  # d/dx log|x| at 0
    assert origins(tmp_path / "run.h5")[0][:3] == ("model", Phase.BWD, Slot.GRAD_OUTPUT)


def test_optimizer_step_that_makes_weights_nonfinite(tmp_path):
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=float("inf"))
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        model(torch.ones(1, 2))  # NaN weights: spread, not born
    found = origins(tmp_path / "run.h5")
    assert [(m, p, s) for m, p, s, _, _ in found] == [("model", Phase.OPT, Slot.PARAM)] * 2
    assert {path for *_, path, _ in found} == {"weight", "bias"}


def test_one_warning_per_origin_however_often_it_recurs(tmp_path, capsys):
    model = nn.Sequential(nn.Linear(2, 2))
    with hookdbg.record(tmp_path / "run.h5"), torch.no_grad():
        for _ in range(3):  # three inference steps
            model(torch.tensor([[float("inf"), 1.0]]))
    err = capsys.readouterr().err
    assert err.count("inf first appeared") == 1
    assert len(tables(tmp_path / "run.h5")["alerts"]) == 3
