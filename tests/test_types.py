"""The package type-checks: ``mypy hookdbg tui`` (settings in pyproject.toml) is clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(600)
def test_mypy_is_clean():
    pytest.importorskip("mypy", reason="mypy comes with the test extra")
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "hookdbg", "tui"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success: no issues found" in out.stdout
