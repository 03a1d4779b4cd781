"""Headroom warnings: a module output nearing its dtype's largest finite value is said
before it overflows, once per place, and nothing is said of healthy runs."""

import json

import pytest
import torch
from torch import nn

import hookdbg
from hookdbg.store.schema import Slot
from tests.helpers import SAMPLES, tables
from tests.helpers import hookdbg as run_hookdbg


def _warnings(path) -> list[dict]:
    info = tables(path)["info"]
    return [
        json.loads(v) for k, v in zip(info["key"], info["value"], strict=True) if k == b"headroom"
    ]


def test_an_overflow_is_warned_of_steps_before_it_comes(fp16_h5):
    """samples/fp16_overflow.py: model.0's output grows 4x a step and overflows at
    step 8; the climb is seen at step 6, at 13% of float16's range."""
    first = _warnings(fp16_h5)[0]
    assert (first["step"], first["path"], first["dtype"], first["within"]) == (6, "", "float16", 2)
    assert first["growth"] == pytest.approx(4.0, rel=0.01)
    assert first["step"] < 8  # the overflow's step: the alert comes after
    report = json.loads(run_hookdbg("alerts", "--json", fp16_h5).stdout)
    assert report["headroom"][0]["module"] == "model.0"
    assert report["alerts"][0]["step"] == 8
    text = run_hookdbg("alerts", fp16_h5).stdout
    assert (
        "headroom: model.0 (Linear) forward output abs-max 8.25e+03 = 13% of float16's max" in text
    )
    assert "overflow expected within 2 steps, at step 6" in text
    summary = run_hookdbg("summary", fp16_h5).stdout
    assert "headroom   3 warnings, the first: model.0 (Linear)" in summary


def _healthy(dtype: torch.dtype, autocast: bool, path) -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
    model = nn.Sequential(nn.Linear(8, 32), layer, nn.Linear(32, 1))
    if not autocast:
        model = model.to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with hookdbg.record(path, quiet=True):
        for _ in range(6):
            x = torch.randn(4, 10, 8)
            with torch.autocast("cpu", dtype=dtype, enabled=autocast):
                loss = model(x if autocast else x.to(dtype)).float().pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()


@pytest.mark.parametrize(
    "dtype, autocast",
    [(torch.float16, False), (torch.bfloat16, False), (torch.bfloat16, True)],
    ids=["float16", "bfloat16", "bf16-autocast"],
)
def test_healthy_reduced_precision_training_says_nothing(tmp_path, dtype, autocast):
    _healthy(dtype, autocast, tmp_path / "run.h5")
    assert _warnings(tmp_path / "run.h5") == []
    assert len(tables(tmp_path / "run.h5")["steps"]) == 6


def test_on_headroom_stop_ends_the_run_before_the_overflow(tmp_path):
    out = run_hookdbg(
        "record", "-o", tmp_path / "run.h5", "--on-headroom", "stop", SAMPLES / "fp16_overflow.py"
    )
    assert out.returncode == 3, out.stderr
    assert "stopped at a headroom warning, before the overflow (--on-headroom stop)" in out.stderr
    assert "step 8" not in out.stdout  # it never got there
    assert len(tables(tmp_path / "run.h5")["alerts"]) == 0
    summary = run_hookdbg("summary", tmp_path / "run.h5").stdout
    assert "stopped at a headroom warning, before the overflow (exit status 3)" in summary


def test_on_headroom_raise_raises_in_the_script(tmp_path):
    model = nn.Linear(4, 4).half()
    with torch.no_grad():
        model.weight.fill_(1000.0)
    x = torch.full((2, 4), 10.0).half()  # 4 x 1000 x 10 = 40000: 61% of 65504
    recording = hookdbg.record(tmp_path / "run.h5", quiet=True, on_headroom="raise")
    with pytest.raises(hookdbg.HeadroomError) as raised, recording:
        for _ in range(3):
            model(x).float().sum().backward()
    assert raised.value.module == "model" and raised.value.step == 0
    assert "61% of float16's max" in str(raised.value)


@pytest.mark.parametrize("share", ["0", "1.5", "nan"])
def test_a_headroom_share_outside_the_range_is_refused(tmp_path, share):
    out = run_hookdbg(
        "record", "-o", tmp_path / "run.h5", "--headroom", share, SAMPLES / "fp16_overflow.py"
    )
    assert out.returncode == 2
    assert "--headroom must be a share of the range above 0 and at most 1" in out.stderr
    assert not (tmp_path / "run.h5").exists()


class _ToFp8(nn.Module):
    def forward(self, x):
        return x.to(torch.float8_e5m2)


@pytest.mark.skipif(not hasattr(torch, "float8_e5m2"), reason="no float8 in this torch")
def test_an_fp8_output_is_summarised_and_its_climb_warned_of(tmp_path):
    """float8_e5m2 tops out at 57344: an output growing 4x a step is warned of at 14%."""
    model = nn.Sequential(nn.Linear(4, 4), _ToFp8())
    with torch.no_grad():
        model[0].weight.fill_(0.5)
        model[0].bias.zero_()
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        for step in range(8):  # outputs 2 x 4**step: 8192 (14%) at step 6
            model(torch.full((2, 4), 4.0**step)).float().sum().backward()
    t = tables(tmp_path / "run.h5")["tensors"]
    rows = t[(t["dtype"] == b"float8_e5m2") & (t["step"] == 2) & (t["slot"] == Slot.OUTPUT)]
    assert len(rows) and (rows["max"] == 32.0).all() and (rows["nan"] == 0).all()  # 16 x 2
    [warning] = _warnings(tmp_path / "run.h5")
    assert warning["dtype"] == "float8_e5m2" and warning["largest"] == 57344.0
    assert warning["step"] == 6 and warning["within"] == 2
    assert warning["growth"] == pytest.approx(4.0)


def test_alerts_lists_headroom_warnings_in_step_order(tmp_path):
    """Two float16 outputs doubling a step would reach half the range at steps 3 and 12;
    each is warned of a step ahead, and `alerts` says them in step order (as numbers: 2
    before 11)."""
    fast, slow = nn.Linear(1, 1).half(), nn.Linear(1, 1).half()
    with torch.no_grad():
        for layer in (fast, slow):
            layer.bias.zero_()
        fast.weight.fill_(4096.0)  # 4096 x 2**step: 32768 = 50% at step 3
        slow.weight.fill_(8.0)  # 8 x 2**step: 32768 at step 12
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        for step in range(13):
            x = torch.full((1, 1), 2.0**step).half()
            fast(x).float().sum().backward()
            slow(x).float().sum().backward()
    report = json.loads(run_hookdbg("alerts", "--json", tmp_path / "run.h5").stdout)
    steps = [(w["module"], w["step"]) for w in report["headroom"]]
    assert steps == [("fast", 2), ("slow", 11)], steps
