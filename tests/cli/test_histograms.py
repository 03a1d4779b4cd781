"""``hookdbg record --histograms N``, then ``show`` and ``export --format tensorboard``,
each run as a user runs them."""

import json

import numpy as np
import pytest

from hookdbg.analysis.histograms import sparkline
from hookdbg.read import open_recording
from tests.helpers import SAMPLES, hookdbg


@pytest.fixture(scope="module")
def hist_h5(tmp_path_factory):
    path = tmp_path_factory.mktemp("hist") / "run.h5"
    out = hookdbg(
        "record", "--histograms", "8", "-o", path, SAMPLES / "numnet_mlp.py", "--steps", "3"
    )
    assert out.returncode == 0, out.stderr
    return path


def test_record_then_show_prints_the_histograms(hist_h5):
    out = hookdbg("show", hist_h5, "model.head", "--step", "1")
    assert out.returncode == 0, out.stderr
    assert "histograms: 8 bins, min to max" in out.stdout
    with open_recording(hist_h5) as rec:
        rows = rec.tensors(1, 1, columns=["module", "slot", "histogram"])
        output = rows[(rows["module"] == rec.modules.resolve("head").id) & (rows["slot"] == 1)]
        assert output["histogram"][0].sum() == 64 * 10  # batch 64, 10 classes
    assert sparkline(output["histogram"][0]) in out.stdout
    data = json.loads(hookdbg("show", hist_h5, "model.head", "--step", "1", "--json").stdout)
    shown = next(r for r in data["rows"] if r["slot"] == "output")
    assert shown["histogram"] == output["histogram"][0].tolist()


def test_show_without_histograms_has_no_histogram_table(mlp_h5):
    out = hookdbg("show", mlp_h5, "model.head", "--step", "1")
    assert out.returncode == 0 and "histograms:" not in out.stdout
    data = json.loads(hookdbg("show", mlp_h5, "model.head", "--step", "1", "--json").stdout)
    assert all("histogram" not in r for r in data["rows"])


@pytest.mark.parametrize("value", ["0", "-3", "abc", "1025", "2.5"])
def test_bad_bin_counts_are_one_line_and_exit_2(tmp_path, value):
    out = hookdbg(
        "record", "--histograms", value, "-o", tmp_path / "x.h5", SAMPLES / "numnet_mlp.py"
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"Error: --histograms must be a whole number of bins from 1 to 1,024, not {value!r}"
    ]
    assert not (tmp_path / "x.h5").exists()


def test_histograms_below_level_stats_is_one_line(tmp_path):
    out = hookdbg(
        "record",
        "--level",
        "shapes",
        "--histograms",
        "8",
        "-o",
        tmp_path / "x.h5",
        SAMPLES / "numnet_mlp.py",
    )
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "--histograms needs --level stats" in out.stderr


def test_tensorboard_export_has_the_recorded_histograms(hist_h5, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = tmp_path / "runs"
    out = hookdbg("export", hist_h5, "--format", "tensorboard", "-o", logdir, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["runs"]["train"]["histograms"] > 0
    events = EventAccumulator(str(logdir / "train"), size_guidance={"histograms": 0})
    events.Reload()
    tags = events.Tags()["histograms"]
    assert {
        "model.head/output/histogram",
        "model.head/grad_output/histogram",
        "model.head/param_grad[weight]/histogram",
        "model.head/param[weight]/histogram",
    } <= set(tags)
    with open_recording(hist_h5) as rec:
        rows = rec.tensors(columns=["step", "module", "slot", "min", "max", "histogram"])
        mine = rows[(rows["module"] == rec.modules.resolve("head").id) & (rows["slot"] == 1)]
    shown = events.Histograms("model.head/output/histogram")
    assert [h.step for h in shown] == [0, 1, 2]
    for h, row in zip(shown, mine, strict=True):
        value = h.histogram_value
        assert value.bucket == row["histogram"].tolist()
        assert value.min == row["min"] and value.max == row["max"]
        edges = np.linspace(row["min"], row["max"], 9)
        np.testing.assert_allclose(value.bucket_limit, edges[1:])
    # --stat picks histograms like the scalars
    only = tmp_path / "only"
    out = hookdbg(
        "export", hist_h5, "--format", "tensorboard", "-o", only, "--stat", "output/histogram"
    )
    assert out.returncode == 0 and "no statistic matched" not in out.stderr
    events = EventAccumulator(str(only / "train"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["loss", "step_ms"]  # always there
    assert all(t.endswith("/output/histogram") for t in events.Tags()["histograms"])
