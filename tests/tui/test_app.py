"""The TUI driven as a user would: keys pressed through Textual's Pilot."""

import time

import pytest
from textual.widgets import DataTable, Static

from hookdbg.read import open_recording
from hookdbg.text import num
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.screens import AlertsScreen, HelpScreen, ProfileScreen, SearchScreen
from hookdbg.tui.widgets import ModuleTree, StepBar
from tests.analysis.test_diff import SCRIPT
from tests.helpers import hookdbg, live_recording

SIZE = (160, 48)


async def settle(app, pilot):
    """Let workers finish and the screen catch up."""
    for _ in range(3):
        await pilot.pause(0.05)
        await app.workers.wait_for_complete()
    await pilot.pause(0.05)


async def until(app, pilot, condition, timeout: float = 30.0) -> bool:
    """Wait (letting the app run) until ``condition()`` holds; a busy machine is slow."""
    deadline = time.time() + timeout
    while not condition() and time.time() < deadline:
        await settle(app, pilot)
        await pilot.pause(0.2)
    return condition()


def text(widget: Static) -> str:
    return str(widget.content)


def rows(table: DataTable) -> list[list[str]]:
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def test_replay_tree_detail_and_steps(mlp_h5):
    rec = open_recording(mlp_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        tree = app.screen.query_one(ModuleTree)
        names = {rec.modules[m].name for m in tree._node_of}
        assert {"model", "model.body", "model.body.1", "model.head", "criterion"} <= names
        assert "step 0" in text(app.screen.query_one(StepBar))
        tree.select_module(rec.modules.resolve("head").id)
        await pilot.press("right", "right")
        await settle(app, pilot)
        assert "step 2" in text(app.screen.query_one(StepBar))
        assert "model.head" in text(app.screen.query_one("#detail-title"))
        shown = rows(app.screen.query_one("#detail-table", DataTable))
        want = rec.tensors(2, 2)
        want = want[want["module"] == rec.modules.resolve("head").id]
        assert sorted(r[2] for r in shown) == sorted(
            [
                "input[0]",
                "output",
                "grad_output",
                "grad_input[0]",
                "param_grad[bias]",
                "param_grad[weight]",
                "param[weight]",
                "param[bias]",
            ]
        )
        output = next(r for r in shown if r[2] == "output")
        row = want[want["slot"] == 1][0]
        assert output[5:10] == [num(row[k]) for k in ("min", "max", "mean", "std", "norm")]
        assert "output std of model.head" in text(app.screen.query_one("#plot-title"))
        await pilot.press("s")
        await settle(app, pilot)
        assert "output mean of model.head" in text(app.screen.query_one("#plot-title"))
        await pilot.press("end")
        await settle(app, pilot)
        assert "step 3" in text(app.screen.query_one(StepBar))


async def test_alerts_screen_jumps_to_the_origin(nan_h5):
    rec = open_recording(nan_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        tree = app.screen.query_one(ModuleTree)
        origin = rec.modules.resolve("standardize").id
        await pilot.press("a")
        await settle(app, pilot)
        assert isinstance(app.screen, AlertsScreen)
        [alert] = rows(app.screen.query_one(DataTable))
        assert alert[0] == "★ first" and alert[1:4] == ["3", "model.standardize", "fwd"]
        await pilot.press("enter")
        await settle(app, pilot)
        assert "step 3" in text(app.screen.query_one(StepBar))
        assert "model.standardize" in text(app.screen.query_one("#detail-title"))
        assert "NaN/inf born here" in tree.label_of(origin)
        assert "non-finite" in tree.label_of(rec.modules.resolve("proj").id)
        await pilot.press("left")  # step 2: before the NaN, no badge
        await settle(app, pilot)
        assert "born here" not in tree.label_of(origin)


async def test_search_jumps_and_walks_through_hits(nan_h5):
    app = HookdbgApp(open_recording(nan_h5))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("slash")
        assert isinstance(app.screen, SearchScreen)
        await pilot.press(*"std<0", "enter")
        await settle(app, pilot)
        assert "0 matches" in text(app.screen.query_one("#search-status"))
        await pilot.press("escape")
        await pilot.press("slash")
        query = app.screen.query_one("#query")
        query.value = ""
        await pilot.press(*"nan phase:fwd", "enter")
        await settle(app, pilot)
        hits = rows(app.screen.query_one(DataTable))
        assert hits[0][:3] == ["3", "model.standardize", "fwd"] and len(hits) > 2
        await pilot.press("enter")  # the first hit
        await settle(app, pilot)
        assert "model.standardize" in text(app.screen.query_one("#detail-title"))
        await pilot.press("n")
        await settle(app, pilot)
        assert hits[1][1] in text(app.screen.query_one("#detail-title"))
        await pilot.press("slash")
        app.screen.query_one("#query").value = "max>>"
        await pilot.press("enter")
        await settle(app, pilot)
        assert "bad query" in text(app.screen.query_one("#search-status"))


async def test_profile_sorts_and_help_opens(resnet_h5):
    app = HookdbgApp(open_recording(resnet_h5))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("p")
        await settle(app, pilot)
        assert isinstance(app.screen, ProfileScreen)
        by_self = rows(app.screen.query_one(DataTable))
        selfs = [float(r[4]) for r in by_self]
        assert selfs == sorted(selfs, reverse=True) and len(by_self) > 50
        await pilot.press("c")
        by_calls = rows(app.screen.query_one(DataTable))
        assert float(by_calls[0][3]) == 2  # the ReLUs, called twice per block
        await pilot.press("escape", "question_mark")
        await settle(app, pilot)
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.press("q")


@pytest.fixture(scope="module")
def diverging(tmp_path_factory):
    base = tmp_path_factory.mktemp("tui-diff")
    (base / "train.py").write_text(SCRIPT)
    for name, args in (("a", []), ("b", ["--change"])):
        out = hookdbg("record", "-q", "-o", base / f"{name}.h5", base / "train.py", *args)
        assert out.returncode == 0, out.stderr
    return base / "a.h5", base / "b.h5"


async def test_diff_mode_jumps_to_the_divergent_module(diverging):
    a, b = (open_recording(p) for p in diverging)
    app = HookdbgApp(a, b)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        tree = app.screen.query_one(ModuleTree)
        assert "≠" in tree.label_of(a.modules.resolve("net.3").id)
        # net.0 runs before the change: only its backward (and weights) can differ
        assert {phase for phase, _, _ in app.screen.diff.divergent_slots("net.0", 0)} <= {1, 2}
        await pilot.press("f")
        await settle(app, pilot)
        assert "net.3" in text(app.screen.query_one("#detail-title"))
        shown = rows(app.screen.query_one("#detail-table", DataTable))
        assert {r[0] for r in shown} == {"a", "b"}  # both runs, side by side


async def test_follow_shows_steps_as_they_are_written(tmp_path):
    path = tmp_path / "live.h5"
    with live_recording(path, pause=0.05):
        app = HookdbgApp(open_recording(path), follow=True)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            first = len(app.screen.steps)
            assert await until(app, pilot, lambda: len(app.screen.steps) > first + 2)
            # like tail -f, it stays on the newest step
            assert await until(app, pilot, lambda: app.screen.step == app.screen.steps[-1])
            assert "following" in text(app.screen.query_one(StepBar))


async def test_a_cut_short_recording_says_so(tmp_path):
    path = tmp_path / "cut.h5"
    with live_recording(path):
        pass  # killed at the end of the block
    app = HookdbgApp(open_recording(path))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        notice = app.screen.query_one("#notice")
        assert "cut short" in text(notice) and notice.display
