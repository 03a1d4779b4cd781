"""Random keys, thousands of them: every key the app binds and the keys any terminal
user presses, sent in bursts (as a held key or a fast typist sends them) and one at a
time, with the terminal resized now and then, on a single run, a diff and a
distributed run. The app never fails, and still answers ``?`` at the end.

Seeded: a failure names the seed and the keys that led to it, to replay them."""

from __future__ import annotations

import asyncio
import random

import pytest
from textual.binding import Binding
from textual.widgets import DataTable, Input, Tree

from hookdbg.read import open_recording, open_run
from hookdbg.tui.app import HookdbgApp, Palette
from hookdbg.tui.detail import DetailTable
from hookdbg.tui.dialogs import GotoStepScreen, HelpScreen, RecordStepsScreen
from hookdbg.tui.profile import ProfileScreen
from hookdbg.tui.replay import ReplayScreen
from hookdbg.tui.screens import AlertsScreen
from hookdbg.tui.search import SearchScreen
from hookdbg.tui.timetree import TimeTreeScreen, TimeTreeView
from hookdbg.tui.tree import ModuleTree
from tests.tui.pilot import SIZES, burst, crashed, settle

SEED = 48
KEYS_PER_RUN = 1000

# what the app's screens and widgets bind, Textual's own widgets' bindings included
BOUND = (
    HookdbgApp,
    ReplayScreen,
    ModuleTree,
    Tree,
    DetailTable,
    DataTable,
    ProfileScreen,
    AlertsScreen,
    SearchScreen,
    Input,
    TimeTreeScreen,
    TimeTreeView,
    HelpScreen,
    GotoStepScreen,
    RecordStepsScreen,
    Palette,
)
EVERYDAY = {
    *("up", "down", "left", "right", "shift+up", "shift+down", "shift+left", "shift+right"),
    *("enter", "escape", "tab", "shift+tab", "pageup", "pagedown", "home", "end"),
    *("space", "backspace", "delete", "ctrl+home", "ctrl+end"),
    *(f"ctrl+{c}" for c in "abdefhklnprtuwy"),
    *"0123456789",
}
# the keys that end the app on purpose (the palette's Quit command can too: a new app
# then goes on with the keys left)
ENDS_THE_APP = {"q", "ctrl+q"}


def the_apps_keys() -> list[str]:
    """Every key bound anywhere in the app, and the everyday ones, less those that quit."""
    bound: set[str] = set()
    for cls in BOUND:
        for klass in cls.__mro__:
            for binding in getattr(klass, "BINDINGS", ()):
                keys = binding.key if isinstance(binding, Binding) else binding[0]
                bound.update(key.strip() for key in keys.split(","))
    return sorted((bound | EVERYDAY) - ENDS_THE_APP)


async def soak(make_app, rng: random.Random, count: int) -> int:
    """Send ``count`` random keys to the apps ``make_app()`` makes (a new one when the
    palette's Quit ends one); each must never fail, and answer ``?`` at the end."""
    keys = the_apps_keys()
    sent: list[str] = []
    while len(sent) < count:
        app = make_app()
        size = rng.choice(SIZES)
        async with app.run_test(size=size) as pilot:
            await settle(app, pilot)
            while len(sent) < count and app.return_code is None:
                how = rng.random()
                chunk = rng.choices(keys, k=rng.randint(1, 5 if how < 0.1 else 40))
                if how < 0.1:  # one at a time, each handled before the next
                    for key in chunk:
                        await pilot.press(key)
                elif how < 0.4:  # typed: a little pause between keys
                    for key in chunk:
                        burst(app, [key])
                        await asyncio.sleep(rng.uniform(0.002, 0.03))
                else:  # all at once
                    burst(app, chunk)
                    await pilot.pause(0)
                if rng.random() < 0.1:
                    await settle(app, pilot)  # the screens opened and the reads done
                if rng.random() < 0.03:
                    size = rng.choice(SIZES)
                    await pilot.resize_terminal(*size)
                sent += chunk
                assert crashed(app) is None, f"seed {SEED}, at {size}, after {sent[-80:]}"
            if app.return_code is not None:  # the palette's Quit
                assert app.return_code == 0, f"seed {SEED}, after {sent[-80:]}"
                continue
            await settle(app, pilot)
            for _ in range(8):  # back to the replay, whatever is open over it
                if isinstance(app.screen, ReplayScreen):
                    break
                await pilot.press("escape")
                await settle(app, pilot)
            await pilot.press("question_mark")
            await settle(app, pilot)
            where = f"seed {SEED}, at {size}, after {sent[-80:]}"
            assert crashed(app) is None, where
            assert isinstance(app.screen, HelpScreen), f"{app.screen} on top: {where}"
    return len(sent)


@pytest.fixture(autouse=True)
def _harmless(monkeypatch, tmp_path):
    """``o`` runs an editor that does nothing; the palette's screenshots go to tmp."""
    monkeypatch.setenv("EDITOR", "true")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)


async def test_random_keys_on_a_single_run(nan_h5):
    rng = random.Random(SEED)
    assert await soak(lambda: HookdbgApp(open_recording(nan_h5)), rng, KEYS_PER_RUN) >= KEYS_PER_RUN


async def test_random_keys_on_a_diff(two_models):
    """Two models, one two layers deeper: they diverge, and b's layers a lacks can be
    browsed."""
    rng = random.Random(SEED + 1)

    def make():
        return HookdbgApp(*(open_recording(p) for p in two_models))

    assert await soak(make, rng, KEYS_PER_RUN) >= KEYS_PER_RUN


async def test_random_keys_on_a_distributed_run(ddp_nan_h5):
    rng = random.Random(SEED + 2)

    def make():
        run = open_run(ddp_nan_h5)
        ranks = [run[r] for r in run.ranks]
        return HookdbgApp(ranks[0], more_ranks=ranks[1:])

    assert await soak(make, rng, KEYS_PER_RUN) >= KEYS_PER_RUN
