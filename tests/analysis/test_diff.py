import pytest

from hookdbg.analysis.diff import diff
from hookdbg.read import open_recording
from hookdbg.store.schema import Phase, Slot
from tests.helpers import hookdbg, with_older_summaries

SCRIPT = """
import sys, torch
from torch import nn
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2))
if "--change" in sys.argv:
    net[3] = nn.Hardtanh()  # same place, slightly different function
opt = torch.optim.SGD(net.parameters(), lr=0.1)
steps = 3 if "--short" in sys.argv else 4
for _ in range(steps):
    x = torch.randn(4, 8)
    opt.zero_grad()
    net(x).pow(2).mean().backward()
    opt.step()
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("diff")
    (base / "train.py").write_text(SCRIPT)
    made = {}
    for name, args in (("a", []), ("b", []), ("changed", ["--change"]), ("short", ["--short"])):
        out = hookdbg("record", "-q", "-o", base / f"{name}.h5", base / "train.py", *args)
        assert out.returncode == 0, out.stderr
        made[name] = base / f"{name}.h5"
    return made


def test_identical_seeded_runs_match(runs):
    with open_recording(runs["a"]) as a, open_recording(runs["b"]) as b:
        result = diff(a, b, rtol=0, atol=0)
        assert result.equal and result.compared_rows > 0 and result.compared_steps == [0, 1, 2, 3]


def test_the_changed_module_is_named_first(runs):
    with open_recording(runs["a"]) as a, open_recording(runs["changed"]) as b:
        result = diff(a, b)
        first = result.first
        assert (first.module, first.step, first.phase, first.slot) == (
            "net.3",
            0,
            Phase.FWD,
            Slot.OUTPUT,
        )
        assert not result.equal and result.ranked(1)[0][0] != ""
        later = {d.module for d in result.divergences}
        assert {"net.3", "net.4"} <= later and "net.0" in later  # backward and later steps


def test_different_lengths_compare_what_both_have(runs):
    with open_recording(runs["a"]) as a, open_recording(runs["short"]) as b:
        result = diff(a, b)
        assert result.compared_steps == [0, 1, 2] and (result.steps_a, result.steps_b) == (4, 3)
        assert result.equal  # the first three steps are the same computation


def test_align_by_call_order_when_names_differ(runs, tmp_path):
    renamed = tmp_path / "renamed.py"
    renamed.write_text(SCRIPT.replace("net", "model"))
    out = hookdbg("record", "-q", "-o", tmp_path / "r.h5", renamed)
    assert out.returncode == 0, out.stderr
    with open_recording(runs["a"]) as a, open_recording(tmp_path / "r.h5") as b:
        by_name = diff(a, b)
        assert not by_name.equal and "net.0" in by_name.only_a and "model.0" in by_name.only_b
        assert diff(a, b, by="order").equal


def test_a_statistic_an_older_recording_lacks_is_not_compared(runs, tmp_path):
    """A recording made before ``absmean`` existed reads it as not measured: diffing it
    with a newer one compares what both hold, and says what it left out, instead of
    calling every row divergent."""
    from hookdbg.store import summary

    version = summary.field("absmean").since - 1  # as the previous schema wrote it
    older = with_older_summaries(runs["b"], tmp_path / "older.h5", version)
    with open_recording(runs["a"]) as a, open_recording(older) as b:
        assert b.info.schema_version == version
        result = diff(a, b, rtol=0, atol=0)
        assert result.equal and result.compared_rows > 0
        assert "absmean" not in result.stats and result.not_compared == ("absmean",)
    out = hookdbg("diff", runs["a"], older)
    assert out.returncode == 0, out.stdout
    assert "absmean not compared: a recording made by an older hookdbg lacks it" in out.stdout
    with open_recording(runs["a"]) as a, open_recording(runs["changed"]) as b:
        assert "absmean" in diff(a, b).stats  # both hold it: compared
    with open_recording(older) as a, open_recording(older) as b:
        both = diff(a, b)  # neither holds it: nothing to say
        assert "absmean" not in both.stats and both.not_compared == () and both.equal
