"""Following a recording while it is written: waiting for it, staying on the newest
step, and saying when and how the run ended."""

import signal
import subprocess
import sys
import time

from textual.widgets import DataTable

from hookdbg.read import RecordingError, open_recording
from hookdbg.store import owner
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.dialogs import WaitScreen
from hookdbg.tui.replay import ReplayScreen
from hookdbg.tui.stepbar import StepBar
from hookdbg.tui.tree import ModuleTree
from tests.helpers import LIVE_WRITER, ROOT, live_recording
from tests.tui.pilot import SIZE, notices, rows, settle, text, until

ENDS = """
import sys, time, torch
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(int(sys.argv[1])):
    opt.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    time.sleep(0.1)
sys.exit(3)
"""

# the recorder creates the file at once; the model comes a second later
LATE = """
import time, torch
time.sleep(1.0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(8):
    opt.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    time.sleep(0.1)
"""


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
            assert "● following" in text(app.screen.query_one(StepBar))


async def test_leaving_the_newest_step_stops_following_and_end_or_F_resumes(tmp_path):
    path = tmp_path / "live.h5"
    with live_recording(path, pause=0.05):
        app = HookdbgApp(open_recording(path), follow=True)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            screen, bar = app.screen, app.screen.query_one(StepBar)
            assert await until(app, pilot, lambda: len(screen.steps) > 3)
            await pilot.press("left")
            await settle(app, pilot)
            assert not screen.following and "following" not in text(bar)
            assert screen.step != screen.steps[-1]
            assert "press F to follow it" in text(screen.query_one("#notice"))
            left = screen.step
            await pilot.pause(1.5)  # new steps are written; the step shown stays
            assert screen.step == left
            await pilot.press("end")
            await settle(app, pilot)
            assert screen.following and "● following" in text(bar)
            assert await until(app, pilot, lambda: screen.step == screen.steps[-1] > left)
            await pilot.press("home")
            await settle(app, pilot)
            assert not screen.following and "following" not in text(bar)
            await pilot.press("F")
            await settle(app, pilot)
            assert screen.following and "● following" in text(bar)
            assert screen.step == screen.steps[-1]


async def test_follow_waits_for_a_recording_that_does_not_exist_yet(tmp_path):
    path = tmp_path / "later.h5"
    app = HookdbgApp(None, follow=True, wait_for=path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.5)
        assert isinstance(app.screen, WaitScreen)
        assert f"waiting for {path}…" in text(app.screen.query_one("#waiting"))
        # the recorder starts after the TUI; nothing here blocks the app while it waits
        code = LIVE_WRITER.format(path=str(path), pause=0.05)
        writer = subprocess.Popen([sys.executable, "-c", code])
        try:
            opened = await until(
                app, pilot, lambda: isinstance(app.screen, ReplayScreen), 90, workers=False
            )
            assert opened
            assert await until(app, pilot, lambda: len(app.screen.steps) > 2, 60)
            assert "● following" in text(app.screen.query_one(StepBar))
        finally:
            writer.send_signal(signal.SIGKILL)
            writer.wait()


