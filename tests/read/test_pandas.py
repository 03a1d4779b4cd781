"""``Recording.to_pandas``: every table as a DataFrame, ids and codes resolved, checked
against the reader's own rows."""

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

import hookdbg
from hookdbg.read import open_recording
from hookdbg.store.schema import Phase, Slot


def test_tensors_frame_matches_the_reader(eval_h5):
    with open_recording(eval_h5) as rec:
        df = rec.to_pandas("tensors")
        rows = rec.tensors(kind=None)
        assert len(df) == len(rows) == len(rec.tensors_table)
        assert list(df["module"]) == [rec.modules.name(int(m)) for m in rows["module"]]
        assert list(df["type"]) == [rec.modules[int(m)].type for m in rows["module"]]
        assert list(df["phase"]) == [Phase(int(p)).label for p in rows["phase"]]
        assert list(df["slot"]) == [Slot(int(s)).label for s in rows["slot"]]
        assert list(df["of"]) == [rec.segment_label(int(s)) for s in rows["segment"]]
        evals = rec.is_eval(rows["segment"])
        assert list(df["kind"] == "eval") == list(evals)
        np.testing.assert_array_equal(df["std"].to_numpy(), rows["std"])
        assert (df["nan"] == rows["nan"]).all()
        # the reader's training rows are the frame's "train" rows, in order
        train = rec.tensors()
        np.testing.assert_array_equal(df[df["kind"] == "train"]["norm"].to_numpy(), train["norm"])
        assert df.loc[0, "shape"] == "(64, 8, 8)" and df.loc[0, "of"] == "step 0"


def test_calls_steps_modules_frames(eval_h5):
    with open_recording(eval_h5) as rec:
        calls = rec.to_pandas("calls")
        assert len(calls) == len(rec.calls_table)
        fwd = calls[(calls["phase"] == "fwd") & (calls["kind"] == "train")]
        stored = rec.calls()
        np.testing.assert_array_equal(
            fwd["total"].to_numpy(), stored["total"][stored["phase"] == Phase.FWD]
        )
        steps = rec.to_pandas("steps")
        assert len(steps) == len(rec.segments)
        assert (steps["kind"] == "train").sum() == len(rec.steps) == 6
        assert (steps["kind"] == "eval").sum() == len(rec.evals) == 4
        assert steps["recorded"].dtype == bool and steps["recorded"].all()
        assert list(steps[steps["kind"] == "eval"]["of"])[:2] == ["eval batch 0", "eval batch 1"]
        modules = rec.to_pandas("modules")
        assert list(modules["name"]) == [m.name for m in rec.modules]
        assert set(modules["kind"]) == {"module", "optimizer", "loss"}


def test_alerts_frame(nan_h5):
    with open_recording(nan_h5) as rec:
        alerts = rec.to_pandas("alerts")
        assert len(alerts) == len(rec.alerts) == 1
        first = alerts.iloc[0]
        assert (first["module"], first["phase"], first["slot"]) == (
            "model.standardize",
            "fwd",
            "output",
        )
        assert first["of"] == "step 3" and first["kind"] == "train" and bool(first["first"])
        assert first["message"].startswith("NaN first appeared at step 3")


def test_step_range_and_columns(eval_h5):
    with open_recording(eval_h5) as rec:
        some = rec.to_pandas("tensors", first=1, last=2, columns=["module", "slot", "std"])
        assert list(some.columns) == ["module", "type", "slot", "std"]
        assert len(some) == len(rec.tensors(1, 2, kind=None))
        assert set(rec.to_pandas("steps", 3, 5)["step"]) == {3, 4, 5}
        with pytest.raises(ValueError, match="no table 'nope'; tables are tensors, calls"):
            rec.to_pandas("nope")
        with pytest.raises(ValueError, match="no column 'nope' in steps"):
            rec.to_pandas("steps", columns=["nope"])


def test_counts_not_looked_at_are_missing(tmp_path):
    """At --level shapes integer tensors are not looked at (counts stored as -1): <NA>."""
    model = torch.nn.Embedding(10, 3)
    with hookdbg.record(tmp_path / "ids.h5", level="shapes", quiet=True):
        model(torch.tensor([1, 2, 3])).sum().backward()
    with open_recording(tmp_path / "ids.h5") as rec:
        df = rec.to_pandas("tensors")
    assert str(df["nan"].dtype) == "Int64"
    ids = df[df["slot"] == "input"].iloc[0]
    assert ids["dtype"] == "int64" and pd.isna(ids["nan"]) and np.isnan(ids["std"])
    out = df[df["slot"] == "output"].iloc[0]
    assert out["shape"] == "(3, 3)" and np.isnan(out["std"])


def test_without_pandas_one_clear_line(eval_h5):
    code = (
        "import sys; sys.modules['pandas'] = None\n"
        "from hookdbg.read import open_recording\n"
        f"open_recording({str(eval_h5)!r}).to_pandas('steps')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert "ImportError: to_pandas needs pandas, which is not installed: pip install" in done.stderr


def test_frames_are_plain_pandas(mlp_h5):
    with open_recording(mlp_h5) as rec:
        df = rec.to_pandas("tensors")
    assert isinstance(df, pd.DataFrame)
    # what people do next: group by module
    worst = df[df["slot"] == "grad_output"].groupby("module")["norm"].max()
    assert "model.head" in worst.index
