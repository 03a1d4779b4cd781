"""The TUI's view model computes what the widgets show, from the reader alone."""

import numpy as np

from hookdbg.read import open_recording
from hookdbg.store.schema import Phase, Slot
from hookdbg.tui.model import PLOT_STATS, PlotStat, RunView


def test_step_table_badges(nan_h5):
    run = RunView(open_recording(nan_h5))
    modules = run.rec.modules
    standardize = modules.resolve("standardize").id
    before, born = run.step_table(2), run.step_table(3)
    assert not before[standardize].origin and before[standardize].nonfinite == 0
    assert born[standardize].origin and born[standardize].nonfinite >= 1
    proj = modules.resolve("proj").id
    assert born[proj].nonfinite >= 1 and not born[proj].origin
    assert 0 < sum(m.share for m in before.values()) <= 1.0


def test_detail_and_series_match_the_reader(mlp_h5):
    rec = open_recording(mlp_h5)
    run = RunView(rec)
    head = rec.modules.resolve("head").id
    detail = run.detail(head, 2)
    rows = rec.tensors(2, 2)
    assert len(detail.rows) == np.count_nonzero(rows["module"] == head)
    assert set(detail.timings["phase"]) == {Phase.FWD, Phase.BWD}
    steps, values = run.series(head, next(s for s in PLOT_STATS if s.label == "output std"))
    expected = rows[(rows["module"] == head) & (rows["slot"] == Slot.OUTPUT)]["std"][0]
    assert list(steps) == [0, 1, 2, 3] and values[2] == expected
    _, fwd_ms = run.series(head, next(s for s in PLOT_STATS if s.column == "fwd"))
    assert len(fwd_ms) == 4 and np.all(fwd_ms > 0)
    grads = run.series(head, next(s for s in PLOT_STATS if s.label == "weight grad norm"))
    assert len(grads[0]) == 4 and np.all(grads[1] > 0)
    assert PLOT_STATS[0].of_run  # the loss, whatever the module
    steps, values = run.series(head, PLOT_STATS[0])
    assert steps.tolist() == rec.losses["step"].tolist() == [0, 1, 2, 3]
    assert values.tolist() == rec.losses["value"].tolist()
    assert run.loss_label().startswith("loss (numnet_mlp.py:")


def test_first_origin_across_ranks_and_nearest_step(nan_h5, mlp_h5):
    from hookdbg.tui.model import first_origin, nearest_step

    nan, clean = RunView(open_recording(nan_h5)), RunView(open_recording(mlp_h5))
    standardize = nan.rec.modules.resolve("standardize").id
    assert first_origin([clean, nan]) == (1, 3, standardize)
    assert first_origin([clean]) is None
    assert [nearest_step([0, 10, 20], s) for s in (-5, 4, 6, 14, 99)] == [0, 0, 10, 10, 20]


def test_a_not_recorded_statistic_is_left_out_of_a_series(nan_h5):
    run = RunView(open_recording(nan_h5))
    proj = run.rec.modules.resolve("proj").id
    weight_mean = PlotStat("weight mean", Slot.PARAM, "mean", "weight")  # only the norm is kept
    steps, _ = run.series(proj, weight_mean)
    assert 3 in steps.tolist() and 0 not in steps.tolist()  # NaN at 3 is real: its grad was NaN
