"""The sentinel (recorder/alerts/sentinel.py): NaN/inf found at every level, where module
calls are not checked, and the steps after it recorded at stats (--on-nan record)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

import pytest
import torch
from torch import nn

import hookdbg
from hookdbg.options import OptionError, RecordOptions
from hookdbg.read import open_recording
from hookdbg.recorder import Recorder, accelerated
from hookdbg.store.schema import Phase, Slot
from tests.helpers import hookdbg as cli

PATHS = [pytest.param(False, id="c"), pytest.param(True, id="python")]
NAN_FROM = 3  # the step the model's own code first makes a NaN


class Shifted(nn.Module):
    """A log of its input, shifted below zero in the iterations ``bad``: NaN there."""

    def __init__(self, bad: Iterable[int]) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.bad = set(bad)
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(self.lin(x))
        return torch.log(y + 1.0 - (self.step in self.bad) * 2.0)


def train(steps: int, bad: Iterable[int] = (3, 5), skip_bad: bool = True) -> list[float]:
    """A loop that skips backward and the optimizer step on a bad loss, as many do: a
    skipped iteration is part of hookdbg's step with the next one (no optimizer step
    ended it), so iterations 3 and 4 are step 3, and iteration 5 is in step 4."""
    torch.manual_seed(0)
    shifted = Shifted(bad)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), shifted, nn.Linear(8, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        shifted.step = step
        loss = net(torch.randn(16, 4)).pow(2).mean()
        losses.append(loss.item())
        if skip_bad and not torch.isfinite(loss):
            continue
        opt.zero_grad()
        loss.backward()
        opt.step()
    return losses


def same(a: list[float], b: list[float]) -> bool:
    return [repr(x) for x in a] == [repr(x) for x in b]


@pytest.mark.parametrize("pure", PATHS)
@pytest.mark.parametrize("level", ["timing", "shapes"])
def test_below_stats_a_nan_is_found_and_the_steps_after_it_name_its_origin(
    tmp_path, monkeypatch, pure, level
):
    monkeypatch.setenv(accelerated.PURE_PYTHON, "1" if pure else "")
    plain = train(8)
    with hookdbg.record(tmp_path / "run.h5", level=level, quiet=True):
        recorded = train(8)
    assert same(plain, recorded)
    rec = open_recording(tmp_path / "run.h5")
    first, *later = rec.alerts
    assert (int(first["step"]), int(first["slot"])) == (NAN_FROM, int(Slot.OUTPUT))
    assert rec.modules.name(int(first["module"])) == "net"
    message = first["message"].decode()
    assert "module calls were not checked" in message and "every weight was finite" in message
    # found at once, the model's call is run again on its inputs: the op and line named
    assert "made by aten::log (NaN) from " in message and "test_sentinel.py:" in message
    # the steps after it are recorded at stats, where the module that made the NaN
    # when it comes again is named
    (zoom,) = rec.zooms
    assert (zoom["seen"], zoom["first"], zoom["last"]) == (NAN_FROM, NAN_FROM + 1, NAN_FROM + 5)
    assert zoom["text"].startswith(f"recording steps {NAN_FROM + 1}-{NAN_FROM + 5} at stats")
    born = later[0]
    assert int(born["step"]) == NAN_FROM + 1 and bool(born["first"])
    assert rec.modules.name(int(born["module"])) == "net.2"
    assert int(born["slot"]) == int(Slot.OUTPUT)
    assert "its inputs and parameters were finite" in born["message"].decode()


def test_an_idle_run_names_the_module_where_a_nan_was_born_and_says_why_it_recorded(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import torch
            from torch import nn
            torch.manual_seed(0)
            net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
            opt = torch.optim.Adam(net.parameters(), lr=1e-3)
            mse = nn.MSELoss()
            for step in range(12):
                x = torch.randn(8, 4)
                y = net(x)
                if step in ({NAN_FROM}, {NAN_FROM + 2}):
                    y = torch.sqrt(y - 10)  # tensor code after the model: NaN
                loss = mse(y, torch.zeros_like(y))
                print(step, repr(loss.item()))
                if not torch.isfinite(loss):
                    continue
                opt.zero_grad()
                loss.backward()
                opt.step()
            """
        )
    )
    plain = cli("record", "--no-nan-check", "-o", tmp_path / "plain.h5", script)
    run = cli("record", "--idle", "-o", tmp_path / "run.h5", script)
    assert run.returncode == 0, run.stderr
    assert run.stdout == plain.stdout
    assert "recording steps 4-8 at stats to find where the NaN at step 3" in run.stderr
    rec = open_recording(tmp_path / "run.h5")
    first, born = rec.alerts[:2]
    # the loss module's output: the script never calls backward() on it
    assert rec.modules.name(int(first["module"])) == "mse" and int(first["step"]) == NAN_FROM
    # recorded at stats: a NaN that no module made reached the loss module
    assert rec.modules.name(int(born["module"])) == "mse" and int(born["slot"]) == int(Slot.INPUT)
    assert "no recorded module produced it" in born["message"].decode()
    asked = "steps 4-8 asked at stats after the NaN at step 3 in mse (MSELoss) forward output"
    summary = cli("summary", tmp_path / "run.h5")
    assert f"after NaN  {asked}: 5 recorded" in summary.stdout
    status = cli("ctl", tmp_path / "run.h5", "status")
    assert f"after a NaN: {asked}: 5 recorded" in status.stdout


