"""SIGTERM and SIGHUP: the recording is closed, then the process ends as without hookdbg."""

import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import tables

TRAIN = """
import signal, sys, time, torch
if {own_handler}:
    def stop(signum, frame):
        print("the script's own handler ran", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    opt.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
print("trained", flush=True)
time.sleep(60)
"""


def run_until_trained(cmd: list[str], timeout: float = 120) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.stdout.readline().startswith("trained"):
            return proc
    proc.kill()
    raise AssertionError("the script never finished training")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_termination_signal_closes_the_recording_then_ends_the_process_by_it(tmp_path, signum):
    script = tmp_path / "train.py"
    script.write_text(TRAIN.format(own_handler=False))
    plain = run_until_trained([sys.executable, str(script)])
    plain.send_signal(signum)
    plain.communicate(timeout=60)
    record = [sys.executable, "-m", "hookdbg", "record", "-o", str(tmp_path / "run.h5")]
    proc = run_until_trained([*record, str(script)])
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == plain.returncode == -signum  # died by the signal, both
    assert f"{signum.name}: the recording is closed (status terminated)" in err
    end = tables(tmp_path / "run.h5")["end"]
    assert end["status"][0] == b"terminated" and end["exit_code"][0] == 128 + signum
    assert end["steps"][0] == 3


def test_the_scripts_own_handler_still_decides(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN.format(own_handler=True))
    record = [sys.executable, "-m", "hookdbg", "record", "-q", "-o", str(tmp_path / "run.h5")]
    proc = run_until_trained([*record, str(script)])
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "the script's own handler ran" in out
    end = tables(tmp_path / "run.h5")["end"]
    assert end["status"][0] == b"complete" and end["exit_code"][0] == 0
