"""``hookdbg export --format tensorboard``, read back with TensorBoard's own reader."""

import json
import subprocess
import sys

import numpy as np
import pytest

from hookdbg.read import open_recording
from hookdbg.store.schema import Phase, Slot
from tests.helpers import hookdbg

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def accumulator(path):
    events = EventAccumulator(str(path))
    events.Reload()
    return events


def points(events, tag):
    return [(e.step, e.value) for e in events.Scalars(tag)]


def f32(values):
    """TensorBoard keeps scalars as float32."""
    return [float(np.float32(v)) for v in values]


@pytest.fixture(scope="module")
def eval_tb(eval_h5, tmp_path_factory):
    out = tmp_path_factory.mktemp("tb") / "runs" / "hookdbg"
    done = hookdbg("export", eval_h5, "--format", "tensorboard", "-o", out, "--json")
    assert done.returncode == 0, done.stderr
    return out, json.loads(done.stdout)


def test_training_values_are_the_readers(eval_h5, eval_tb):
    out, summary = eval_tb
    train = accumulator(out / "train")
    with open_recording(eval_h5) as rec:
        head = rec.modules.resolve("model.head").id
        rows = rec.tensors(columns=["step", "module", "slot", "path", "std", "norm"])
        mine = rows[(rows["module"] == head) & (rows["slot"] == Slot.OUTPUT)]
        steps, first = np.unique(mine["step"], return_index=True)  # first call per step
        assert points(train, "model.head/output/std") == list(
            zip(steps.tolist(), f32(mine["std"][first]), strict=True)
        )
        calls = rec.calls(columns=["step", "module", "phase", "total"])
        bwd = calls[(calls["module"] == head) & (calls["phase"] == Phase.BWD)]
        expected = [float(bwd["total"][bwd["step"] == s].sum() * 1e3) for s in steps]
        bwd_ms = list(zip(steps.tolist(), f32(expected), strict=True))
        assert points(train, "model.head/bwd_ms") == bwd_ms
        assert [s for s, _ in points(train, "step_ms")] == rec.steps["step"].tolist()
        losses = rec.losses  # one backward pass per step: the loss is its value
        assert points(train, "loss") == list(
            zip(losses["step"].tolist(), f32(losses["value"]), strict=True)
        )
    tags = train.Tags()["scalars"]
    assert "model.body.1/param_grad[weight]/norm" in tags  # the defaults
    assert "model.body.1/output/max" not in tags
    assert summary["runs"]["train"]["scalars"] == sum(len(train.Scalars(t)) for t in tags)


def test_eval_batches_are_their_own_run_at_the_global_step(eval_h5, eval_tb):
    out, summary = eval_tb
    evals = accumulator(out / "eval")
    with open_recording(eval_h5) as rec:
        head = rec.modules.resolve("model.head").id
        rows = rec.tensors(columns=["step", "segment", "module", "slot", "std"], kind=None)
        mine = rows[(rows["module"] == head) & (rows["slot"] == Slot.OUTPUT)]
        mine = mine[rec.is_eval(mine["segment"])]
        # validation after steps 2 and 5: global steps 3 and 6, each the mean of 2 batches
        expected = [(s, float(mine["std"][mine["step"] == s].mean())) for s in (3, 6)]
    got = points(evals, "model.head/output/std")
    assert [s for s, _ in got] == [3, 6]
    assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-6)
    assert "model.head/bwd_ms" not in evals.Tags()["scalars"]  # forward only
    assert set(summary["runs"]) == {"train", "eval"} and summary["format"] == "tensorboard"


def test_alerts_as_text(nan_h5, tmp_path):
    done = hookdbg("export", nan_h5, "--format", "tensorboard", "-o", tmp_path / "tb")
    assert done.returncode == 0, done.stderr
    assert "wrote train" in done.stderr and "tensorboard --logdir" in done.stderr
    train = accumulator(tmp_path / "tb" / "train")
    alerts = train.Tensors("alerts/text_summary")
    assert [a.step for a in alerts] == [3]
    text = alerts[0].tensor_proto.string_val[0].decode()
    assert "NaN first appeared at step 3 in model.standardize" in text


def test_modules_and_statistics_are_selectable(mlp_h5, tmp_path):
    done = hookdbg(
        "export",
        mlp_h5,
        "--format",
        "tensorboard",
        "-o",
        tmp_path / "tb",
        "--modules",
        "body.*",
        "--modules",
        "!*.1",
        "--stat",
        "output/m*",
        "--stat",
        "fwd_ms",
    )
    assert done.returncode == 0, done.stderr
    tags = set(accumulator(tmp_path / "tb" / "train").Tags()["scalars"]) - {"step_ms", "loss"}
    modules = {t.split("/")[0] for t in tags}
    assert modules == {"model.body.0", "model.body.2", "model.body.3", "model.body.4"}
    assert {t.partition("/")[2] for t in tags} == {
        "output/max",
        "output/mean",
        "output/min",
        "fwd_ms",
    }
    again = hookdbg("export", mlp_h5, "--format", "tensorboard", "-o", tmp_path / "tb")
    assert again.returncode == 2 and "pass --force" in again.stderr
    forced = hookdbg("export", mlp_h5, "--format", "tensorboard", "-o", tmp_path / "tb", "-f")
    assert forced.returncode == 0 and len(list((tmp_path / "tb" / "train").iterdir())) == 1


@pytest.mark.parametrize("stat", ["sat_frac", "absmean"])
def test_a_declared_statistic_is_a_scalar(mlp_h5, tmp_path, stat):
    """A summary field TensorBoard offers (hookdbg/store/summary.py) plots with no code
    of its own: a ReLU's output is at its min (0) half the time, and its values' mean
    magnitude is their mean (none is below 0)."""
    out = tmp_path / "tb"
    args = ("--modules", "body.2", "--stat", f"output/{stat}")
    done = hookdbg("export", mlp_h5, "--format", "tensorboard", "-o", out, *args)
    assert done.returncode == 0, done.stderr
    rec = open_recording(mlp_h5)
    rows = rec.tensors(columns=["step", "module", "phase", "slot", stat, "mean"])
    rows = rows[
        (rows["module"] == rec.modules.resolve("body.2").id) & (rows["slot"] == Slot.OUTPUT)
    ]
    got = points(accumulator(out / "train"), f"model.body.2/output/{stat}")
    assert got == list(zip(rows["step"].tolist(), f32(rows[stat]), strict=True))
    if stat == "sat_frac":
        assert all(0.3 < v < 0.7 for _, v in got)
    else:
        assert [v for _, v in got] == pytest.approx(f32(rows["mean"]), rel=1e-6)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--stat", "output/median"], "unknown statistic 'output/median'"),
        (["--modules", "!"], "empty module glob"),
        (["-o", "-"], "writes a directory: give it with -o DIR"),
    ],
)
def test_bad_options_one_line(mlp_h5, tmp_path, args, message):
    done = hookdbg("export", mlp_h5, "--format", "tensorboard", "-o", tmp_path / "x", *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_without_tensorboard_one_line(mlp_h5, tmp_path):
    code = (
        "import sys; sys.modules['tensorboard'] = None\n"
        "from hookdbg.cli import main\n"
        f"main(['export', {str(mlp_h5)!r}, '--format', 'tensorboard', '-o', {str(tmp_path)!r}])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "Error: --format tensorboard needs the tensorboard package, which is not installed: "
        "pip install 'hookdbg[tensorboard]'"
    )