def test_warn_only_warns_and_no_nan_check_checks_nothing(tmp_path):
    stays = range(NAN_FROM, 6)
    with hookdbg.record(tmp_path / "warn.h5", level="timing", on_nan="warn", quiet=True):
        train(8, stays)
    with hookdbg.record(tmp_path / "off.h5", level="timing", nan_check=False, quiet=True):
        train(8, stays)
    warned = open_recording(tmp_path / "warn.h5")
    assert len(warned.alerts) == 1 and not warned.zooms  # a NaN that stays: said once
    assert len(open_recording(tmp_path / "off.h5").alerts) == 0


def test_record_n_records_that_many_steps(tmp_path):
    with hookdbg.record(tmp_path / "run.h5", level="timing", on_nan="record=2", quiet=True):
        train(8, skip_bad=False)  # the NaN reaches the weights: every later step is NaN
    rec = open_recording(tmp_path / "run.h5")
    (zoom,) = rec.zooms
    assert zoom["text"].startswith(f"recording steps {NAN_FROM + 1}-{NAN_FROM + 2} at stats")
    assert "weights came to hold NaN/inf" in zoom["text"]  # what they find may be spread
    assert set(rec.recorded_steps.tolist()) == set(range(8))
    assert rec.info.options["on_nan"] == "record=2"


