"""The op and the source line that made a NaN/inf origin: found by running a forward
origin again at once, or by watching the next steps for the others."""

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from torch import nn

import hookdbg
from hookdbg.read import Status, open_recording
from hookdbg.recorder.alerts.pinpoint import OpCheck
from tests.helpers import hookdbg as run_hookdbg
from tests.helpers import tables, torchrun


def test_the_check_names_the_inf_and_the_nan_it_turned_into():
    check = OpCheck(lambda: False)
    with check:
        z = torch.tensor([[1.0, 200.0, 3.0]])
        e = torch.exp(z)  # inf
        p = e / e.sum(-1, keepdim=True)  # inf / inf: NaN
        q = p * 2  # carries it on
    birth = check.birth_of(q)
    assert birth is not None
    assert (birth.op, birth.kind) == ("aten::div", "NaN")
    assert birth.cause is not None and (birth.cause.op, birth.cause.kind) == ("aten::exp", "inf")
    assert birth.cause.code == "e = torch.exp(z)  # inf"
    assert birth.text().startswith("aten::exp (inf) from ")
    assert ", then NaN by aten::div from tests/recorder/test_pinpoint.py:" in birth.text()
    assert check.birth_of(z) is None  # finite


def test_ops_run_while_hookdbg_is_busy_are_not_the_models():
    check = OpCheck(lambda: True)
    with check:
        torch.exp(torch.tensor([1000.0]))
    assert check.births == []


