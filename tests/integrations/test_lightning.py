"""PyTorch Lightning's ``Trainer.fit`` recorded through ``HookdbgCallback``: real fits
of a tiny model on CPU, read back with hookdbg's reader."""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("lightning")

from hookdbg.integrations.lightning import HookdbgCallback
from hookdbg.options import OptionError
from hookdbg.read import RankSet, open_recording, open_run
from hookdbg.recorder import RecordError
from tests.helpers import ROOT, free_port, hookdbg
from tests.integrations.lit_model import LitNet, loaders, trainer


@pytest.mark.parametrize(
    ("accum", "evals"),
    [
        (1, 6),  # 2 sanity-check batches, 2 after step 3, 2 after step 6
        (2, 8),  # validation every 3 batches: 3 times, twice in the middle of a step
    ],
)
def test_fit_steps_are_the_trainers_global_steps(tmp_path, accum, evals):
    callback = HookdbgCallback(str(tmp_path / "run.h5"), quiet=True)
    fit = trainer(callback, accum)
    model = LitNet()
    fit.fit(model, *loaders())
    assert fit.global_step == 6 and callback.recorder is None  # closed
    with open_recording(tmp_path / "run.h5") as rec:
        assert rec.end is not None and rec.end["status"] == b"complete"
        assert (len(rec.steps), len(rec.evals)) == (fit.global_step, evals)
        assert rec.steps["step"].tolist() == list(range(6))
        names = {m.name for m in rec.modules}
        assert {"model", "model.backbone.1", "model.backbone.3"} <= names


def test_nan_stops_the_trainer_and_the_recording_says_so(tmp_path, capfd):
    callback = HookdbgCallback(str(tmp_path / "run.h5"), on_nan="stop")
    fit = trainer(callback)
    model = LitNet(nan_at=2)
    fit.fit(model, *loaders())  # returns: no exception
    assert fit.global_step == 3  # the batch with the NaN finished, then it stopped
    err = capfd.readouterr().err
    assert "hookdbg: NaN first appeared at step 2 in model (LitNet)" in err
    assert "on_nan='stop': a NaN/inf origin; stopping the trainer at global step 3" in err
    assert "recorded 3 steps, 4 eval batches, 1 alert" in err and "status stopped" in err
    with open_recording(tmp_path / "run.h5") as rec:
        assert rec.end["status"] == b"stopped" and rec.end["exit_code"] == 0
        assert b"the trainer stopped at global step 3" in rec.end["message"]
        assert len(rec.steps) == 3 and len(rec.alerts) == 1
        assert rec.alerts["step"][0] == 2
    summary = hookdbg("summary", tmp_path / "run.h5")
    assert "stopped at the first NaN/inf origin" in summary.stdout


def test_an_exception_in_training_closes_the_recording(tmp_path):
    callback = HookdbgCallback(str(tmp_path / "run.h5"), quiet=True)
    fit = trainer(callback)
    model = LitNet(fail_at=1)
    with pytest.raises(RuntimeError, match="the data loader broke"):
        fit.fit(model, *loaders())
    with open_recording(tmp_path / "run.h5") as rec:
        assert rec.end["status"] == b"exception"
        assert rec.end["message"] == b"RuntimeError: the data loader broke"
        assert len(rec.steps) == 1


def test_bad_options_fail_before_training(tmp_path):
    with pytest.raises(TypeError, match="unknown hookdbg option 'levl'"):
        HookdbgCallback(str(tmp_path / "run.h5"), levl="stats")
    with pytest.raises(OptionError, match="unknown on_nan action 'explode'; use one of: record"):
        HookdbgCallback(str(tmp_path / "run.h5"), on_nan="explode")
    with pytest.raises(OptionError, match=r"^every must be at least 1"):
        HookdbgCallback(str(tmp_path / "run.h5"), every=0)
    (tmp_path / "old.rank1.h5").touch()
    with pytest.raises(RecordError, match="already exists; pass force=True"):
        HookdbgCallback(str(tmp_path / "old.h5"))


DDP = """
import sys
from hookdbg.integrations.lightning import HookdbgCallback
from tests.integrations.lit_model import LitNet, loaders, trainer

fit = trainer(HookdbgCallback("run.h5", on_nan="stop"), devices=2, strategy="ddp")
model = LitNet(nan_at=2, nan_rank=1)
fit.fit(model, *loaders())
print("rank", fit.global_rank, "global_step", fit.global_step)
"""


def test_ddp_writes_one_file_per_rank_and_every_rank_stops(tmp_path):
    """Lightning's own launcher starts rank 1 (it sets no RANK); the NaN is on rank 1
    only, and both ranks stop at the same step (else rank 0 would wait forever)."""
    (tmp_path / "ddp.py").write_text(textwrap.dedent(DDP))
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_PORT": str(port)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "ddp.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    assert "rank 0 global_step 3" in done.stdout and "rank 1 global_step 3" in done.stdout
    assert not (tmp_path / "run.h5").exists()
    with open_run(tmp_path / "run.h5") as run:
        assert isinstance(run, RankSet) and run.ranks == [0, 1]
        for rank, rec in run.recordings.items():
            assert (rec.info.rank, rec.info.world_size) == (rank, 2)
            assert rec.end["status"] == b"stopped" and len(rec.steps) == 3
            names = {m.name for m in rec.modules}
            assert "model.backbone.1" in names  # not wrapper_module... nor module.
            assert not any("wrapper" in n or "_forward_module" in n for n in names)
        assert rec.backend == "gloo"
        first = run[1].alerts
        assert first["step"][0] == 2 and b"model (LitNet) forward input" in first["message"][0]


CLI = """
from hookdbg.integrations.lightning import HookdbgCallback
from tests.integrations.lit_model import LitNet, loaders, trainer

fit = trainer(HookdbgCallback("callback.h5"))
model = LitNet()
fit.fit(model, *loaders())
"""


def test_under_hookdbg_record_the_callback_steps_aside(tmp_path):
    (tmp_path / "lit.py").write_text(textwrap.dedent(CLI))
    env = {"PYTHONPATH": str(ROOT)}
    done = hookdbg("record", "-o", tmp_path / "cli.h5", "lit.py", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert "a hookdbg recording is already running in this process" in done.stderr
    assert not (tmp_path / "callback.h5").exists()
    with open_recording(tmp_path / "cli.h5") as rec:
        assert len(rec.steps) == 6


def test_importable_without_the_frameworks():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["lightning"] = sys.modules["pytorch_lightning"] = None
        sys.modules["transformers"] = None
        import hookdbg, hookdbg.integrations, hookdbg.cli, hookdbg.read, hookdbg.recorder
        try:
            import hookdbg.integrations.lightning
        except ImportError as exc:
            print(exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "needs PyTorch Lightning: pip install 'hookdbg[lightning]'" in done.stdout


def test_a_stop_that_could_never_fire_is_refused_when_the_callback_is_made(tmp_path):
    with pytest.raises(OptionError, match="needs NaN checks: drop nan_check=False"):
        HookdbgCallback(str(tmp_path / "run.h5"), on_nan="stop", nan_check=False)
