"""One recording per process, of the thread that started it: a second start on another
thread is refused at once, and what other threads run is counted, named and said."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

import hookdbg
from hookdbg.read import open_recording
from hookdbg.recorder import accelerated
from tests.helpers import hookdbg as run_hookdbg


def model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int = 30) -> None:
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()


@pytest.mark.parametrize("pure", [False, True], ids=["c", "python"])
def test_two_threads_starting_at_once_record_one_and_refuse_the_other(tmp_path, monkeypatch, pure):
    """Both threads reach ``record()`` together; whichever loses is refused and trains
    unrecorded while the other records, which holds its own 30 steps and optimizer
    only, and names the other thread's calls and steps."""
    monkeypatch.setenv(accelerated.PURE_PYTHON, "1" if pure else "")
    with hookdbg.record(tmp_path / "alone.h5", quiet=True):  # the same training, by itself
        train(*model_and_optimizer())
    together, live, done = threading.Barrier(2), threading.Event(), threading.Event()
    outcome: dict[str, str] = {}

    def run(name: str) -> None:
        model, opt = model_and_optimizer()
        together.wait()
        try:
            with hookdbg.record(tmp_path / f"{name}.h5", quiet=True):
                live.set()
                train(model, opt)
                done.wait(timeout=60)  # the other thread's steps run while recording
            outcome[name] = "recorded"
        except hookdbg.RecordError as exc:
            outcome[name] = str(exc)
            live.wait(timeout=60)
            train(model, opt)
            done.set()

    threads = [threading.Thread(target=run, args=(n,), name=n) for n in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    recorded = [name for name, text in outcome.items() if text == "recorded"]
    assert len(outcome) == 2 and len(recorded) == 1, outcome
    winner = recorded[0]
    loser = "second" if winner == "first" else "first"
    assert outcome[loser].startswith("a hookdbg recording is already running in this process")
    assert f"started on thread {winner!r}" in outcome[loser]
    assert not (tmp_path / f"{loser}.h5").exists()
    with open_recording(tmp_path / "alone.h5") as alone:
        calls = {name: alone.calls_table.column(name) for name in ("step", "module", "phase")}
    with open_recording(tmp_path / f"{winner}.h5") as rec:
        assert len(rec.steps) == 30 and rec.status.value == "complete"
        assert [m.name for m in rec.modules if m.is_optimizer] == ["opt"]
        for name, column in calls.items():  # every call of its own, nothing else
            assert (rec.calls_table.column(name) == column).all(), name
        assert rec.facts["other_threads"] == (
            f"120 module calls and 30 optimizer steps on 1 other thread were not recorded: "
            f"{loser!r} (120 calls, 30 steps); hookdbg records the thread that started "
            f"recording ({winner!r})"
        )


def test_a_start_that_fails_leaves_the_process_free_to_record(tmp_path):
    """A start claims the process's one recording at once; failing, it gives it back."""
    with pytest.raises(hookdbg.RecordError, match="cannot create"):
        hookdbg.record(tmp_path / "missing" / "a.h5", quiet=True).start()
    with hookdbg.record(tmp_path / "b.h5", quiet=True) as rec:
        train(*model_and_optimizer(), steps=2)
    assert rec.steps_recorded == 2


HELPER_THREADS = """
import threading, torch
from concurrent.futures import ThreadPoolExecutor
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
augment = nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    with torch.no_grad():
        worker = threading.Thread(target=lambda: [augment(torch.randn(1, 4)) for _ in range(5)],
                                  name="augment")
        worker.start()
        worker.join()
        with ThreadPoolExecutor(1, thread_name_prefix="pool") as pool:
            pool.submit(augment, torch.randn(1, 4)).result()
    opt.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
"""


def test_summary_says_how_many_calls_ran_on_which_other_threads(tmp_path):
    script, path = tmp_path / "train.py", tmp_path / "run.h5"
    script.write_text(HELPER_THREADS)
    said = (
        "18 module calls on 6 other threads were not recorded: 'augment' (3 threads, 15 "
        "calls), 'pool_0' (3 threads, 3 calls); hookdbg records the thread that started "
        "recording ('MainThread')"
    )
    out = run_hookdbg("record", "-o", path, script)
    assert out.returncode == 0, out.stderr
    assert f"hookdbg: {said}" in out.stderr.splitlines()
    summary = run_hookdbg("summary", path)
    assert summary.returncode == 0, summary.stderr
    assert said in summary.stdout
