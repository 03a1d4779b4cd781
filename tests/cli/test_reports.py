"""The report commands as users run them: real subprocesses on real recordings."""

import csv
import io
import json

import pytest

from hookdbg.read import open_recording
from tests.helpers import SAMPLES, hookdbg


def run_json(*args):
    out = hookdbg(*args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_summary_of_resnet18(resnet_h5):
    out = hookdbg("summary", resnet_h5)
    assert out.returncode == 0, out.stderr
    assert "complete" in out.stdout and "resnet_fakedata.py" in out.stdout
    assert "2 (2 recorded)" in out.stdout and "data lost  none" in out.stdout
    lines: dict[str, str] = {}
    for line in out.stdout.splitlines():  # the first line per short name: the stem's conv1
        if line.strip():
            lines.setdefault(line.split()[0], line)
    assert "(4, 64, 16, 16)" in lines["conv1"] and "9,408" in lines["conv1"]
    assert "(4, 10)" in lines["fc"] and "11,181,642" in lines["model"]
    assert not any(line != line.rstrip() for line in out.stdout.splitlines())
    data = run_json("summary", resnet_h5)
    assert data["status"] == "complete" and data["recorded_steps"] == 2
    assert data["parameters"] == 11_181_642 and data["dropped_rows"] == 0
    conv1 = next(m for m in data["module_table"] if m["name"] == "model.conv1")
    assert conv1["output_shape"] == "(4, 64, 16, 16)" and conv1["fwd_seconds"] > 0


def test_profile_table_and_json(resnet_h5):
    out = hookdbg("profile", resnet_h5, "--top", "5", "--phase", "bwd")
    assert out.returncode == 0, out.stderr
    # the table's rows: module, type, phase... (a loss site's row is named after the loss)
    rows = [w for w in map(str.split, out.stdout.splitlines()) if w[2:3] in (["fwd"], ["bwd"])]
    assert len(rows) == 5 and all(w[2] == "bwd" for w in rows), out.stdout
    data = run_json("profile", resnet_h5, "--step", "1", "--sort", "calls")
    assert data["first_step"] == data["last_step"] == 1
    assert data["rows"][0]["calls_per_step"] == 2  # the ReLUs called twice per block
    assert sum(r["share"] for r in data["rows"]) <= 1.0


def test_alerts_names_the_origin_and_shows_finite_inputs(nan_h5):
    out = hookdbg("alerts", nan_h5)
    assert out.returncode == 0, out.stderr
    assert "FIRST alert 1: NaN first appeared at step 3 in model.standardize" in out.stdout
    assert "its inputs" in out.stdout and "input[0]" in out.stdout
    data = run_json("alerts", nan_h5)
    [alert] = data["alerts"]
    assert alert["module"] == "model.standardize" and alert["first"] and alert["slot"] == "output"
    assert alert["tensor"]["nan"] == 16 and alert["context"][0]["nan"] == 0
    assert hookdbg("alerts", nan_h5, "--exit-code").returncode == 1


def test_alerts_prints_the_run_up_and_gives_it_in_json(fp16_h5):
    out = hookdbg("alerts", fp16_h5)
    assert out.returncode == 0, out.stderr
    assert "run-up, last 5 recorded steps: largest finite magnitude" in out.stdout
    first = out.stdout.split("\nalert 2")[0]
    [row] = [line for line in first.splitlines() if line.lstrip().startswith("output ")]
    assert row.split()[:2] == ["output", "float16"] and row.rstrip().endswith(" inf"), row
    assert "(50%)" in row  # step 7: half of float16's range, a step before the overflow
    data = run_json("alerts", fp16_h5)
    run_up_json = data["alerts"][0]["run_up"]
    assert run_up_json[0]["tensor"] == "output" and run_up_json[0]["largest_finite"] == 65504.0
    shares = [s["headroom_used"] for s in run_up_json[0]["steps"][:-1]]
    assert shares == sorted(shares) and 0.1 < shares[-1] < 1


def test_alerts_exit_code_zero_without_alerts(mlp_h5):
    out = hookdbg("alerts", mlp_h5, "--exit-code")
    assert out.returncode == 0 and "no NaN/inf alerts" in out.stdout


def test_show_one_module(resnet_h5):
    out = hookdbg("show", resnet_h5, "layer1.0.conv1", "--step", "0")
    assert out.returncode == 0, out.stderr
    for slot in ("input[0]", "output", "grad_output", "param_grad[weight]", "param[weight]"):
        assert slot in out.stdout
    data = run_json("show", resnet_h5, "model.fc")
    assert data["type"] == "Linear" and {r["step"] for r in data["rows"]} == {0, 1}


def test_show_writes_nan_statistics_as_nan_and_unmeasured_ones_as_a_dash(nan_h5):
    """As the TUI does (hookdbg.cells.cell_text): a gradient all NaN has mean ``nan``;
    a statistic not measured (a float's saturation of an integer) stays ``-``."""
    lines = hookdbg("show", nan_h5, "proj", "--step", "3").stdout.splitlines()
    header = next(line for line in lines if "mean" in line).split()
    stats = header[header.index("dtype") + 1 : header.index("nan/inf")]
    assert stats[:4] == ["min", "max", "mean", "std"] and "sat" in header, header
    grad = next(line for line in lines if "param_grad[weight]" in line).split()
    at = grad.index("float32") + 1  # the statistics follow the dtype
    assert grad[at : at + len(stats)] == ["nan"] * len(stats), grad
    sat = header.index("sat") - len(header)  # the columns after the shape, from the right
    assert grad[at + len(stats)] == "256" and grad[sat] == "-", grad


def test_search_tensors_and_calls(nan_h5):
    data = run_json("search", nan_h5, "nan", "phase:fwd")
    assert data["matches"] >= 1 and data["rows"][0]["module"] == "model.standardize"
    calls = run_json("search", nan_h5, "type:Linear", "step:0")
    assert {r["module"] for r in calls["rows"]} == {"model.proj", "model.head"}
    out = hookdbg("search", nan_h5, "std<0")
    assert out.returncode == 0 and "0 tensor summaries match" in out.stdout


def test_diff_exit_status(mlp_h5, nan_h5, tmp_path):
    same = hookdbg("diff", mlp_h5, mlp_h5)
    assert same.returncode == 0 and "match" in same.stdout
    other = hookdbg("diff", mlp_h5, nan_h5)
    assert other.returncode == 1
    assert "modules only in" in other.stdout
    data = json.loads(hookdbg("diff", mlp_h5, nan_h5, "--json").stdout)
    assert data["equal"] is False and data["explanation"]


def test_diff_of_stats_and_shapes_compares_what_both_have(mlp_h5, tmp_path):
    """The same run at --level shapes has no values (and no weights after the optimizer
    step): its shapes and dtypes match, and a changed shape still shows."""
    shapes = tmp_path / "shapes.h5"
    out = hookdbg(
        "record", "-q", "-o", shapes, "--level", "shapes", SAMPLES / "numnet_mlp.py", "--steps", "4"
    )
    assert out.returncode == 0, out.stderr
    same = hookdbg("diff", mlp_h5, shapes)
    assert same.returncode == 0, same.stdout
    assert "recorded without --level stats: compared shapes and dtypes only" in same.stdout
    assert "every compared tensor has the same shape and dtype" in same.stdout
    assert run_json("diff", shapes, mlp_h5)["values_compared"] is False
    wider = tmp_path / "wider.h5"
    out = hookdbg(
        "record", "-q", "-o", wider, "--level", "shapes", SAMPLES / "numnet_mlp.py",
        "--steps", "4", "--batch", "16",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    differ = hookdbg("diff", mlp_h5, wider)
    assert differ.returncode == 1 and "first divergence" in differ.stdout


def test_export_formats(resnet_h5, tmp_path):
    trace = tmp_path / "trace.json"
    out = hookdbg("export", resnet_h5, "--format", "perfetto", "-o", trace)
    assert out.returncode == 0 and "trace events" in out.stderr
    assert json.loads(trace.read_text())["traceEvents"]
    out = hookdbg("export", resnet_h5, "--format", "csv", "--table", "steps", "-o", "-")
    assert [r["step"] for r in csv.DictReader(io.StringIO(out.stdout))] == ["0", "1"]
    again = hookdbg("export", resnet_h5, "--format", "perfetto", "-o", trace)
    assert again.returncode == 2 and "already exists; pass --force" in again.stderr
    over = hookdbg("export", resnet_h5, "--format", "csv", "-o", resnet_h5, "--force")
    assert over.returncode == 2 and "over the recording itself" in over.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["show", "{h5}", "model.nothing"], "no module 'model.nothing'"),
        (["show", "{h5}", "body.*"], "matches 5 modules"),
        (["search", "{h5}", "max>>1"], "bad query"),
        (["search", "{h5}", "max>"], "bad query: 'max>' is incomplete"),
        (["search", "{h5}", "(std<1"], "bad query: '(std<1': the query language has no"),
        (["profile", "{h5}", "--steps", "9:12"], "no recorded step in the range"),
        (["profile", "{h5}", "--step", "1", "--steps", "1:2"], "give --step or --steps"),
        (["summary", "{h5}", "--step", "99"], "step 99 was not recorded"),
        (["diff", "{h5}", "{h5}", "--rtol", "-1"], "--rtol must be a finite number, 0 or more"),
        (["diff", "{h5}", "{h5}", "--atol", "nan"], "--atol must be a finite number, 0 or more"),
        (["diff", "{h5}", "{h5}", "--rtol", "inf"], "--rtol must be a finite number, 0 or more"),
        (["export", "{h5}", "--format", "csv", "-o", "/nonexistent/x.csv"], "no directory"),
        (["summary", "/nonexistent.h5"], "no such file"),
        (["show", "{h5}", "model", "--eval"], "no such eval batch;"),
        (["show", "{h5}", "model", "--eval", "--step", "-1"], "has no eval batches"),
    ],
)
def test_report_bad_input_is_one_line_exit_2(mlp_h5, args, message):
    out = hookdbg(*[a.format(h5=mlp_h5) for a in args])
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_reports_on_a_recording_without_module_calls(tmp_path):
    script = tmp_path / "idle.py"
    script.write_text("print('no model here')\n")
    assert hookdbg("record", "-q", "-o", tmp_path / "idle.h5", script).returncode == 0
    summary = hookdbg("summary", tmp_path / "idle.h5")
    assert summary.returncode == 0 and "no module calls were recorded" in summary.stdout
    profile = hookdbg("profile", tmp_path / "idle.h5")
    assert profile.returncode == 2 and "holds no module calls" in profile.stderr