class _Block(nn.Module):
    """Batch norm, dropout, a call counter and a list of what it saw (state a re-run
    must leave as it found it), then a standardisation without an epsilon: a row of
    zeros divides 0 by 0."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.bn = nn.BatchNorm1d(6)
        self.drop = nn.Dropout(0.3)
        self.calls = 0
        self.seen: list[torch.Tensor] = []

    def forward(self, x, keep):
        self.calls += 1
        h = self.drop(self.bn(self.lin(x))) * keep
        self.seen.append(h.detach())
        return (h - h.mean(-1, keepdim=True)) / h.std(-1, keepdim=True)


def _steps(record: bool, path) -> list[torch.Tensor]:
    """Four steps; at step 2 a row is dropped (``keep`` 0)."""
    torch.manual_seed(0)
    model = _Block()
    head = nn.Linear(6, 1)
    opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1)
    losses = []
    with hookdbg.record(path, quiet=True) if record else _nothing():
        for step in range(4):
            keep = torch.ones(8, 1)
            if step == 2:
                keep[0] = 0.0
            loss = head(model(torch.randn(8, 6), keep)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
    losses.append(model.bn.running_mean.clone())
    losses.append(torch.rand(3))  # the random generator's state afterwards
    losses.append(torch.tensor([model.calls, len(model.seen)]))
    return losses


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_forward_origin_is_run_again_and_its_op_named_and_training_is_untouched(tmp_path):
    plain = _steps(False, None)
    recorded = _steps(True, tmp_path / "run.h5")
    for a, b in zip(plain, recorded, strict=True):
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))  # bitwise, NaN alike
    message = tables(tmp_path / "run.h5")["alerts"]["message"][0].decode()
    assert "forward output" in message
    assert "made by aten::div (NaN) from " in message
    assert "test_pinpoint.py:" in message
    assert "return (h - h.mean(-1, keepdim=True)) / h.std(-1, keepdim=True)" in message
    assert "(run again on its inputs)" in message


_BACKWARD_BORN = textwrap.dedent(
    """
    import torch
    from torch import nn

    class Length(nn.Module):
        def forward(self, x):
            return torch.sqrt((x * x).sum(-1, keepdim=True))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)
            self.length = Length()
            self.head = nn.Linear(9, 1)

        def forward(self, x, keep):
            h = self.proj(x) * keep
            return self.head(torch.cat([h, self.length(h)], -1))

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        keep = torch.ones(16, 1)
        if step >= 2:
            keep[0] = 0.0  # a zero row: sqrt's gradient at 0 is inf, times 0 is NaN
        loss = model(torch.randn(16, 8), keep).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if all(torch.isfinite(p.grad).all() for p in model.parameters()):
            opt.step()  # as trainers do: a step whose gradients are not finite is skipped
        print(step, loss.item())
    """
)


def test_a_backward_origin_is_watched_for_and_named_when_it_comes_again(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_BACKWARD_BORN)
    plain = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=True
    )
    out = run_hookdbg("record", "-o", tmp_path / "run.h5", script, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == plain.stdout  # the watch changed nothing the script computed
    assert "op-level check: on for the next 3 steps" in out.stderr
    report = run_hookdbg("alerts", "--json", tmp_path / "run.h5")
    first = json.loads(report.stdout)["alerts"][0]
    assert first["phase"] == "bwd" and first["module"] == "model.length"
    op = first["op"]
    assert op["found"] is True
    assert (op["op"], op["kind"], op["node"]) == ("aten::mul", "NaN", "MulBackward0")
    cause = op["from"]
    assert (cause["op"], cause["kind"], cause["node"]) == ("aten::div", "inf", "SqrtBackward0")
    assert cause["where"] == "train.py:7"
    assert cause["code"] == "return torch.sqrt((x * x).sum(-1, keepdim=True))"
    text = run_hookdbg("alerts", tmp_path / "run.h5").stdout
    assert "the op: made by aten::div in SqrtBackward0 (inf) from train.py:7" in text


def test_an_origin_that_never_comes_again_is_said_unknown(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_BACKWARD_BORN.replace("if step >= 2:", "if step == 2:"))
    out = run_hookdbg("record", "-o", tmp_path / "run.h5", script, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "did not come again at its place" in out.stderr
    op = json.loads(run_hookdbg("alerts", "--json", tmp_path / "run.h5").stdout)["alerts"][0]["op"]
    assert op["found"] is False
    assert "did not come again" in op["text"]


def test_under_tensor_parallel_the_watch_reads_shards_and_names_the_op(tmp_path):
    """Two ranks under torchrun: the rank where the value was born watches (a re-run
    would run a collective alone), reads its DTensors' own shards only (a whole one
    would run a collective on that rank alone and hang), and names the op; the other
    rank says the NaN came from another rank. Both finish, as without hookdbg."""
    script = Path(__file__).with_name("tp_pinpoint.py")
    plain = torchrun(script, cwd=tmp_path)
    _finished(plain)
    out = torchrun("-m", "hookdbg", "record", "-o", tmp_path / "run.h5", script, cwd=tmp_path)
    _finished(out)
    for rank in (0, 1):
        with open_recording(tmp_path / f"run.rank{rank}.h5") as rec:
            assert rec.status is Status.COMPLETE
    # two ranks write to one pipe: a line may run into the next
    losses = re.compile(r"rank \d step \d loss (?:nan|-?[\d.]+)")
    assert sorted(losses.findall(out.stdout)) == sorted(losses.findall(plain.stdout))
    assert len(losses.findall(plain.stdout)) == 10
    found = [line for line in out.stderr.splitlines() if "was made by" in line]
    assert len(found) == 1 and found[0].startswith("hookdbg[rank 1]: op-level check:"), out.stderr
    assert "aten::div (inf) from " in found[0] and "tp_pinpoint.py:" in found[0]
    assert "then NaN by aten::addmm" in found[0]
    assert "came from another rank" in out.stderr


class _Scale(nn.Module):
    def forward(self, x, by):
        return x / by


class _Wrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = _Scale()

    def forward(self, x):
        return self.scale(self.lin(x), by=torch.zeros(()))  # x / 0: inf, a keyword argument


def test_an_inf_said_where_a_later_module_passed_it_on_is_run_again_where_it_was_born(tmp_path):
    """The inf is seen to be no mask only when the wrapper returns it; the op-level check
    runs the module it was born in again, with that call's own inputs and keywords."""
    model = _Wrapper()
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        model(torch.ones(2, 4))
    message = tables(tmp_path / "run.h5")["alerts"]["message"][0].decode()
    assert message.startswith("inf first appeared at step 0 in model.scale (_Scale) forward output")
    assert "; model returned it; made by aten::div (inf) from " in message
    assert "return x / by" in message and "(run again on its inputs)" in message


def _finished(run: subprocess.CompletedProcess[str]) -> None:
    """Both ranks ran to their end. Now and then torch's threads abort a process as the
    interpreter tears them down, after everything is done and printed ("terminate
    called without an active exception", tests/cli/sharded_train.py says how often):
    that exit is torch's, not the run's."""
    if run.returncode != 0:
        assert "terminate called without an active exception" in run.stderr, run.stderr
    assert run.stdout.count("step 4 loss") == 2, run.stdout
