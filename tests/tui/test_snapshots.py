"""Pictures of the main screens (pytest-textual-snapshot). Redraw them after an
intended change with: python -m pytest tests/tui/test_snapshots.py --snapshot-update"""

import os

import pytest
import textual

from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp
from tests.helpers import ROOT
from tests.tui.pilot import settle

DRAWN_WITH = "8.2.8"
pytestmark = pytest.mark.skipif(
    textual.__version__ != DRAWN_WITH,
    reason=f"the snapshots were drawn by textual {DRAWN_WITH}; redraw them for this version "
    "with --snapshot-update",
)


@pytest.fixture(autouse=True)
def _from_repository_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the recordings' names appear in the title


async def _settled(pilot):
    await settle(pilot.app, pilot)


def test_replay_screen(snap_compare):
    app = HookdbgApp(open_recording(os.path.join("tests", "data", "nan_a.h5")))
    assert snap_compare(app, terminal_size=(140, 40), run_before=_settled, press=["f", "_", "_"])


def test_diff_screen(snap_compare):
    app = HookdbgApp(
        open_recording(os.path.join("tests", "data", "nan_a.h5")),
        open_recording(os.path.join("tests", "data", "nan_b.h5")),
    )
    assert snap_compare(app, terminal_size=(140, 40), run_before=_settled, press=["f", "_", "_"])


def test_alerts_screen(snap_compare):
    app = HookdbgApp(open_recording(os.path.join("tests", "data", "nan_a.h5")))
    assert snap_compare(app, terminal_size=(140, 30), run_before=_settled, press=["a", "_"])
