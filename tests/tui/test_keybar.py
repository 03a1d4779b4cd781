"""The footer says the keys that apply here, as k9s and lazygit do: r in a multi-rank
run, n/N after a search, F and R on a live recording, G on sharded runs; whole keys
only, never one cut at 80 columns."""

import pytest

from hookdbg.read import open_recording, open_run
from hookdbg.tui.app import HookdbgApp
from hookdbg.tui.keybar import KeyBar
from tests.helpers import live_recording
from tests.tui.pilot import SIZES, settle, until

SIZE_IDS = [f"{w}x{h}" for w, h in SIZES]


def footer(app) -> str:
    """The footer's line as the terminal shows it."""
    bar = app.screen.query_one(KeyBar)
    strips = app.screen._compositor.render_strips()
    return strips[bar.region.y].crop(bar.region.x, bar.region.right).text


def assert_whole(app, size) -> list[str]:
    """Every key on the footer is one of the screen's, drawn whole; returns them."""
    bar = app.screen.query_one(KeyBar)
    line = footer(app)
    assert len(line) <= size[0]
    items = [f"{k.shown} {k.says}" for k in bar.keys]
    left = line.strip()
    shown = []
    while left:
        item = next((i for i in items if left.startswith(i)), None)
        assert item is not None, (left, line)
        shown.append(item)
        left = left[len(item) :].strip()
    return shown


def ranks_app(path):
    run = open_run(path)
    ranks = [run[r] for r in run.ranks]
    return HookdbgApp(ranks[0], more_ranks=ranks[1:])


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
async def test_r_is_on_the_footer_of_a_multi_rank_run_only(nan_h5, ddp_nan_h5, size):
    app = ranks_app(ddp_nan_h5)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        shown = assert_whole(app, size)
        assert any(s.startswith("r rank 1 of 2") for s in shown), shown
        await pilot.press("r")
        await settle(app, pilot)
        assert "r rank 0 of 2" in assert_whole(app, size)
    app = HookdbgApp(open_recording(nan_h5))
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        shown = assert_whole(app, size)
        assert not any(s.startswith("r ") for s in shown) and "f first NaN" in shown


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
async def test_n_and_N_are_on_the_footer_after_a_search_found_something(nan_h5, size):
    app = HookdbgApp(open_recording(nan_h5))
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        assert not any(s.startswith("n N") for s in assert_whole(app, size))
        await pilot.press("slash", *"nan", "enter")
        assert await until(app, pilot, lambda: app.screen.hits)
        await pilot.press("enter")
        await settle(app, pilot)
        assert "n N next/prev match" in assert_whole(app, size)


async def test_F_and_R_are_on_the_footer_of_a_live_recording(tmp_path):
    path = tmp_path / "live.h5"
    with live_recording(path):  # one recorder for every size: each takes seconds to start
        for size in SIZES:
            app = HookdbgApp(open_recording(path))
            async with app.run_test(size=size) as pilot:
                await settle(app, pilot)
                shown = assert_whole(app, size)
                assert "F follow" in shown and "R record steps" in shown, size
                await pilot.press("F")
                await settle(app, pilot)
                assert "F stop following" in assert_whole(app, size), size


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
async def test_G_is_on_the_footer_of_sharded_ranks(fsdp_h5, size):
    app = ranks_app(fsdp_h5)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        assert "G global" in assert_whole(app, size)
        await pilot.press("G")
        await settle(app, pilot)
        assert "G ranks' own" in assert_whole(app, size)