class NanGrad(torch.autograd.Function):
    """Identity forward; a NaN gradient from ``NAN_FROM`` on: born in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, bad: bool) -> torch.Tensor:
        ctx.bad = bad
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return (grad * float("nan") if ctx.bad else grad), None


@pytest.mark.parametrize("deferred", [False, True], ids=["host", "read-next-segment"])
def test_a_gradient_born_nan_is_found_as_its_backward_pass_ends(tmp_path, deferred):
    """The loop clips the gradients and skips the optimizer step on a NaN norm: no
    optimizer step is given them. ``deferred``: found as on a device, read when the
    next segment begins."""
    torch.manual_seed(0)
    first, second = nn.Linear(4, 8), nn.Linear(8, 1)
    params = [*first.parameters(), *second.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    options = RecordOptions.build(level="timing", quiet=True)
    with Recorder(tmp_path / "run.h5", options, defer_cpu=deferred):
        for step in range(6):
            h = NanGrad.apply(first(torch.randn(4, 4)), step == NAN_FROM)
            loss = second(h).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            if torch.isfinite(nn.utils.clip_grad_norm_(params, 1.0)):
                opt.step()
    rec = open_recording(tmp_path / "run.h5")
    alert = rec.alerts[0]
    assert (int(alert["step"]), int(alert["phase"])) == (NAN_FROM, int(Phase.BWD))
    assert int(alert["slot"]) == int(Slot.PARAM_GRAD)
    assert alert["path"] == b"weight" and rec.modules.name(int(alert["module"])) == "first"
    message = alert["message"].decode()
    assert "the gradient a backward pass left" in message
    assert "1 other parameter's gradient too" in message  # the bias's
    if deferred:  # freed by zero_grad before it was read: its kind is known, not its count
        assert "(at least one NaN: it changed before it could be counted)" in message
        assert int(alert["nan"]) == 1
    else:
        assert int(alert["nan"]) == 32


def test_gradients_set_by_hand_are_read_at_the_optimizer_step(tmp_path):
    torch.manual_seed(0)
    net = nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with hookdbg.record(tmp_path / "run.h5", level="timing", quiet=True):
        for step in range(4):
            net(torch.randn(3, 4))
            for p in net.parameters():  # a gradient of the script's own making
                p.grad = torch.full_like(p, float("nan") if step == 2 else 0.1)
            opt.step()
    (alert,) = open_recording(tmp_path / "run.h5").alerts
    assert (int(alert["step"]), int(alert["phase"])) == (2, int(Phase.OPT))
    assert (
        "the gradient an optimizer step was given; 1 other parameter's" in alert["message"].decode()
    )


def test_a_healthy_run_below_stats_raises_no_alert(tmp_path):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten())
    head = nn.Linear(4 * 6 * 6, 3)
    opt = torch.optim.Adam([*net.parameters(), *head.parameters()])
    with hookdbg.record(tmp_path / "run.h5", level="timing", quiet=True):
        for _ in range(4):
            logits = head(net(torch.randn(2, 3, 8, 8)))
            # a mask's -inf in what the model returns is no NaN: finite in the loss
            logits = logits.masked_fill(torch.tensor([False, False, True]), float("-inf"))
            loss = nn.functional.cross_entropy(logits, torch.tensor([0, 1]))
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert len(open_recording(tmp_path / "run.h5").alerts) == 0


def test_the_sentinel_can_stop_a_run_below_stats(tmp_path):
    recorder = hookdbg.record(tmp_path / "run.h5", level="timing", on_nan="raise", quiet=True)
    with pytest.raises(hookdbg.NonFiniteError, match="module calls were not checked"), recorder:
        train(6)
    assert int(open_recording(tmp_path / "run.h5").alerts[0]["step"]) == NAN_FROM


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("record=0", "--on-nan record=N takes the steps to record, 1 to 100,000, not '0'"),
        ("record=x", "not 'x'"),
        ("warn=3", "unknown --on-nan action 'warn=3'; use one of: record[=N], warn"),
        ("zoom", "unknown --on-nan action 'zoom'"),
    ],
)
def test_bad_on_nan_values_are_refused(tmp_path, text, error):
    with pytest.raises(OptionError, match=error.replace("[", r"\[").replace("(", r"\(")):
        RecordOptions.build(on_nan=text)
    script = tmp_path / "t.py"
    script.write_text("")
    run = cli("record", "--on-nan", text, "-o", tmp_path / "x.h5", script)
    assert run.returncode == 2 and error in run.stderr and not (tmp_path / "x.h5").exists()


class TwoHeads(nn.Module):
    """Two outputs, the second NaN in the iterations ``bad``."""

    def __init__(self, bad: set[int]) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.bad = bad
        self.step = 0

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.lin(x)
        return y, y.sqrt() if self.step in self.bad else y.abs()


@pytest.mark.parametrize("deferred", [False, True], ids=["host", "read-next-segment"])
def test_a_call_with_several_outputs_is_one_finding(tmp_path, deferred):
    """Read together, a NaN output beside a finite one is said once, by its path, and
    not again while it stays (the finite one does not clear it)."""
    torch.manual_seed(0)
    net = TwoHeads({2, 3})
    options = RecordOptions.build(level="timing", quiet=True)
    with Recorder(tmp_path / "run.h5", options, defer_cpu=deferred), torch.no_grad():
        for step in range(5):
            net.step = step
            net(torch.randn(2, 4))
    (alert,) = open_recording(tmp_path / "run.h5").alerts  # eval batches: no training
    assert alert["path"] == b"1" and "NaN first appeared in eval batch 2 " in str(alert["message"])
