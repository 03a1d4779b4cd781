"""The keys lazygit, k9s and htop users reach for: j/k and h/l in the module tree,
PgUp/PgDn paging the tree (steps page with [ ] and { }), s/S through the plots, and o
opening a module's forward in $EDITOR."""

import os
import sys
from pathlib import Path

import pytest
from torch import nn

from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.detail import DetailTable
from hookdbg.tui.keybar import KeyBar, fitted
from hookdbg.tui.model import PLOT_STATS
from hookdbg.tui.tree import ModuleTree
from tests.helpers import ROOT, SAMPLES
from tests.tui.pilot import SIZE, SIZES, SMALL, notices, settle, text


def shown(app) -> str:
    """The module the screen shows."""
    return app.screen.run.rec.modules.name(app.screen.module)


async def test_j_k_move_and_h_l_fold_and_unfold_the_tree(mlp_h5):
    app = HookdbgApp(open_recording(mlp_h5))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        tree = app.screen.query_one(ModuleTree)
        step = app.screen.step
        assert shown(app) == "model"
        await pilot.press("j", "j")
        await settle(app, pilot)
        assert shown(app) == "model.body.0"
        await pilot.press("k")
        await settle(app, pilot)
        assert shown(app) == "model.body"
        body = tree.cursor_node
        assert body is not None and body.is_expanded
        await pilot.press("h")  # folds the branch, stays on it
        await settle(app, pilot)
        assert not body.is_expanded and shown(app) == "model.body"
        await pilot.press("h")  # folded: up to its parent
        await settle(app, pilot)
        assert shown(app) == "model"
        await pilot.press("l")  # unfolded already: into its first child
        await settle(app, pilot)
        assert shown(app) == "model.body"
        await pilot.press("l")  # unfolds it
        await settle(app, pilot)
        assert body.is_expanded and shown(app) == "model.body"
        await pilot.press("l", "l")  # into it; a leaf stays
        await settle(app, pilot)
        assert shown(app) == "model.body.0"
        assert app.screen.step == step  # h and l no longer step


async def test_pgup_pgdn_page_the_tree_and_brackets_page_the_steps(resnet_h5):
    app = HookdbgApp(open_recording(resnet_h5))
    async with app.run_test(size=SMALL) as pilot:
        await settle(app, pilot)
        tree = app.screen.query_one(ModuleTree)
        page = tree.scrollable_content_region.height
        assert tree.last_line + 1 > page  # a tree longer than its window
        step = app.screen.step
        await pilot.press("pagedown")
        await settle(app, pilot)
        assert tree.cursor_line == page - 1 and app.screen.step == step
        assert shown(app) == app.screen.run.rec.modules.name(tree.cursor_node.data)
        await pilot.press("ctrl+u")  # half a page up
        await settle(app, pilot)
        assert tree.cursor_line == page - 1 - page // 2
        await pilot.press("ctrl+d", "pageup")
        await settle(app, pilot)
        assert tree.cursor_line == 0 and shown(app) == "model"
        await pilot.press("ctrl+f")
        await settle(app, pilot)
        assert tree.cursor_line == page - 1
        await pilot.press("right_square_bracket")  # steps page with ] (two steps here)
        await settle(app, pilot)
        assert app.screen.step == app.screen.steps[-1]
        await pilot.press("left_square_bracket")
        await settle(app, pilot)
        assert app.screen.step == app.screen.steps[0]


async def test_the_footer_shows_the_nan_hunting_keys_first(nan_h5):
    """What fits in the footer at 100 columns: alerts, search, first; wider, how to
    page through steps and open the source too (all keys are in ?)."""
    for width, wanted in ((100, {"a", "/", "f", "p"}), (200, {"[ ]", "o", "a", "/", "f"})):
        app = HookdbgApp(open_recording(nan_h5))
        async with app.run_test(size=(width, 30)) as pilot:
            await settle(app, pilot)
            bar = app.screen.query_one(KeyBar)
            shown = {k.shown for k in fitted(bar.keys, bar.size.width)}
            assert wanted <= shown, (width, shown)


