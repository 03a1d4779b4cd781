"""The TUI says what the recording says: where a NaN came from on each rank, which steps
AMP's GradScaler skipped, and an attention mask's -inf as what it is."""

import re

import pytest

from hookdbg.read import open_recording, open_run
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.detail import DetailTable
from hookdbg.tui.stepbar import StepBar
from hookdbg.tui.tree import ModuleTree
from tests.helpers import SAMPLES
from tests.tui.pilot import SIZE, SMALL, records, settle, text


def labels(app) -> dict[str, str]:
    """Each module's line in the tree, by its full name."""
    tree = app.screen.query_one(ModuleTree)
    modules = app.screen.run.rec.modules
    return {m.name: tree.label_of(m.id) for m in modules if m.is_model_part}


async def test_ranks_say_where_the_nan_came_from_and_alerts_list_every_rank(ddp_nan_h5):
    run = open_run(ddp_nan_h5)
    ranks = [run[r] for r in run.ranks]
    app = HookdbgApp(ranks[0], more_ranks=ranks[1:])
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("f")  # rank 1's origin, the first
        await settle(app, pilot)
        assert app.screen.run.rec.info.rank == 1 and app.screen.step == 2
        root = labels(app)["model"]
        assert "◆data" in root and "◆NaN" not in root
        said = app.screen.query_one(ModuleTree).explain(app.screen.module)
        assert said is not None and "NaN/inf came in from the data" in said.plain

        await pilot.press("a")
        await settle(app, pilot)
        assert "2 NaN/inf alerts on 2 of 2 ranks" in text(app.screen.query_one("#screen-title"))
        shown = records(app.screen.query_one("#alerts-table"))
        assert [(r["rank"], r["module"]) for r in shown] == [("1", "model"), ("0", "model.body.0")]
        assert shown[0][""] == "★ first" and shown[1][""] == ""
        await pilot.press("down", "enter")  # rank 0's alert: the replay goes to rank 0
        await settle(app, pilot)
        assert app.screen.run.rec.info.rank == 0 and app.screen.step == 2
        assert app.screen.module == ranks[0].modules.resolve("body.0").id
        assert "◆rank" in labels(app)["model.body.0"]


@pytest.fixture(scope="module")
def amp_h5(tmp_path_factory):
    """The GradScaler's scale starts far too large: steps 0-5 overflow and are
    skipped, 6 and 7 train."""
    from tests.conftest import _record

    return _record(tmp_path_factory, "amp", SAMPLES / "amp_scaler.py", "--steps", "8")


async def test_gradscaler_skipped_steps_are_said_and_their_warnings_muted(amp_h5):
    app = HookdbgApp(open_recording(amp_h5))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        bar = text(app.screen.query_one(StepBar))
        assert "step 0" in bar
        assert "skipped by the GradScaler (inf/NaN gradients, expected under fp16)" in bar
        shown = labels(app)
        assert not any("⚠" in line for line in shown.values())
        assert re.search(r"\b\d+ skip\b", shown["model.body.0"])
        app.screen.go_to(6)  # a step the optimizer took
        await settle(app, pilot)
        assert "skipped" not in text(app.screen.query_one(StepBar))
    app = HookdbgApp(open_recording(amp_h5))
    async with app.run_test(size=SMALL) as pilot:  # 80 columns: fewer words, a timeline
        await settle(app, pilot)
        bar = text(app.screen.query_one(StepBar))
        assert "skipped by the GradScaler" in bar and "▲" in bar


# a causal -inf attention mask, as nn.Transformer makes it, into a 2-layer encoder
MASKED = """
import torch
from torch import nn

torch.manual_seed(0)


class Causal(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 1)

    def forward(self, x, mask):
        return self.head(self.enc(x, mask=mask, is_causal=True))


model = Causal()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mask = nn.Transformer.generate_square_subsequent_mask(8)
for step in range(3):
    opt.zero_grad()
    model(torch.randn(2, 8, 16), mask).pow(2).mean().backward()
    opt.step()
"""


@pytest.fixture(scope="module")
def masked_h5(tmp_path_factory):
    from tests.conftest import _record

    script = tmp_path_factory.mktemp("masked") / "masked.py"
    script.write_text(MASKED)
    return _record(tmp_path_factory, "masked", script)


async def test_an_attention_mask_reads_minus_inf_without_alarm(masked_h5):
    rec = open_recording(masked_h5)
    assert not len(rec.alerts)  # the recorder holds it for a mask too
    app = HookdbgApp(rec)
    async with app.run_test(size=SIZE) as pilot:
        for step in rec.recorded_steps:
            app.screen.go_to(int(step), rec.modules.resolve("enc.layers.0").id)
            await settle(app, pilot)
            shown = labels(app)
            assert not any("⚠" in line or "◆" in line for line in shown.values())
            assert "-inf ×28" in shown["model.enc.layers.0"]  # 8x8 causal: 28 -inf
        table = app.screen.query_one(DetailTable)
        mask = next(r for r in records(table) if r["slot"] == "input[src_mask]")
        # min and max of the tensor, not of its finite values (0 and 0)
        assert (mask["nan/inf"], mask["min"], mask["max"]) == ("-inf ×28", "-inf", "0")
        i = next(i for i, r in enumerate(records(table)) if r["slot"] == "input[src_mask]")
        assert not any(cell.style for cell in table.get_row_at(i))  # no tint, no red


async def test_the_opening_notice_says_the_first_nan_came_in_rather_than_was_born(ddp_nan_h5):
    """The notice said "opened where the first was born: model" where the alert said the
    NaN came in from the data, and rank 0's that it came from another rank."""
    run = open_run(ddp_nan_h5)
    ranks = [run[r] for r in run.ranks]
    for views, said in (
        (ranks, "opened where the first came in from the data: model, step 2"),
        (ranks[:1], "opened where the first came in from another rank: model.body.0, step 2"),
    ):
        app = HookdbgApp(views[0], more_ranks=views[1:])
        async with app.run_test(size=SMALL) as pilot:
            await settle(app, pilot)
            notice = text(app.screen.query_one("#notice"))
            assert said in notice and "born" not in notice, notice
