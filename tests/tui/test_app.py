"""The TUI driven as a user would: keys pressed through Textual's Pilot, and what is on
screen read back."""

import pytest
from textual.widgets import DataTable

from hookdbg.cells import cell_text, fraction_text
from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.dialogs import HelpScreen
from hookdbg.tui.keybar import KeyBar, fitted
from hookdbg.tui.messages import Goto
from hookdbg.tui.plot import Plot
from hookdbg.tui.profile import ProfileScreen
from hookdbg.tui.screens import AlertsScreen
from hookdbg.tui.search import SearchScreen
from hookdbg.tui.stepbar import StepBar
from hookdbg.tui.tree import ModuleTree
from tests.analysis.test_diff import SCRIPT
from tests.helpers import hookdbg
from tests.tui.pilot import SIZE, SMALL, records, rows, settle, text


async def test_replay_tree_detail_and_steps(mlp_h5):
    rec = open_recording(mlp_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        tree = app.screen.query_one(ModuleTree)
        names = {rec.modules[m].name for m in tree._node_of}
        assert {"model", "model.body", "model.body.1", "model.head", "criterion"} <= names
        assert "step 0" in text(app.screen.query_one(StepBar))
        app.screen.post_message(Goto(module=rec.modules.resolve("head").id))  # as the finder does
        await pilot.press("right", "right")
        await settle(app, pilot)
        assert "step 2" in text(app.screen.query_one(StepBar))
        assert "model.head" in text(app.screen.query_one("#detail-title"))
        shown = records(app.screen.query_one("#detail-table", DataTable))
        want = rec.tensors(2, 2)
        want = want[want["module"] == rec.modules.resolve("head").id]
        assert sorted(r["slot"] for r in shown) == sorted(
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
        output = next(r for r in shown if r["slot"] == "output")
        row = want[want["slot"] == 1][0]
        assert [output[k] for k in ("min", "max", "mean", "std", "norm")] == [
            cell_text(row[k], 0) for k in ("min", "max", "mean", "std", "norm")
        ]
        weight = next(r for r in shown if r["slot"] == "param[weight]")
        assert weight["mean"] == "-" and weight["norm"] != "-"  # not recorded, not NaN
        assert "loss (numnet_mlp.py:" in text(app.screen.query_one("#plot-title"))
        await pilot.press("s")
        await settle(app, pilot)
        assert "output std of model.head" in text(app.screen.query_one("#plot-title"))
        await pilot.press("s")
        await settle(app, pilot)
        assert "output mean of model.head" in text(app.screen.query_one("#plot-title"))
        await pilot.press("end")
        await settle(app, pilot)
        assert "step 3" in text(app.screen.query_one(StepBar))


async def test_a_wide_detail_shows_each_fraction_the_summary_declares(mlp_h5):
    """The detail's columns follow hookdbg/store/summary.py: zeros, the values at the
    min or max (``sat``), half of a ReLU's output (its zeros), and the mean of |x|."""
    rec = open_recording(mlp_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=(240, 48)) as pilot:
        await settle(app, pilot)
        app.screen.post_message(Goto(module=rec.modules.resolve("body.2").id))
        await settle(app, pilot)
        shown = records(app.screen.query_one("#detail-table", DataTable))
        want = rec.tensors(0, 0)
        want = want[(want["module"] == rec.modules.resolve("body.2").id) & (want["slot"] == 1)]
        output = next(r for r in shown if r["slot"] == "output")
        assert output["zeros"] == fraction_text(want["zero_frac"][0])
        assert output["sat"] == fraction_text(want["sat_frac"][0]) != "-"
        # a statistic declared after min..norm gets its own column: absmean
        assert output["absmean"] == cell_text(float(want["absmean"][0]), 0) != "-"


async def test_plots_of_a_module_returning_a_dict_or_tuple_show_its_first_tensor(
    dict_output_h5,
):
    """A Hugging Face style model returns {"loss", "logits"} and attention a tuple: their
    output statistics are plotted of the first tensor output, and the title says which."""
    rec = open_recording(dict_output_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        plot_title = app.screen.query_one("#plot-title")
        await pilot.press("s")  # output std
        await settle(app, pilot)
        assert "output std of model (output[loss])   steps 0-4" in text(plot_title)
        app.screen.go_to(module=rec.modules.resolve("attn").id)
        await settle(app, pilot)
        assert "output std of model.attn (output[0])   steps 0-4" in text(plot_title)
        assert app.screen.query_one("#plot-a", Plot)._buckets  # drawn
        await pilot.press("s", "s", "s")  # grad norm (w.r.t. output)
        await settle(app, pilot)
        assert "grad norm (w.r.t. output) of model.attn (grad_output[0])" in text(plot_title)
        assert "not recorded" not in text(plot_title)
        app.screen.go_to(module=rec.modules.resolve("head").id)  # a plain output: as it is
        await settle(app, pilot)
        assert "grad norm (w.r.t. output) of model.head   steps 0-4" in text(plot_title)


async def test_alerts_screen_jumps_to_the_origin(nan_h5):
    rec = open_recording(nan_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        notice = text(app.screen.query_one("#notice"))  # a line at the top, not a toast
        assert notice.startswith("1 NaN/inf alert — f jumps to the first")
        tree = app.screen.query_one(ModuleTree)
        origin = rec.modules.resolve("standardize").id
        await pilot.press("home", "up")  # away from the origin it opened on: step 0, model
        await settle(app, pilot)
        assert "step 0" in text(app.screen.query_one(StepBar))
        await pilot.press("a")
        await settle(app, pilot)
        assert isinstance(app.screen, AlertsScreen)
        assert text(app.screen.query_one("#screen-title")) == "1 NaN/inf alert: where it was born"
        [alert] = rows(app.screen.query_one(DataTable))
        assert alert[0] == "★ first" and alert[1:4] == ["3", "model.standardize", "fwd"]
        await pilot.press("enter")
        await settle(app, pilot)
        assert "step 3" in text(app.screen.query_one(StepBar))
        assert "model.standardize" in text(app.screen.query_one("#detail-title"))
        assert "◆NaN" in tree.label_of(origin)
        assert "⚠" in tree.label_of(rec.modules.resolve("proj").id)
        await pilot.press("left")  # step 2: before the NaN, no badge
        await settle(app, pilot)
        assert "◆" not in tree.label_of(origin)


async def test_search_jumps_and_n_walks_through_matching_modules(nan_h5):
    app = HookdbgApp(open_recording(nan_h5))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("slash")
        assert isinstance(app.screen, SearchScreen)
        await pilot.press(*"std<0", "enter")
        await settle(app, pilot)
        assert text(app.screen.query_one("#search-status")) == "0 tensor summaries match 'std<0'"
        await pilot.press("escape")
        await pilot.press("slash")
        app.screen.query_one("#query").value = ""
        await pilot.press(*"nan phase:fwd", "enter")
        await settle(app, pilot)
        hits = rows(app.screen.query_one(DataTable))
        assert hits[0][:3] == ["3", "model.standardize", "fwd"] and len(hits) > 2
        assert "; Enter jumps, n/N" in text(app.screen.query_one("#search-status"))
        places = list(dict.fromkeys((h[0], h[1]) for h in hits))
        await pilot.press("enter")  # the first hit
        await settle(app, pilot)
        assert "model.standardize" in text(app.screen.query_one("#detail-title"))
        await pilot.press("n")  # the next module, not the next row of this one
        await settle(app, pilot)
        step, module = places[1]
        assert module != "model.standardize"
        title = text(app.screen.query_one("#detail-title"))
        assert f"{module} " in title and f"step {step}" in title
        await pilot.press("N")
        await settle(app, pilot)
        assert "model.standardize" in text(app.screen.query_one("#detail-title"))
        await pilot.press("slash")
        app.screen.query_one("#query").value = "max>>"
        await pilot.press("enter")
        await settle(app, pilot)
        assert "bad query" in text(app.screen.query_one("#search-status"))


async def test_profile_sorts_covers_all_steps_with_a_and_help_opens(resnet_h5):
    app = HookdbgApp(open_recording(resnet_h5))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("p")
        await settle(app, pilot)
        assert isinstance(app.screen, ProfileScreen)
        assert "profile of step 0" in text(app.screen.query_one("#screen-title"))
        assert "enter: go to the module" in text(app.screen.query_one("#screen-title"))
        by_self = rows(app.screen.query_one(DataTable))
        selfs = [float(r[4]) for r in by_self]
        assert selfs == sorted(selfs, reverse=True) and len(by_self) > 50
        await pilot.press("c")
        by_calls = rows(app.screen.query_one(DataTable))
        assert float(by_calls[0][3]) == 2  # the ReLUs, called twice per block
        await pilot.press("a")
        await settle(app, pilot)
        title = app.screen.query_one("#screen-title")
        assert "profile of steps 0-1 (2)" in text(title)
        await pilot.press("end")  # the title stays on screen below a long table
        assert title.region.y == 0 and title.display
        await pilot.press("a")
        await settle(app, pilot)
        assert "profile of step 0" in text(app.screen.query_one("#screen-title"))
        await pilot.press("escape", "question_mark")
        await settle(app, pilot)
        assert isinstance(app.screen, HelpScreen)
        keys = text(app.screen.query_one("#help-keys"))
        assert "profile: the step's parts, then modules; enter goes to one" in keys
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


async def test_diff_opens_on_the_first_divergence_kept_apart_from_backward_spill(diverging):
    a, b = (open_recording(p) for p in diverging)
    app = HookdbgApp(a, b)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        tree = app.screen.query_one(ModuleTree)
        net3 = a.modules.resolve("net.3").id
        # on open, without a key: unfolded to it, selected, marked
        assert "net.3" in text(app.screen.query_one("#detail-title"))
        assert tree.cursor_node is not None and tree.cursor_node.data == net3
        assert "★first" in tree.label_of(net3)
        assert "≠fwd" in tree.label_of(net3) and "≠bwd" not in tree.label_of(net3)
        # net.0 runs before the change: only its backward can differ, and says so
        assert "≠bwd" in tree.label_of(a.modules.resolve("net.0").id)
        assert "first divergence: net.3" in text(app.screen.query_one("#notice"))
        shown = records(app.screen.query_one("#detail-table", DataTable))
        assert {r["run"] for r in shown} == {"a", "b"}  # both runs, side by side
        await pilot.press("down")  # the cursor really is on net.3: down goes on from it
        await settle(app, pilot)
        assert "net.4" in text(app.screen.query_one("#detail-title"))
        await pilot.press("f")
        await settle(app, pilot)
        assert "net.3" in text(app.screen.query_one("#detail-title"))


async def test_help_scrolls_and_fits_a_small_terminal_whose_footer_keeps_help_and_quit(mlp_h5):
    app = HookdbgApp(open_recording(mlp_h5))
    async with app.run_test(size=SMALL) as pilot:
        await settle(app, pilot)
        footer = app.screen.query_one(KeyBar)
        assert {"?", "q"} <= {k.shown for k in fitted(footer.keys, footer.size.width)}
        await pilot.press("question_mark")
        await settle(app, pilot)
        help_box = app.screen.query_one("#help")
        assert help_box.region.right <= SMALL[0] and help_box.region.bottom <= SMALL[1]
        assert help_box.max_scroll_y > 0
        await pilot.press("end")
        await settle(app, pilot)
        assert help_box.scroll_y == help_box.max_scroll_y > 0
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
