"""Models nested deep: a chain of modules, each calling the next, records under
``hookdbg record`` wherever it trains under python."""

import subprocess
import sys

import numpy as np
import pytest

from hookdbg.read import Status, open_recording
from hookdbg.recorder import accelerated
from tests.helpers import ROOT, hookdbg

CHAIN = ROOT / "tests" / "cli" / "nested_chain.py"


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
    recorder makes room for it (recorder/recursion.py)."""
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