def test_eval_batches_are_counted_apart_and_marked(eval_h5):
    data = run_json("summary", eval_h5)
    assert data["steps"] == 6 and data["eval_batches"] == 4
    out = hookdbg("summary", eval_h5)
    assert "4 eval batches (forward only" in out.stdout
    shown = run_json("show", eval_h5, "model.head", "--eval")
    assert {r["eval_batch"] for r in shown["rows"]} == {0, 1, 2, 3}
    assert {r["phase"] for r in shown["rows"]} == {"fwd"}
    trained = run_json("show", eval_h5, "model.head")
    assert {r["eval_batch"] for r in trained["rows"]} == {None}
    found = hookdbg("search", eval_h5, "model.head slot:output")
    assert "eval 0" in found.stdout and "eval 3" in found.stdout
    rows = list(
        csv.DictReader(
            io.StringIO(
                hookdbg(
                    "export",
                    eval_h5,
                    "--format",
                    "csv",
                    "--table",
                    "steps",
                    "-o",
                    "-",
                    "--steps",
                    "3:6",
                ).stdout
            )
        )
    )
    assert [(r["of"], r["kind"]) for r in rows] == [
        ("eval batch 0", "eval"),
        ("eval batch 1", "eval"),
        ("step 3", "train"),
        ("step 4", "train"),
        ("step 5", "train"),
    ]


