"""A real 2-process DDP run (gloo, CPU) under torchrun, recorded and read as one run."""

import json
import shutil
import subprocess

import h5py
import pytest

from hookdbg.ranks import rank_file
from hookdbg.read import RankSet, RecordingError, open_run
from hookdbg.tui.app import HookdbgApp
from tests.helpers import SAMPLES, hookdbg
from tests.helpers import torchrun as launch
from tests.tui.pilot import settle


def torchrun(out, *args: str) -> subprocess.CompletedProcess[str]:
    record = ("-m", "hookdbg", "record", "-o", out, SAMPLES / "ddp_train.py", "--steps", "5")
    return launch(*record, *args, timeout=180)


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory):
    """Rank 1 gets a NaN in its batch at step 2."""
    out = tmp_path_factory.mktemp("ddp") / "nan.h5"
    done = torchrun(out, "--nan-rank", "1", "--nan-step", "2")
    assert done.returncode == 0, done.stderr
    return out, done


@pytest.fixture(scope="module")
def desync_run(tmp_path_factory):
    """After step 2, rank 1 nudges a weight the other rank never hears about."""
    out = tmp_path_factory.mktemp("ddp") / "desync.h5"
    done = torchrun(out, "--desync-rank", "1", "--desync-step", "2")
    assert done.returncode == 0, done.stderr
    return out


def test_each_rank_writes_its_own_file_with_rank_metadata(nan_run):
    out, done = nan_run
    assert not out.exists()
    run = open_run(out)
    assert isinstance(run, RankSet) and run.ranks == [0, 1] and run.missing == []
    for rank, rec in run.recordings.items():
        assert (rec.info.rank, rec.info.world_size, rec.backend) == (rank, 2, "gloo")
        assert len(rec.recorded_steps) == 5
        names = {m.name for m in rec.modules}
        assert {"model.body.0", "model.head"} <= names and not any("module." in n for n in names)
    assert "hookdbg[rank 1]: NaN first appeared at step 2" in done.stderr


def test_summary_of_all_ranks(nan_run):
    out, _ = nan_run
    text = hookdbg("summary", out)
    assert text.returncode == 0, text.stderr
    assert "2 of 2 ranks (gloo)" in text.stdout and "stragglers: slowest was rank" in text.stdout
    assert "first NaN/inf on rank 1" in text.stdout
    data = json.loads(hookdbg("summary", out, "--json").stdout)
    assert [r["rank"] for r in data["per_rank"]] == [0, 1] and data["backend"] == "gloo"
    assert data["first_alert"]["rank"] == 1 and data["first_alert"]["step"] == 2
    assert sum(data["slowest_rank_counts"].values()) == 5
    one = hookdbg("summary", out, "--rank", "1")
    assert one.returncode == 0 and "rank 1 of 2 (gloo)" in one.stdout


def test_a_rank_summary_reads_no_ranks_tensors(nan_run, tmp_path):
    """A run's summary checks and reads each rank's steps, alerts and losses, not its
    tensor summaries: a damaged tensors column of rank 1 leaves it working, and is
    refused, in one line, by what reads it."""
    out, _ = nan_run
    for rank in (0, 1):
        shutil.copy(rank_file(out, rank), rank_file(tmp_path / "nan.h5", rank))
    with h5py.File(rank_file(tmp_path / "nan.h5", 1), "r+") as f:
        del f["tensors/std"]
    run = tmp_path / "nan.h5"
    whole = json.loads(hookdbg("summary", out, "--json").stdout)
    text = hookdbg("summary", run, "--json")
    assert text.returncode == 0, text.stderr
    assert json.loads(text.stdout)["per_rank"] == whole["per_rank"]
    shown = hookdbg("show", run, "head", "--rank", "1")
    assert shown.returncode == 2
    assert shown.stderr.strip().splitlines() == [
        f"Error: {rank_file(run, 1)} is damaged: table 'tensors' has no column 'std'"
    ]
    with pytest.raises(RecordingError, match="has no column 'std'"), open_run(run) as opened:
        opened.check()


