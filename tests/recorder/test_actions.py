"""--on-nan warn | raise | stop | break, as the script and the user experience them."""

import contextlib
import os
import pty
import select
import subprocess
import sys
import time

import pytest
import torch
from torch import nn

import hookdbg
from hookdbg.recorder.alerts.capture import FlightRecorder
from tests.helpers import SAMPLES, tables
from tests.helpers import hookdbg as run_hookdbg


class Log(nn.Module):
    def forward(self, x):
        return torch.log(x)


def test_raise_reaches_the_script_in_forward(tmp_path):
    model = nn.Sequential(nn.Tanh(), Log())  # tanh(-5) < 0: always NaN
    with (
        hookdbg.record(tmp_path / "run.h5", on_nan="raise", quiet=True),
        torch.no_grad(),
        pytest.raises(hookdbg.NonFiniteError) as caught,
    ):
        for _ in range(3):
            model(torch.tensor([[-5.0, -5.0]]))
    err = caught.value
    assert (err.step, err.module, err.phase, err.slot) == (0, "model.1", "fwd", "output")
    assert isinstance(err, FloatingPointError) and "NaN first appeared" in str(err)
    assert len(tables(tmp_path / "run.h5")["alerts"]) == 1


def test_raise_reaches_the_script_in_backward(tmp_path):
    class Sqrt(nn.Module):
        def forward(self, x):
            return torch.sqrt(x)

    model = nn.Sequential(nn.Linear(2, 2, bias=False), Sqrt())
    with torch.no_grad():
        model[0].weight.zero_()
    with hookdbg.record(tmp_path / "run.h5", on_nan="raise", quiet=True):
        out = model(torch.ones(1, 2)).sum()  # sqrt(0): finite forward, infinite gradient
        with pytest.raises(hookdbg.NonFiniteError) as caught:
            out.backward()
    assert (caught.value.module, caught.value.phase, caught.value.slot) == (
        "model.1",
        "bwd",
        "grad_input",
    )


def test_stop_ends_the_run_with_status_3_and_a_complete_file(tmp_path):
    out = run_hookdbg(
        "record",
        "-o",
        tmp_path / "run.h5",
        "--on-nan",
        "stop",
        SAMPLES / "nan_blowup.py",
        "--nan-step",
        "2",
    )
    assert out.returncode == 3, out.stderr
    assert "stopped at the first NaN/inf origin (--on-nan stop)" in out.stderr
    assert "step 2" not in out.stdout  # it stopped inside step 2, before the script printed
    t = tables(tmp_path / "run.h5")
    assert t["end"]["status"][0] == b"stopped" and t["end"]["exit_code"][0] == 3
    assert len(t["alerts"]) == 1


def test_break_without_a_terminal_stops_instead_of_hanging(tmp_path):
    out = run_hookdbg(
        "record",
        "-o",
        tmp_path / "run.h5",
        "--on-nan",
        "break",
        SAMPLES / "nan_blowup.py",
        input="c\n",
    )
    assert out.returncode == 3
    assert "--on-nan break needs a terminal to type into (stdin is not one)" in out.stderr


