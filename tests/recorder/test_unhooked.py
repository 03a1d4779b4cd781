"""A script that clears torch's global hooks (``_global_forward_hooks.clear()``, as some
libraries and test helpers do) takes hookdbg's with them: the recording notices at the
next step boundary, backward pass or writer tick, says so once, and stops (status
failed); training goes on untouched and the recorder stays small and cheap."""

import time

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_hooks
from torch.optim import optimizer as optimizer_hooks

import hookdbg
from hookdbg.read import Status, open_recording
from hookdbg.recorder import accelerated
from tests.helpers import hookdbg as run_hookdbg

MODULE = "torch.nn.modules.module."
CLEARED = {
    "forward hooks": [module_hooks._global_forward_hooks],
    "forward pre-hooks": [module_hooks._global_forward_pre_hooks],
    "both": [module_hooks._global_forward_pre_hooks, module_hooks._global_forward_hooks],
    "optimizer pre-hooks": [optimizer_hooks._global_optimizer_pre_hooks],
}
NAMES = {
    id(module_hooks._global_forward_hooks): MODULE + "_global_forward_hooks",
    id(module_hooks._global_forward_pre_hooks): MODULE + "_global_forward_pre_hooks",
    id(optimizer_hooks._global_optimizer_pre_hooks): (
        "torch.optim.optimizer._global_optimizer_pre_hooks"
    ),
}


def train(cleared: list[dict], steps: int = 30, at: int = 3) -> list[float]:
    """A small MLP trained ``steps`` steps; ``cleared`` are emptied before step ``at``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        if step == at:
            for registry in cleared:
                registry.clear()
        loss = model(torch.randn(5, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("pure", [False, True], ids=["c", "python"])
@pytest.mark.parametrize("which", CLEARED)
def test_cleared_hooks_stop_the_recording_and_training_goes_on(
    tmp_path, monkeypatch, capsys, which, pure
):
    monkeypatch.setenv(accelerated.PURE_PYTHON, "1" if pure else "")
    cleared = CLEARED[which]
    plain = train(cleared)
    path = tmp_path / "run.h5"
    with hookdbg.record(path) as rec:
        recorded = train(cleared)
        assert rec.failure is not None  # at once, not only when the recording ends
        assert len(rec._calls.stack) <= 1 and rec.calls_recorded == 12  # 4 a step, 3 steps
    assert recorded == plain
    said = capsys.readouterr().err
    assert said.count("hooks were removed from") == 1, said
    assert "the recording stops here (status failed), training goes on unrecorded" in said
    for registry in cleared:
        assert NAMES[id(registry)] in rec.failure
    with open_recording(path) as r:
        assert r.status is Status.FAILED and r.end["status"] == b"failed"
        assert NAMES[id(cleared[0])] in r.facts["failed"]  # an info row, from the start
        assert r.failure.endswith("; 27 backward passes ran after it"), r.failure
        assert len(r.recorded_steps) == 3 and int(r.end["steps"]) == 3
        phases = r.calls_table.column("phase")
        assert int(np.count_nonzero(phases == 0)) == int(r.end["calls"]) == 12


def test_the_writer_notices_where_no_step_or_backward_pass_comes(tmp_path):
    """Inference alone, its forward pre-hook gone: no root call reaches hookdbg and no
    backward pass runs; the writer's timer finds it while the loop still runs."""
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with hookdbg.record(tmp_path / "run.h5", quiet=True, flush_interval=0.05) as rec:
        with torch.no_grad():
            model(torch.ones(1, 4))
            module_hooks._global_forward_pre_hooks.clear()
            deadline = time.monotonic() + 30
            while rec.failure is None and time.monotonic() < deadline:
                model(torch.ones(1, 4))
        assert rec.failure is not None and "_global_forward_pre_hooks" in rec.failure
        assert "in eval batch 0" in rec.failure


def test_hooks_cleared_after_the_last_check_still_fail_the_recording(tmp_path):
    """Cleared just before the recording ends: it must not say complete."""
    model = nn.Linear(4, 4)
    with hookdbg.record(tmp_path / "run.h5", quiet=True) as rec, torch.no_grad():
        model(torch.ones(1, 4))
        module_hooks._global_forward_hooks.clear()
        model(torch.ones(1, 4))
    assert rec.failure is not None and "_global_forward_hooks" in rec.failure
    with open_recording(tmp_path / "run.h5") as r:
        assert r.status is Status.FAILED


def test_the_cli_says_it_once_and_reports_what_the_file_holds(tmp_path):
    """The reported case, as a real script run by ``hookdbg record``."""
    script = tmp_path / "clears.py"
    script.write_text(
        "import torch\n"
        "from torch import nn\n"
        "from torch.nn.modules import module\n"
        "model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.05)\n"
        "for step in range(200):\n"
        "    if step == 5:\n"
        "        module._global_forward_hooks.clear()\n"
        "    loss = model(torch.randn(5, 4)).pow(2).mean()\n"
        "    opt.zero_grad()\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "print('trained')\n"
    )
    path = tmp_path / "run.h5"
    out = run_hookdbg("record", "-o", path, script)
    assert out.returncode == 0 and out.stdout == "trained\n", out.stderr
    assert out.stderr.count("hooks were removed from") == 2, out.stderr  # the line, the end
    assert "before step 5: hookdbg's hooks were removed from " + MODULE in out.stderr
    last = out.stderr.splitlines()[-1]
    assert "recording FAILED" in last and "5 steps, 20 module calls" in last, last
    with open_recording(path) as r:
        assert int(np.count_nonzero(r.calls_table.column("phase") == 0)) == 20
        assert r.failure.endswith("; 195 backward passes ran after it"), r.failure
    summary = run_hookdbg("summary", path, "--exit-code")
    assert summary.returncode == 1, summary.stderr
    assert summary.stdout.splitlines()[0].split()[1] == "failed"
    assert "failed     before step 5: hookdbg's hooks were removed from" in summary.stdout