async def test_follow_from_before_the_first_module_fills_tree_table_and_plot(tmp_path):
    """A file opened before its recorder saw a module has no modules yet: the tree, the
    tensor table and the plot fill in as they are recorded, and stay after the end."""
    script, path = tmp_path / "late.py", tmp_path / "late.h5"
    script.write_text(LATE)
    app = HookdbgApp(None, follow=True, wait_for=path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        record = [sys.executable, "-m", "hookdbg", "record", "-q", "--flush-interval", "0.1"]
        proc = subprocess.Popen([*record, "-o", str(path), str(script)])
        try:
            opened = await until(
                app, pilot, lambda: isinstance(app.screen, ReplayScreen), 90, workers=False
            )
            assert opened
            screen = app.screen
            assert len(screen.run.rec.modules) == 0  # opened before the first module call
            bar = screen.query_one(StepBar)
            assert await until(app, pilot, lambda: "recording finished" in text(bar), 90)
            await settle(app, pilot)
            tree = screen.query_one(ModuleTree)
            modules = screen.run.rec.modules
            assert {modules[m].name for m in tree._node_of} >= {"model", "model.0", "model.1"}
            assert text(screen.query_one("#detail-title")).startswith("model ")
            assert len(rows(screen.query_one("#detail-table", DataTable))) > 0
            assert "loss" in text(screen.query_one("#plot-title"))
            assert "steps 0-7" in text(screen.query_one("#plot-title"))
        finally:
            assert proc.wait(timeout=60) == 0


def first_readable(path):
    """The recording a recorder in another process is writing, once it can be read:
    opened only once the recorder holds it (a reader that opens the file between the
    recorder writing it and opening it keeps the recorder out)."""
    deadline = time.time() + 90
    while True:
        try:
            if owner.written_by_another(path):
                return open_recording(path)
        except RecordingError:
            pass
        assert time.time() < deadline, "the recorder never wrote a readable file"
        time.sleep(0.2)


async def test_the_bar_says_when_the_recording_finished(tmp_path):
    script, path = tmp_path / "ends.py", tmp_path / "ends.h5"
    script.write_text(ENDS)
    record = [sys.executable, "-m", "hookdbg", "record", "-q", "--flush-interval", "0.1"]
    proc = subprocess.Popen([*record, "-o", str(path), str(script), "30"])
    try:
        rec = first_readable(path)
        app = HookdbgApp(rec, follow=True)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            bar = app.screen.query_one(StepBar)
            assert await until(app, pilot, lambda: "recording finished" in text(bar), 60)
            assert "recording finished (30 steps, exit status 3)" in text(bar)
            assert "following" not in text(bar) and not app.screen.following
            assert app.screen.step == 29  # it stayed on the newest step to the end
            await pilot.press("F")
            assert "nothing to follow: recording finished (30 steps, exit status 3)" in notices(app)
            assert not app.screen.following
    finally:
        assert proc.wait(timeout=60) == 3


async def test_a_cut_short_recording_says_so(tmp_path):
    path = tmp_path / "cut.h5"
    with live_recording(path):
        pass  # killed at the end of the block
    app = HookdbgApp(open_recording(path))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        notice = app.screen.query_one("#notice")
        assert "cut short" in text(notice) and notice.display


async def test_R_records_the_next_steps_of_an_idle_run(tmp_path):
    """A run started idle, steered from the TUI as from `hookdbg ctl`: R, a count,
    Enter; the recorder answers, and the steps it recorded appear."""
    path, enough = tmp_path / "long.h5", tmp_path / "enough"
    record = [sys.executable, "-m", "hookdbg", "record", "-q", "--idle", "--flush-interval", "0.2"]
    script = [str(ROOT / "samples" / "long_run.py"), "--until", str(enough), "--pause", "0.02"]
    proc = subprocess.Popen([*record, "-o", str(path), *script])
    try:
        rec = first_readable(path)
        app = HookdbgApp(rec, follow=True)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            screen = app.screen
            assert isinstance(screen, ReplayScreen) and screen.steps == []  # idle
            await pilot.press("R")
            await pilot.press("backspace", "3", "enter")
            assert any("sent: record 3 steps" in n for n in notices(app)), notices(app)
            assert await until(app, pilot, lambda: len(screen.steps) == 3, 60), screen.steps
            assert await until(
                app, pilot, lambda: any("recording steps" in n for n in notices(app)), 30
            )
            assert screen.steps == list(range(screen.steps[0], screen.steps[0] + 3))
    finally:
        enough.touch()
        assert proc.wait(timeout=60) == 0
    # a finished recording cannot be steered, and says so
    app = HookdbgApp(open_recording(path))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("R")
        assert any("R steers a live run" in n for n in notices(app)), notices(app)


async def test_R_reads_the_tail_again_before_calling_a_live_run_cut_short(tmp_path):
    """Opened without following, a live run's last progress row read grew old (10 s):
    R said "not being written (cut short)" while `hookdbg ctl status` said live."""
    import numpy as np

    from hookdbg.read import Status
    from hookdbg.tui.dialogs import RecordStepsScreen

    path = tmp_path / "live.h5"
    with live_recording(path, pause=0.05):
        rec = open_recording(path)
        app = HookdbgApp(rec)
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            assert not app.screen.following
            old = np.array([rec.last_progress])
            old["time"] -= 60  # as if opened a minute ago, without sleeping through it
            rec.last_progress = old[0]
            assert rec.status is Status.CUT_SHORT
            await pilot.press("R")
            assert await until(app, pilot, lambda: isinstance(app.screen, RecordStepsScreen))
            assert not any("not being written" in n for n in notices(app)), notices(app)
