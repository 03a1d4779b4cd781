"""Models nested deep: a chain of modules, each calling the next, records under
``hookdbg record`` wherever it trains under python, and every reader takes what was
recorded, however deep."""

import json
import subprocess
import sys

import numpy as np
import pytest

from hookdbg.read import Status, open_recording
from hookdbg.recorder import accelerated
from tests.helpers import ROOT, hookdbg

CHAIN = ROOT / "tests" / "cli" / "nested_chain.py"


def test_every_reader_takes_a_model_nested_1000_deep(deep_h5):
    with open_recording(deep_h5) as rec:
        assert rec.status is Status.COMPLETE
        assert max(m.depth for m in rec.modules) == 1000  # Link 999 deep, its lin 1000
        assert int(rec.calls_table.column("depth").max()) == 1000
    summary = hookdbg("summary", deep_h5)
    assert summary.returncode == 0, summary.stderr
    assert "modules    2000, 20,000 parameters" in summary.stdout
    assert "(depth 1000) " in summary.stdout  # indented so far, then the depth said
    as_json = json.loads(hookdbg("summary", deep_h5, "--json").stdout)
    assert max(line["depth"] for line in as_json["module_table"]) == 1000
    show = hookdbg("show", deep_h5, "model.inner.inner.lin")
    assert show.returncode == 0, show.stderr
    assert show.stdout.startswith("model.inner.inner.lin (Linear), steps 0-1")
    profile = hookdbg("profile", deep_h5)
    assert profile.returncode == 0, profile.stderr
    assert "steps 0-1 (2 recorded)" in profile.stdout


@pytest.fixture(scope="module")
def deepest() -> int:
    """The deepest chain python trains under its default recursion limit, run as a
    script the way ``hookdbg record`` runs it."""
    out = subprocess.run(
        [sys.executable, CHAIN, "--deepest"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


@pytest.mark.parametrize("pure", [False, True], ids=["c", "python"])
def test_a_chain_as_deep_as_python_trains_records_too(tmp_path, deepest, pure):
    """torch adds a frame per nested call while global hooks are installed: the
    recorder makes room for it (recorder/hooks/recursion.py)."""
    path = tmp_path / "run.h5"
    env = {accelerated.PURE_PYTHON: "1" if pure else ""}
    out = hookdbg("record", "-q", "-o", path, CHAIN, str(deepest), "--steps", "1", env=env)
    assert out.returncode == 0 and "RecursionError" not in out.stderr, out.stderr[-2000:]
    assert out.stdout == f"trained a chain {deepest} deep\n"
    with open_recording(path) as rec:
        assert rec.status is Status.COMPLETE
        depths = rec.calls_table.column("depth")
        assert int(depths.max()) == deepest  # the innermost Link's lin
        assert int(np.count_nonzero(rec.calls_table.column("phase") == 0)) == 2 * deepest
