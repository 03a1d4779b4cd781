"""Sharded training recorded under torchrun on CPU (gloo): FSDP2 (per block and at the
root, resharding after forward or not, a mixed-precision policy), tensor parallel (an
MLP and an attention block split by columns and rows, a norm on sequence shards), FSDP2
over tensor parallel on a 2-D mesh of 4 ranks, and DDP around a compiled model. Every
rank records every step, training is bitwise the same, the shards merge into the
global tensors' statistics, and a NaN born in one rank's shard is named on that rank.
The strategies run in tests/cli/sharded_train.py."""

import json
import math
from pathlib import Path

import pytest

from hookdbg.read import Status, open_run
from hookdbg.store.schema import Phase, Slot
from hookdbg.text import utf8
from tests.helpers import hookdbg
from tests.helpers import torchrun as launch

SCRIPT = Path(__file__).with_name("sharded_train.py")
STEPS = 3


def torchrun(ranks: int, out: Path) -> dict[str, dict]:
    """Run the strategies on ``ranks`` processes; what rank 0 printed, by strategy."""
    done = launch(SCRIPT, out, ranks=ranks, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    return {c["case"]: c for c in map(json.loads, done.stdout.splitlines())}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    out = tmp_path_factory.mktemp("sharded")
    return out, torchrun(2, out)


def assert_recorded_truly(out: Path, case: dict, ranks: int) -> None:
    """Training the same, every step on every rank, and the global norms of the
    weights merged from the shards equal those of the full tensors."""
    assert case["recorded"] == case["plain"], case["case"]  # bitwise
    assert case["live"], f"{case['case']}: the recording stopped on an internal error"
    with open_run(out / f"{case['case']}.h5") as run:
        assert run.ranks == list(range(ranks))
        for rank in run.ranks:
            rec = run[rank]
            assert rec.status is Status.COMPLETE and len(rec.steps) == STEPS, (case, rank)
        rec = run[0]
        last = int(rec.steps["step"][-1])
        merged = run.global_tensors(0, rec.tensors(last, last))
        weights = merged[(merged["phase"] == Phase.OPT) & (merged["slot"] == Slot.PARAM)]
        norms = {}
        for row in weights:
            name = rec.modules.name(int(row["module"])).removeprefix("net.")
            norms[f"{name}.{utf8(row['path'])}"] = float(row["norm"])
        full = {k.replace("module._orig_mod.", ""): v for k, v in case["norms"].items()}
        assert norms.keys() == full.keys()
        for name, value in full.items():
            assert norms[name] == pytest.approx(value, rel=1e-9), (case["case"], name)


@pytest.mark.parametrize(
    "strategy", ["fsdp", "fsdp_keep_mixed", "tp", "sequence_parallel", "ddp_compiled"]
)
def test_two_ranks_record_every_step_with_global_statistics(two_ranks, strategy):
    out, cases = two_ranks
    assert_recorded_truly(out, cases[strategy], 2)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    out = tmp_path_factory.mktemp("sharded2d")
    return out, torchrun(4, out)


def test_fsdp_over_tensor_parallel_on_a_2d_mesh_of_four_ranks(four_ranks):
    out, cases = four_ranks
    assert_recorded_truly(out, cases["fsdp_tp"], 4)
    diff = hookdbg("diff", "--ranks", out / "fsdp_tp.h5")  # tensor-parallel replicas
    assert diff.returncode == 0 and "replicated weights and gradients agree" in diff.stdout
    with open_run(out / "fsdp_tp.h5") as run:
        q = next(
            p
            for (m, ph, s, path), p in run[0].shards.items()
            if path == "weight" and run[0].modules.name(m) == "net.0.q" and ph == Phase.OPT
        )
        assert q.holders() == [0, 1, 2, 3] and len(q.placements) == 2  # dp and tp


def test_replicas_of_a_shard_on_sub_meshes_alike_are_compared(four_ranks):
    """FSDP2 over tensor parallel shards the norm, which tensor parallel leaves whole,
    over each tensor-parallel rank's data-parallel sub-mesh ([0, 2] and [1, 3]): ranks
    0 and 1 hold replicas of the same piece. Rank 1's, changed at step 1, differs."""
    out, _ = four_ranks
    diff = hookdbg("diff", "--ranks", out / "fsdp_tp_desync.h5", "--json", "--top", "100")
    assert diff.returncode == 1, diff.stdout
    desyncs = json.loads(diff.stdout)["desyncs"]
    assert desyncs[0]["step"] == 1, desyncs[0]
    nudged = [d for d in desyncs if (d["module"], d["slot"]) == ("net.0.norm", "param[weight]")]
    assert nudged and nudged[0]["step"] == 1 and set(nudged[0]["norms"]) == {"0", "1"}, nudged


def test_the_reports_say_what_sharding_does(two_ranks):
    out, _ = two_ranks
    shown = hookdbg("show", out / "fsdp.h5", "net.0.q", "--step", "2", "--global")
    assert shown.returncode == 0, shown.stderr
    note = next(line for line in shown.stdout.splitlines() if "global: " in line)
    assert "merged from their ranks' shards (S(0) from ranks 0,1)" in note, note
    # a row-parallel Linear's output is a partial sum: named as the rank's own
    tp = hookdbg("show", out / "tp.h5", "net.0.out", "--step", "2", "--global").stdout
    note = next(line for line in tp.splitlines() if "global: " in line)
    assert "kept as rank 0's own values, not the global tensor's: fwd output" in note, note
    fsdp = hookdbg("diff", "--ranks", out / "fsdp.h5")
    assert fsdp.returncode == 0, fsdp.stdout  # one copy of each weight: nothing can drift
    assert "sharded tensors" in fsdp.stdout and "every parameter is sharded" in fsdp.stdout
    assert "no replicated parameter" in fsdp.stdout
    tp = hookdbg("diff", "--ranks", out / "tp.h5")  # replicated biases still compare
    assert tp.returncode == 0 and "replicated weights and gradients agree" in tp.stdout
    nan = hookdbg("diff", "--ranks", out / "tp_nan.h5")
    assert nan.returncode == 1 and "not finite on every rank" in nan.stdout


@pytest.mark.parametrize(
    ("strategy", "run"),
    [
        ("tp_nan", "two_ranks"),
        ("tp_inside_nan", "two_ranks"),
        ("fsdp_nan", "two_ranks"),
        ("fsdp_tp_nan", "four_ranks"),
    ],
)
def test_a_nan_born_in_one_ranks_shard_is_named_on_that_rank_only(strategy, run, request):
    """Rank 1's shard of a weight goes NaN between two steps: rank 1 names it, in its
    shard; the ranks that get it through a collective (tensor parallel's reduction,
    after a module's hook or inside its forward as torchtitan's; FSDP2's all-gather; on
    a 2-D mesh both: there FSDP2 gathers a tensor-parallel piece, whose local tensor is
    no rank's own shard) name no origin: each says once, where it arrived, that it came
    from another rank."""
    out, cases = request.getfixturevalue(run)
    for run in ("plain", "recorded"):  # the same run: NaN from step 1, as unrecorded
        losses = cases[strategy][run]
        assert not math.isnan(losses[0]) and all(map(math.isnan, losses[1:])), (run, losses)
    found = json.loads(hookdbg("alerts", out / f"{strategy}.h5", "--json").stdout)["alerts"]
    origins = [a for a in found if "came from another rank" not in a["message"]]
    assert {a["rank"] for a in origins} == {1}, [a["message"] for a in found]
    first = found[0]
    assert (first["rank"], first["step"], first["module"], first["slot"]) == (
        1,
        1,
        "net.0.q",
        "param[weight]",
    )
    assert "in this rank's shard of it" in first["message"]
    assert "outside the optimizer" in first["message"]  # every step was recorded
    received = [a for a in found if a not in origins]
    with open_run(out / f"{strategy}.h5") as whole:
        others = [r for r in whole.ranks if r != 1]
    assert sorted(a["rank"] for a in received) == others, [a["message"] for a in received]
    assert {a["step"] for a in received} == {1}
    summary = json.loads(hookdbg("summary", out / f"{strategy}.h5", "--json").stdout)
    for rank in summary["per_rank"]:  # each rank's own loss, NaN from step 1 on
        assert rank["loss"]["nonfinite_step"] == 1 and rank["loss"]["nonfinite_kind"] == "NaN"
    assert summary["per_rank"][0]["loss"]["first"] == [0, pytest.approx(losses[0])]


def test_an_optimizer_container_is_one_step_on_every_rank(two_ranks):
    """torchtitan's OptimizersContainer steps an AdamW per model part inside its own
    step: one optimizer row a step, each weight's and step gradient's row once."""
    out, _ = two_ranks
    with open_run(out / "tp_inside_nan.h5") as run:
        for rank in run.ranks:
            rec = run[rank]
            opt = rec.calls_table.column("phase") == Phase.OPT
            assert int(opt.sum()) == STEPS, rank
            rows = rec.tensors(0, STEPS - 1)
            for slot in (Slot.PARAM, Slot.STEP_GRAD):
                mine = rows[(rows["phase"] == Phase.OPT) & (rows["slot"] == slot)]
                keys = [(int(r["step"]), int(r["module"]), bytes(r["path"])) for r in mine]
                assert keys and len(keys) == len(set(keys)), (rank, slot)


def test_the_tensor_parallel_nan_alert_counts_this_ranks_shard(two_ranks):
    out, _ = two_ranks
    found = json.loads(hookdbg("alerts", out / "tp_nan.h5", "--json").stdout)["alerts"]
    assert "1 NaN of 128 values" in found[0]["message"]  # its shard: half the weight


async def test_the_tui_shows_global_statistics_with_g(two_ranks):
    """G in the TUI turns each rank's shard rows of the selected module into the global
    tensors' (their placement and ranks in a column of their own), and back."""
    from hookdbg.cells import num, shape_text
    from hookdbg.tui.app import HookdbgApp
    from hookdbg.tui.messages import Goto
    from tests.tui.pilot import notices, records, settle, text, until

    out, _ = two_ranks
    with open_run(out / "fsdp.h5") as run:
        rec, more = run[0], [run[r] for r in run.ranks[1:]]
        module = rec.modules.resolve("net.0.q").id
        last = int(rec.steps["step"][-1])
        merged = run.global_tensors(0, rec.tensors(last, last))
        app = HookdbgApp(rec, more_ranks=more)
        async with app.run_test(size=(220, 50)) as pilot:  # wide: every column shown
            await settle(app, pilot)
            app.screen.post_message(Goto(module=module, step=last))
            await settle(app, pilot)
            table = app.screen.query_one("#detail-table")
            local = records(table)
            assert "global" not in local[0]
            shard = next(r for r in local if r["slot"] == "param[weight]")
            await pilot.press("G")
            assert await until(app, pilot, lambda: "global" in records(table)[0])
            title = text(app.screen.query_one("#detail-title"))
            assert "merged from the ranks' shards" in title
            weight = next(r for r in records(table) if r["slot"] == "param[weight]")
            assert weight["global"].startswith("S(0) from ranks 0,1")
            row = merged[(merged["module"] == module) & (merged["slot"] == Slot.PARAM)]
            assert weight["max"] == num(float(row["max"][0]))  # the global tensor's
            assert weight["shape"] == shape_text(row["shape"][0]) != shard["shape"]
            await pilot.press("G")
            assert await until(app, pilot, lambda: "global" not in records(table)[0])
            assert "each rank's own shard statistics" in notices(app)
        # at an everyday width the global view keeps the norm: all a weight's row has
        app = HookdbgApp(rec, more_ranks=more)
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(app, pilot)
            app.screen.post_message(Goto(module=module, step=last))
            await settle(app, pilot)
            await pilot.press("G")
            merged_title = "merged from the ranks' shards"  # the columns may leave out 'global'
            assert await until(app, pilot, lambda: merged_title in title_of(app))
            weight = next(r for r in records(table_of(app)) if r["slot"] == "param[weight]")
            assert weight["norm"] == num(float(row["norm"][0]))


def table_of(app):
    return app.screen.query_one("#detail-table")


def title_of(app) -> str:
    from tests.tui.pilot import text

    return text(app.screen.query_one("#detail-title"))