def test_show_tells_two_calls_of_one_module_apart(tmp_path):
    script = tmp_path / "twice.py"
    script.write_text(
        "import torch\n"
        "layer = torch.nn.Linear(3, 3)\n"
        "opt = torch.optim.SGD(layer.parameters(), lr=0.1)\n"
        "for _ in range(2):\n"
        "    layer(layer(torch.randn(2, 3))).sum().backward()\n"
        "    opt.step()\n"
        "raise SystemExit(3)\n"
    )
    assert hookdbg("record", "-q", "-o", tmp_path / "run.h5", script).returncode == 3
    rows = run_json("show", tmp_path / "run.h5", "layer", "--step", "1")["rows"]
    outputs = [r["call"] for r in rows if r["slot"] == "output"]
    assert outputs == [0, 1]
    out = hookdbg("show", tmp_path / "run.h5", "layer", "--step", "1")
    header = next(line for line in out.stdout.splitlines() if "slot" in line)
    assert header.split()[:3] == ["step", "call", "phase"]
    summary = hookdbg("summary", tmp_path / "run.h5")
    assert "complete (exit status 3)" in summary.stdout.splitlines()[0]
    data = run_json("summary", tmp_path / "run.h5")
    assert data["exit_code"] == 3 and data["ended"] == "complete"
    profile = hookdbg("profile", tmp_path / "run.h5")
    assert "self share" in profile.stdout and "ms per step: all calls" in profile.stdout