def test_alerts_say_which_rank_saw_the_nan_first(nan_run):
    out, _ = nan_run
    data = json.loads(hookdbg("alerts", out, "--json").stdout)
    first, second = data["alerts"][:2]
    assert (first["rank"], first["step"], first["slot"]) == (1, 2, "input[0]")
    assert "came from the data" in first["message"]
    assert second["rank"] == 0 and second["slot"].startswith("step_grad")
    assert "came from another rank through the all-reduce" in second["message"]


def test_one_rank_commands_default_to_rank_0_and_take_rank(nan_run):
    out, _ = nan_run
    default = hookdbg("profile", out, "--top", "3")
    assert default.returncode == 0 and "is a 2-rank run; showing rank 0" in default.stderr
    other = hookdbg("show", out, "head", "--step", "2", "--rank", "1", "--json")
    assert other.returncode == 0, other.stderr
    shown = json.loads(other.stdout)
    assert shown["module"] == "model.head" and {r["step"] for r in shown["rows"]} == {2}
    # rank 1 saw the NaN in its own forward pass at step 2; rank 0 did not
    assert any(r["nan"] > 0 for r in shown["rows"] if r["phase"] == "fwd")
    rank0 = json.loads(hookdbg("show", out, "head", "--step", "2", "--json").stdout)
    assert not any(r["nan"] > 0 for r in rank0["rows"] if r["phase"] == "fwd")
    bad = hookdbg("profile", out, "--rank", "5")
    assert bad.returncode == 2 and "has no rank 5 (ranks 0, 1)" in bad.stderr


def test_diff_ranks_finds_the_desync(desync_run):
    found = hookdbg("diff", "--ranks", desync_run)
    assert found.returncode == 1, found.stderr
    assert "first desync: step 3, model.head param[weight]" in found.stdout
    assert "they agreed at step 2" in found.stdout
    before = hookdbg("diff", "--ranks", desync_run, "--steps", "0:3")
    assert before.returncode == 0 and "in sync" in before.stdout
    data = json.loads(hookdbg("diff", "--ranks", desync_run, "--json").stdout)
    assert data["agree"] is False and data["desyncs"][0]["step"] == 3
    # the same exit status as text or as JSON, also when nothing was compared
    assert hookdbg("diff", "--ranks", desync_run, "--steps", "0:3", "--json").returncode == 0
    for json_flag in ([], ["--json"]):  # steps past the run's end: nothing compared
        nothing = hookdbg("diff", "--ranks", desync_run, "--steps", "50:60", *json_flag)
        assert nothing.returncode == 1, nothing.stdout
    assert hookdbg("diff", "--ranks", SAMPLES / "numnet_mlp.py").returncode == 2


async def test_tui_switches_ranks(nan_run):
    run = open_run(nan_run[0])
    app = HookdbgApp(run[0], more_ranks=[run[1]])
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause(0.2)
        await settle(app, pilot)
        # it opens where the first NaN was born: rank 1's data brought it in
        assert "rank 1 of 2" in app.title and app.screen.run.rec.info.rank == 1
        await pilot.press("r")
        await pilot.pause(0.2)
        await settle(app, pilot)
        assert "rank 0 of 2" in app.title and app.screen.run.rec.info.rank == 0


async def test_tui_refuses_a_damaged_rank_when_it_would_show_it(nan_run, tmp_path):
    """The TUI checks the rank it opens on whole, another as it is first shown: rank 1's
    damaged tensors stop neither the app nor rank 0; switching to rank 1 (where the NaN
    origin it would open on lies), its alerts list or merged shards say why, in place."""
    out, _ = nan_run
    for rank in (0, 1):
        shutil.copy(rank_file(out, rank), rank_file(tmp_path / "nan.h5", rank))
    with h5py.File(rank_file(tmp_path / "nan.h5", 1), "r+") as f:
        del f["tensors/std"]
    run = open_run(tmp_path / "nan.h5")
    run[0].check()
    app = HookdbgApp(run[0], more_ranks=[run[1]])
    errors: list[str] = []  # every error said (a notification leaves the screen in time)
    notify = app.notify

    def said(message, *args, **kwargs):
        if kwargs.get("severity") == "error":
            errors.append(message)
        return notify(message, *args, **kwargs)

    app.notify = said
    why = "table 'tensors' has no column 'std'"
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause(0.2)
        await settle(app, pilot)
        assert "rank 0 of 2" in app.title and app.screen.run.rec.info.rank == 0
        assert len(errors) == 1 and why in errors[0]
        for key in ("r", "a", "G"):
            await pilot.press(key)
            await pilot.pause(0.2)
            await settle(app, pilot)
            assert app.screen.run.rec.info.rank == 0, key  # still the replay, on rank 0
            assert len(errors) == 1 + ("r", "a", "G").index(key) + 1 and why in errors[-1], key
        assert not app.screen.merged


