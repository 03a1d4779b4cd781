"""The alerts screen as a user meets it: the list of origins, and under it the
highlighted alert's run-up, read back from the screen."""

from hookdbg.analysis.runup import TITLE
from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.screens import AlertsScreen
from tests.helpers import hookdbg
from tests.tui.pilot import SIZE, settle, text


async def test_the_alerts_screen_shows_the_highlighted_alerts_run_up(fp16_h5):
    app = HookdbgApp(open_recording(fp16_h5))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("a")
        await settle(app, pilot)
        assert isinstance(app.screen, AlertsScreen)
        shown = text(app.screen.query_one("#alert-run-up"))
        assert "run-up, last 5 recorded steps" in shown
        # a cell below 1% of the dtype's max shows no share: the title says so
        assert TITLE in shown
        [output] = [line for line in shown.splitlines() if line.lstrip().startswith("output ")]
        assert "(50%)" in output and output.rstrip().endswith(" inf"), shown  # model.0's
        # model.0's op was found by running it again: the alert's own words say it
        assert "the op:" not in shown
        await pilot.press("down")  # the second alert: model.2, fed by model.0's inf
        await settle(app, pilot)
        second = text(app.screen.query_one("#alert-run-up"))
        assert second != shown and "input[0]" in second and "inf" in second
        assert "the op:" not in second


_BACKWARD_BORN = """
import torch
from torch import nn

class Length(nn.Module):
    def forward(self, x):
        return torch.sqrt((x * x).sum(-1, keepdim=True))

torch.manual_seed(0)
proj, length = nn.Linear(4, 4), Length()
opt = torch.optim.SGD(proj.parameters(), lr=0.1)
for step in range(5):
    keep = torch.ones(8, 1)
    keep[0] = 0.0 if step >= 1 else 1.0
    h = proj(torch.randn(8, 4)) * keep
    loss = length(h).mean()
    opt.zero_grad()
    loss.backward()
    if all(torch.isfinite(p.grad).all() for p in proj.parameters()):
        opt.step()
"""


async def test_the_alerts_screen_shows_the_op_the_watch_found(tmp_path):
    """A NaN born in a backward pass: its op is named when it comes again, in a line of
    its own; the alerts screen shows it under the highlighted alert."""
    script = tmp_path / "train.py"
    script.write_text(_BACKWARD_BORN)
    out = hookdbg("record", "-q", "-o", tmp_path / "run.h5", script, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    app = HookdbgApp(open_recording(tmp_path / "run.h5"))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("a")
        await settle(app, pilot)
        shown = text(app.screen.query_one("#alert-run-up"))
        assert "the op: made by aten::div in SqrtBackward0 (inf) from train.py:7" in shown