def test_export_says_what_it_wrote_in_json(mlp_h5, tmp_path):
    target = tmp_path / "calls.json"
    out = hookdbg("export", mlp_h5, "--format", "json", "--table", "calls", "-o", target, "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    rows = json.loads(target.read_text())
    assert summary == {
        "recording": str(mlp_h5),
        "format": "json",
        "path": str(target),
        "bytes": target.stat().st_size,
        "table": "calls",
        "rows": len(rows),
    }
    traced = hookdbg("export", mlp_h5, "--format", "perfetto", "-o", tmp_path / "t.json", "--json")
    trace = json.loads(traced.stdout)
    assert trace["events"] == len(json.loads((tmp_path / "t.json").read_text())["traceEvents"])
    piped = hookdbg("export", mlp_h5, "--format", "csv", "-o", "-", "--json")
    assert piped.returncode == 2 and "write the export to a file with -o FILE" in piped.stderr
    wrong = hookdbg("export", mlp_h5, "--format", "csv", "--stat", "output/std")
    assert wrong.returncode == 2 and "select what --format tensorboard writes" in wrong.stderr


def test_gradscaler_overflow_is_reported_as_skipped_steps(tmp_path):
    path = tmp_path / "amp.h5"
    out = hookdbg("record", "-o", path, SAMPLES / "amp_scaler.py", "--steps", "8")
    assert out.returncode == 0, out.stderr
    assert "GradScaler skipped the optimizer step at step 0" in out.stderr
    assert "0 alerts" in out.stderr
    alerts = hookdbg("alerts", path, "--exit-code")
    assert alerts.returncode == 0, alerts.stdout
    assert "no NaN/inf alerts; AMP's GradScaler skipped 6 steps" in alerts.stdout
    summary = hookdbg("summary", path)
    assert "8 (8 recorded)" in summary.stdout
    assert "GradScaler skipped 6 optimizer steps whose scaled gradients overflowed" in (
        " ".join(summary.stdout.split())
    )
    data = run_json("summary", path)
    assert data["gradscaler"]["skipped_steps"] == 6 and data["alerts"] == 0


def test_summary_of_an_eval_only_run_points_to_its_eval_batches(tmp_path):
    script = tmp_path / "infer.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()\n"
        "with torch.no_grad():\n"
        "    for _ in range(3):\n"
        "        model(torch.randn(2, 4))\n"
    )
    path = tmp_path / "infer.h5"
    assert hookdbg("record", "-q", "-o", path, script).returncode == 0
    out = hookdbg("summary", path)
    assert out.returncode == 0, out.stderr
    assert "3 eval batches" in out.stdout and "no module calls were recorded" not in out.stdout
    assert "no training step was recorded, only eval batches" in out.stdout
    shown = hookdbg("show", path, "model", "--eval")
    assert shown.returncode == 0 and "eval 2" in shown.stdout


def test_exit_code_holds_for_json_output_too(nan_h5, mlp_h5):
    """--exit-code gates CI on what the report found, whichever way it is printed."""
    for command in ("summary", "alerts"):
        bad = hookdbg(command, nan_h5, "--json", "--exit-code")
        assert bad.returncode == 1, bad.stderr
        assert json.loads(bad.stdout)["recording"] == str(nan_h5)
    good = hookdbg("alerts", mlp_h5, "--json", "--exit-code")
    assert good.returncode == 0 and json.loads(good.stdout)["alerts"] == []


def test_every_report_command_prints_through_emit():
    """Each command with --json builds a Report and hands it to emit(), which prints it
    as JSON or as text and applies --exit-code: no command prints its own JSON."""
    import ast
    import inspect

    from hookdbg.cli.app import COMMANDS
    from hookdbg.cli.report import Report

    reports = [c for c in COMMANDS if any(p.name == "as_json" for p in c.params)]
    assert {c.name for c in reports} >= {"summary", "profile", "alerts", "show", "diff"}
    for command in reports:
        assert command.callback is not None
        module = inspect.getmodule(inspect.unwrap(command.callback))
        tree = ast.parse(inspect.getsource(module))
        called = {
            node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))
        }
        assert "emit" in called and not called & {"dumps", "echo"}, command.name
        assert any(
            isinstance(v, type) and issubclass(v, Report) and v is not Report
            for v in vars(module).values()
        ), command.name


