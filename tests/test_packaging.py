"""What an install from PyPI gets: the sdist holds what the README links to and the
license; the wheel holds the built code, not the C sources."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from tests.helpers import ROOT

BUILD = """
import sys
from setuptools import build_meta
print("built:", getattr(build_meta, sys.argv[1])(sys.argv[2]))
"""


def _build(kind: str, source, out) -> str:
    """One ``build_meta`` hook in its own process (two in one interfere)."""
    built = subprocess.run(
        [sys.executable, "-c", BUILD, f"build_{kind}", str(out)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    return built.stdout.rsplit("built:", 1)[1].strip()


def test_the_sdist_has_samples_docs_and_license_and_the_wheel_no_c_sources(tmp_path):
    setuptools = pytest.importorskip("setuptools")
    if tuple(int(p) for p in setuptools.__version__.split(".")[:2]) < (77, 0):
        pytest.skip("pyproject.toml's build needs setuptools >= 77 (pip builds in isolation)")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    source = tmp_path / "src"
    for name in listed:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path / "dist"
    sdist, wheel = _build("sdist", source, out), _build("wheel", source, out)
    with tarfile.open(out / sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in ("LICENSE", "samples/nan_blowup.py", "docs/format.md", "README.md"):
        assert needed in names, needed
    assert "hookdbg/recorder/_hot.c" in names and "hookdbg/store/rowbuffer.h" in names
    assert "hookdbg/store/fields.h" in names  # the C extensions find the summary fields by it
    with zipfile.ZipFile(out / wheel) as whl:
        files = whl.namelist()
    assert not [f for f in files if f.endswith((".c", ".h"))], "C sources in the wheel"
    modules = {n for n in listed if n.startswith("hookdbg/") and n.endswith(".py")}
    assert sorted(modules - set(files)) == [], "modules left out of the wheel"
    assert any(f.endswith("/licenses/LICENSE") for f in files)
    assert "hookdbg/tui/hookdbg.tcss" in files