async def test_tui_f_goes_to_the_first_origin_across_ranks(nan_run):
    """Rank 1's data brings the NaN in: from rank 0, f switches to rank 1 and its origin."""
    from hookdbg.analysis.ranks import merged_alerts

    run = open_run(nan_run[0])
    rank, first = merged_alerts(run)[0]
    assert rank == 1
    app = HookdbgApp(run[0], more_ranks=[run[1]])
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause(0.2)
        await settle(app, pilot)
        assert "f jumps to the first" in str(app.screen.query_one("#notice").content)
        await pilot.press("f")
        for _ in range(3):
            await pilot.pause(0.2)
            await settle(app, pilot)
        assert "rank 1 of 2" in app.title
        title = str(app.screen.query_one("#detail-title").content)
        module = run[1].modules[int(first["module"])].name
        assert title.startswith(f"{module} ") and f"step {int(first['step'])}" in title


CRASHES_BEFORE_ITS_OPTIMIZER_STEPS = """
import torch
model = torch.nn.Linear(8, 1)
model(torch.randn(4, 8)).pow(2).mean().backward()
raise RuntimeError("out of memory")
"""


def test_diff_ranks_says_why_it_compared_nothing(tmp_path):
    """A run that crashed before its first optimizer step has norms of nothing: the
    ranks' weights are compared after an optimizer step, and the report says so
    (both ranks' files written by the launcher's environment alone)."""
    script = tmp_path / "crash.py"
    script.write_text(CRASHES_BEFORE_ITS_OPTIMIZER_STEPS)
    for rank in (0, 1):
        env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
        out = hookdbg("record", "-q", "-o", tmp_path / "run.h5", script, env=env)
        assert out.returncode == 1 and "out of memory" in out.stderr, out.stderr
    diff = hookdbg("diff", "--ranks", tmp_path / "run.h5")
    assert diff.returncode == 1
    assert diff.stdout.splitlines()[-1] == (
        "nothing to compare: no optimizer step ran in the 1 step recorded on every rank "
        "(weights and gradients are compared after it)"
    )
    data = json.loads(hookdbg("diff", "--ranks", tmp_path / "run.h5", "--json").stdout)
    assert data["nothing_compared"].startswith("no optimizer step ran") and not data["agree"]


def test_the_ranks_table_says_how_each_rank_ended(tmp_path):
    """One rank's script raised, the other's finished: the rank's row says so."""
    finishes = tmp_path / "finishes.py"
    finishes.write_text(CRASHES_BEFORE_ITS_OPTIMIZER_STEPS.split("raise")[0])
    raises = tmp_path / "raises.py"
    raises.write_text(CRASHES_BEFORE_ITS_OPTIMIZER_STEPS)
    for rank, script in ((0, finishes), (1, raises)):
        env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
        hookdbg("record", "-q", "-o", tmp_path / "run.h5", script, env=env)
    text = hookdbg("summary", tmp_path / "run.h5").stdout
    rows = {
        line.split()[0]: line for line in text.splitlines() if line.split()[:1] in (["0"], ["1"])
    }
    assert rows["0"].split()[1] == "complete" and "exception" not in rows["0"], rows
    assert "complete: exception" in rows["1"], rows
    data = json.loads(hookdbg("summary", tmp_path / "run.h5", "--json").stdout)
    assert [r["ended"] for r in data["per_rank"]] == ["complete", "exception"]