async def test_s_and_S_cycle_the_plot_both_ways(mlp_h5):
    app = HookdbgApp(open_recording(mlp_h5))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        title = app.screen.query_one("#plot-title")
        assert app.screen.stat == 0 and "loss" in text(title)
        await pilot.press("S")  # back from the first: the last
        await settle(app, pilot)
        assert app.screen.stat == len(PLOT_STATS) - 1
        assert text(title).startswith(PLOT_STATS[-1].label)
        await pilot.press("s", "s")
        await settle(app, pilot)
        assert app.screen.stat == 1 and text(title).startswith(PLOT_STATS[1].label)
        await pilot.press("S")
        await settle(app, pilot)
        assert app.screen.stat == 0 and "loss" in text(title)


# an editor that writes the arguments it was given to a file
EDITOR = "import sys; open(sys.argv[1], 'w').write(chr(10).join(sys.argv[2:]))"


def _editor(tmp_path: Path) -> tuple[str, Path]:
    script, out = tmp_path / "editor.py", tmp_path / "argv.txt"
    script.write_text(EDITOR)
    return f"{sys.executable} {script} {out}", out


def _forward_line(path: Path, cls: str) -> int:
    lines = path.read_text().splitlines()
    start = lines.index(next(x for x in lines if x.startswith(f"class {cls}(")))
    return next(i for i, x in enumerate(lines) if i > start and "def forward" in x) + 1


async def test_o_opens_the_module_forward_in_the_editor(mlp_h5, tmp_path, monkeypatch):
    command, out = _editor(tmp_path)
    monkeypatch.setenv("EDITOR", command)
    monkeypatch.delenv("VISUAL", raising=False)
    rec = open_recording(mlp_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("o")  # the model: the script's own class
        sample = SAMPLES / "numnet_mlp.py"
        assert out.read_text().splitlines() == [
            f"+{_forward_line(sample, 'NumNet')}",
            str(sample.resolve()),
        ]
        app.screen.go_to(module=rec.modules.resolve("head").id)
        await settle(app, pilot)
        await pilot.press("o")  # a torch module: torch's file, at its forward
        forward = nn.Linear.forward
        assert out.read_text().splitlines() == [
            f"+{forward.__code__.co_firstlineno}",
            os.path.abspath(forward.__code__.co_filename),
        ]
        # $VISUAL where $EDITOR is not set; and what goes wrong is said
        out.unlink()
        monkeypatch.delenv("EDITOR")
        monkeypatch.setenv("VISUAL", command)
        await pilot.press("o")
        assert out.read_text().splitlines()[0] == f"+{forward.__code__.co_firstlineno}"
        monkeypatch.delenv("VISUAL")
        await pilot.press("o")
        assert "set $EDITOR (or $VISUAL) to open a module's code with o" in notices(app)
        monkeypatch.setenv("EDITOR", "false")
        await pilot.press("o")
        assert "false exited with status 1" in notices(app)
        monkeypatch.setenv("EDITOR", str(tmp_path / "no-such-editor"))
        await pilot.press("o")
        assert any(n.startswith("cannot run ") for n in notices(app))


async def test_o_on_a_recording_without_sources_says_so(tmp_path, monkeypatch):
    """tests/data/nan_a.h5 was written before the recorder noted where modules are."""
    command, out = _editor(tmp_path)
    monkeypatch.setenv("EDITOR", command)
    app = HookdbgApp(open_recording(ROOT / "tests" / "data" / "nan_a.h5"))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("o")
        assert not out.exists()
        assert any("record it again to open modules' code" in n for n in notices(app))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_shift_arrows_move_across_the_table_whatever_has_the_focus(mlp_h5, size):
    """As the help says: the tree's own shift+arrows (to the parent, to the next
    ancestor) moved its selection instead."""
    rec = open_recording(mlp_h5)
    app = HookdbgApp(rec)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        app.screen.go_to(module=rec.modules.resolve("body.0").id)
        await settle(app, pilot)
        tree = app.screen.query_one(ModuleTree)
        table = app.screen.query_one(DetailTable)
        assert tree.has_focus
        start = table.cursor_coordinate.column
        await pilot.press("shift+right", "shift+right")
        await settle(app, pilot)
        assert shown(app) == "model.body.0" and tree.has_focus  # the tree stays
        assert table.cursor_coordinate.column == start + 2
        await pilot.press("shift+left")
        await settle(app, pilot)
        assert table.cursor_coordinate.column == start + 1 and shown(app) == "model.body.0"
        await pilot.press("tab", "shift+right")  # in the table, the same
        await settle(app, pilot)
        assert table.has_focus and table.cursor_coordinate.column == start + 2