def test_show_prints_the_infinities_a_tensor_holds_as_its_min_and_max(tmp_path):
    """The recorded min and max are of the finite values; a masked score's min is -inf."""
    script = tmp_path / "masked.py"
    script.write_text(
        "import torch\n"
        "proj, soft = torch.nn.Linear(4, 4), torch.nn.Softmax(dim=-1)\n"
        "opt = torch.optim.SGD(proj.parameters(), lr=0.1)\n"
        "mask = torch.ones(4, 4, dtype=torch.bool).triu(1)\n"
        "scores = proj(torch.randn(4, 4)).masked_fill(mask, float('-inf'))\n"
        "(soft(scores) * torch.randn(4, 4)).sum().backward()\n"
        "opt.step()\n"
    )
    assert hookdbg("record", "-q", "-o", tmp_path / "run.h5", script).returncode == 0
    out = hookdbg("show", tmp_path / "run.h5", "soft", "--step", "0").stdout
    line = next(line for line in out.splitlines() if "input[0]" in line)
    cells = line.split()
    assert cells[cells.index("float32") + 1] == "-inf"  # min; max is finite
    assert cells[cells.index("float32") + 2] != "inf"


AFTER_TRAINING = """
import time, torch
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(5):
    opt.zero_grad()
    model(torch.randn(8, 16)).pow(2).mean().backward()
    opt.step()
torch.save(model.state_dict(), "checkpoint.pt")  # the script's work after training
time.sleep(SLEEP)
"""


def test_the_last_step_ends_where_training_did_and_the_rest_is_after_training(tmp_path):
    """Work after the last optimizer step (a checkpoint, here with a pause) is no step's
    time: the last step ends as the others did, and the reports say what came after."""
    sleep = 1.5
    script = tmp_path / "train.py"
    script.write_text(AFTER_TRAINING.replace("SLEEP", str(sleep)))
    out = hookdbg("record", "-q", "-o", tmp_path / "run.h5", script, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    data = json.loads(hookdbg("summary", tmp_path / "run.h5", "--json").stdout)
    with open_recording(tmp_path / "run.h5") as rec:
        durations = (rec.steps["end"] - rec.steps["start"]).tolist()
    assert len(durations) == 5 and durations[-1] < sleep, durations
    assert data["after_training_seconds"] >= sleep - max(durations), data
    summary = hookdbg("summary", tmp_path / "run.h5").stdout
    assert "after the last step ended" in summary and "in no step's time" in summary
    profile = hookdbg("profile", tmp_path / "run.h5").stdout
    assert "after the last step ended" in profile
    assert json.loads(hookdbg("profile", tmp_path / "run.h5", "--json").stdout)[
        "after_training_seconds"
    ] == pytest.approx(data["after_training_seconds"])


def test_a_final_eval_after_training_is_no_steps_time_either(tmp_path):
    """A pause, an eval under no_grad (without .eval()) and another pause after the
    last optimizer step: the last training step ends as the others did, the eval
    batches end with their last call, and all of it is said to be after training."""
    script = tmp_path / "train.py"
    script.write_text(
        AFTER_TRAINING.replace(
            "time.sleep(SLEEP)",
            "time.sleep(0.8)\n"
            "with torch.no_grad():\n"
            "    for _ in range(3):\n"
            "        model(torch.randn(8, 16))\n"
            "time.sleep(0.8)",
        )
    )
    out = hookdbg("record", "-q", "-o", tmp_path / "run.h5", script, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    with open_recording(tmp_path / "run.h5") as rec:
        train = (rec.steps["end"] - rec.steps["start"]).tolist()
        evals = (rec.evals["end"] - rec.evals["start"]).tolist()
    assert len(train) == 5 and max(train) < 0.5, train
    assert len(evals) == 3 and max(evals) < 0.5, evals
    data = json.loads(hookdbg("summary", tmp_path / "run.h5", "--json").stdout)
    assert data["after_training_seconds"] >= 1.6, data