def drive_pdb(tmp_path, where: str, commands: list[bytes]) -> tuple[str, int]:
    """Run the NaN sample with --on-nan break on a pseudo-terminal; type ``commands``
    at each (Pdb) prompt, in order. Returns everything it printed and its exit status."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hookdbg",
            "record",
            "-o",
            str(tmp_path / "run.h5"),
            "--on-nan",
            "break",
            str(SAMPLES / "nan_blowup.py"),
            "--where",
            where,
        ],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        close_fds=True,
        env={**os.environ, "TERM": "dumb"},
    )
    os.close(slave)
    seen = b""
    pending = list(commands)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                seen += os.read(master, 65536)
            except OSError:
                break
        if pending and seen.rstrip().endswith(b"(Pdb)"):
            os.write(master, pending.pop(0))
    proc.wait(timeout=30)
    os.close(master)
    return seen.decode(errors="replace"), proc.returncode


def test_break_opens_pdb_at_a_forward_origin_and_continue_resumes(tmp_path):
    text, code = drive_pdb(
        tmp_path,
        "forward",
        [
            b"p step, type(module).__name__, summary['nan']\n",
            b"p inputs[0].isnan().any().item(), output.isnan().sum().item()\n",
            b"c\n",
        ],
    )
    assert code == 0, text
    assert "in the debugger at the fwd hook where NaN was born" in text
    assert "(3, 'Standardize', 16)" in text and "(False, 16)" in text
    assert "step 5  loss nan" in text  # training went on after 'c'
    assert len(tables(tmp_path / "run.h5")["alerts"]) == 1


def test_break_at_a_backward_origin(tmp_path):
    text, code = drive_pdb(
        tmp_path,
        "backward",
        [
            b"p type(module).__name__, grad.isnan().sum().item(), alert.slot.label\n",
            b"c\n",
        ],
    )
    assert code == 0, text
    assert "('Length', 16, 'grad_input')" in text


def test_nan_check_switches(tmp_path):
    model = nn.Sequential(nn.Tanh(), Log())  # tanh(-5) < 0: always NaN
    x = torch.tensor([[-5.0, -5.0]])
    with hookdbg.record(tmp_path / "timing.h5", level="timing", nan_check=True, quiet=True):
        model(x)
    with hookdbg.record(tmp_path / "off.h5", nan_check=False, quiet=True):
        model(x)
    timing, off = tables(tmp_path / "timing.h5"), tables(tmp_path / "off.h5")
    assert len(timing["alerts"]) == 1 and len(timing["tensors"]) == 0
    assert len(off["alerts"]) == 0 and off["tensors"]["nan"].max() > 0  # still counted
    # from Python, errors name the keyword arguments, not the command line's flags
    with pytest.raises(ValueError, match="on_nan raise needs NaN checks: drop nan_check=False"):
        hookdbg.record(tmp_path / "x.h5", on_nan="raise", nan_check=False)
    # below stats the sentinel's check is one: an action can be asked of it
    assert hookdbg.record(tmp_path / "y.h5", on_nan="stop", level="timing").options.sentinel
    with pytest.raises(ValueError, match=r"^every must be at least 1, not 0"):
        hookdbg.record(tmp_path / "x.h5", every=0)
    with pytest.raises(ValueError, match=r"module globs must be strings like 'layer3\.\*', not 5"):
        hookdbg.record(tmp_path / "x.h5", modules=5)  # type: ignore[arg-type]
    assert hookdbg.record(tmp_path / "x.h5", modules="0").options.modules.include == ("0",)


@pytest.mark.parametrize("on_nan", ["warn", "raise"])
def test_a_failure_acting_on_an_alert_stops_the_recording_not_the_action(
    tmp_path, monkeypatch, capfd, on_nan
):
    def broken_dump(self, origin, seg):
        raise RuntimeError("a bug in the flight recorder")

    monkeypatch.setattr(FlightRecorder, "dump", broken_dump)
    model = nn.Sequential(nn.Tanh(), Log())  # tanh(-5) < 0: always NaN
    caught = []
    with hookdbg.record(tmp_path / "run.h5", on_nan=on_nan, quiet=True), torch.no_grad():
        for step in range(3):
            try:
                model(torch.tensor([[-5.0, -5.0]]))
            except hookdbg.NonFiniteError as error:
                caught.append((step, error.module))
    err = capfd.readouterr().err
    assert "internal error at step 0" in err and "the recording stops here" in err
    assert "a bug in the flight recorder" in err
    assert caught == ([(0, "model.1")] if on_nan == "raise" else [])
    assert len(tables(tmp_path / "run.h5")["alerts"]) == 1  # written before the failure


@pytest.mark.parametrize("on_nan", ["raise", "stop"])
def test_the_step_an_alert_cut_short_is_the_training_step_it_names(tmp_path, on_nan):
    model = nn.Sequential(Log(), nn.Linear(2, 2))  # by-hand SGD, no optimizer
    with hookdbg.record(tmp_path / "run.h5", on_nan=on_nan, quiet=True):
        for step in range(5):
            x = torch.full((3, 2), -1.0 if step == 3 else 1.0)  # log of a negative
            try:
                loss = model(x).abs().sum()
            except (hookdbg.NonFiniteError, hookdbg.NonFiniteStop):
                break  # the script handles it, and the recording ends normally
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.001 * p.grad
                    p.grad = None
    t = tables(tmp_path / "run.h5")
    (alert,) = t["alerts"]
    assert alert["step"] == 3
    steps = t["steps"]
    assert steps["step"].tolist() == [0, 1, 2, 3] and (steps["kind"] == 0).all()  # training


def test_an_inference_batch_cut_short_stays_an_eval_batch(tmp_path):
    """Inference with gradients on (no optimizer, no backward) that skips the batches
    --on-nan raise stops: every batch is an eval batch, the one cut short too."""
    model = nn.Sequential(nn.Linear(2, 2), Log()).eval()
    with hookdbg.record(tmp_path / "run.h5", on_nan="raise", quiet=True):
        for step in range(4):
            x = torch.full((3, 2), -9.0 if step == 2 else 1.0)
            with contextlib.suppress(hookdbg.NonFiniteError):
                model(x)
    steps = tables(tmp_path / "run.h5")["steps"]
    assert len(steps) == 4 and (steps["kind"] == 1).all()
