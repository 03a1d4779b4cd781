"""``hookdbg record`` behaves like ``python`` for the script, and fails cleanly on bad input."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from tests.helpers import SAMPLES, hookdbg, tables

PROBE = """
import json, sys
import torch
print(json.dumps({"argv": sys.argv, "name": __name__, "path0": sys.path[0]}))
torch.nn.Linear(2, 2)(torch.ones(1, 2))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[-1]) if sys.argv[-1].isdigit() else 0)
"""


@pytest.fixture
def probe(tmp_path):
    script = tmp_path / "scripts" / "probe.py"
    script.parent.mkdir()
    script.write_text(PROBE)
    return script


def test_script_sees_what_python_would_give_it(tmp_path, probe):
    plain = subprocess.run(
        [sys.executable, probe, "--lr", "0.1", "3"], capture_output=True, text=True, cwd=tmp_path
    )
    out = hookdbg("record", "-o", "run.h5", probe, "--lr", "0.1", "3", cwd=tmp_path)
    assert out.returncode == plain.returncode == 3
    assert out.stdout == plain.stdout  # byte for byte
    assert json.loads(out.stdout)["name"] == "__main__"
    assert json.loads(out.stdout)["path0"] == str(probe.parent)
    # one forward and no backward: an eval (forward-only) batch, not a training step
    assert "to stderr" in out.stderr and "hookdbg: recorded 0 steps, 1 eval batch," in out.stderr
    assert len(tables(tmp_path / "run.h5")["calls"]) == 1


def test_double_dash_after_the_script_is_dropped(tmp_path, probe):
    out = hookdbg("record", "-o", "run.h5", probe, "--", "--level", "x", cwd=tmp_path)
    assert json.loads(out.stdout)["argv"] == [str(probe), "--level", "x"]


def test_module_mode_like_python_dash_m(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(PROBE)
    out = hookdbg("record", "-o", "run.h5", "-m", "mypkg.train", "--", "--lr", "0.1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["argv"] == [str(pkg / "train.py"), "--lr", "0.1"] and seen["name"] == "__main__"
    assert seen["path0"] == str(tmp_path)


def test_uncaught_exception_prints_the_scripts_traceback_and_exits_1(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(
        "import torch\n\ndef train():\n    raise RuntimeError('diverged')\n\ntrain()\n"
    )
    out = hookdbg("record", "-o", "run.h5", script, cwd=tmp_path)
    assert out.returncode == 1
    assert "Traceback (most recent call last)" in out.stderr
    assert 'fails.py", line 4, in train' in out.stderr and "RuntimeError: diverged" in out.stderr
    assert "hookdbg/" not in out.stderr.split("Traceback")[1] and "runpy" not in out.stderr
    assert tables(tmp_path / "run.h5")["end"]["status"][0] == b"exception"


def test_non_int_exit_value_is_printed_like_python(tmp_path):
    script = tmp_path / "bye.py"
    script.write_text("import sys\nsys.exit('giving up')\n")
    out = hookdbg("record", "-o", "run.h5", script, cwd=tmp_path)
    assert out.returncode == 1 and "giving up" in out.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.py"], "script 'missing.py' not found"),
        (["-m", "no_such_module_xyz"], "no module named 'no_such_module_xyz'"),
        (["--steps", "5:2", "{probe}"], "empty step range '5:2'"),
        (["--steps", "x", "{probe}"], "bad step range 'x'"),
        (["--modules", "!", "{probe}"], "empty module glob"),
        (["--every", "0", "{probe}"], "--every must be at least 1"),
        (["-o", "{tmp}/nodir/run.h5", "{probe}"], "cannot create"),
        (["-o", "{tmp}", "{probe}"], "is a directory"),
        (["-o", "{probe}", "{probe}"], "already exists; pass --force"),
        (["--flush-interval", "inf", "{probe}"], "--flush-interval must be from"),
        (["--flight-recorder", "nan", "{probe}"], "--flight-recorder must be 0 (off) or"),
    ],
)
def test_bad_input_is_one_clean_line_and_exit_2(tmp_path, probe, args, message):
    """Refused before torch is imported (that alone takes seconds): here any import of
    torch fails."""
    no_torch = tmp_path / "no_torch" / "torch"
    no_torch.mkdir(parents=True)
    (no_torch / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    path = os.pathsep.join(p for p in (str(no_torch.parent), os.environ.get("PYTHONPATH")) if p)
    args = [a.format(probe=probe, tmp=tmp_path) for a in args]
    out = hookdbg("record", *args, cwd=tmp_path, env={"PYTHONPATH": path})
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.glob("*.h5"))


def test_existing_output_needs_force(tmp_path, probe):
    (tmp_path / "run.h5").write_bytes(b"precious")
    out = hookdbg("record", "-o", "run.h5", probe, cwd=tmp_path)
    assert out.returncode == 2 and "already exists; pass --force" in out.stderr
    assert (tmp_path / "run.h5").read_bytes() == b"precious"
    out = hookdbg("record", "-f", "-o", "run.h5", probe, cwd=tmp_path)
    assert out.returncode == 0 and len(tables(tmp_path / "run.h5")["calls"]) == 1


def test_default_output_name_and_quiet(tmp_path, probe):
    out = hookdbg("record", "-q", probe, cwd=tmp_path)
    assert out.returncode == 0 and "hookdbg:" not in out.stderr
    [made] = tmp_path.glob("hookdbg-probe.*.h5")
    assert len(tables(made)["calls"]) == 1


def test_unmatched_module_glob_is_pointed_out(tmp_path):
    out = hookdbg(
        "record",
        "-o",
        "run.h5",
        "--modules",
        "layr3.*",
        SAMPLES / "numnet_mlp.py",
        "--steps",
        "2",
        cwd=tmp_path,
    )
    assert out.returncode == 0
    said = "--modules 'layr3.*' matched none of the 9 modules of the first step (names look "
    said += "like 'model.body', 'model.body.0'); recording goes on"  # 8 of the model, 1 loss
    assert said in out.stderr  # after the first step, not only when the run ends
    assert out.stderr.index(said) < out.stderr.index("hookdbg: recorded 2 steps")
    assert out.stderr.count("layr3") == 1


def test_help_documents_every_option(tmp_path):
    out = hookdbg("record", "--help")
    for option in (
        "--output",
        "-m",
        "--level",
        "--modules",
        "--every",
        "--steps",
        "--on-nan",
        "--force",
        "--quiet",
        "--flush-interval",
        "Examples:",
    ):
        assert option in out.stdout
    assert textwrap.dedent(out.stdout).count("\n") > 20


def test_hookdbg_options_after_the_script_are_pointed_out(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import argparse\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--epochs', type=int)\n"
        "parser.parse_args()\n"
    )
    out = hookdbg(
        "record", script, "-o", "x.h5", "--level", "timing", "--epochs", "3", cwd=tmp_path
    )
    assert out.returncode == 2  # the script's own exit status, from argparse
    assert "unrecognized arguments: -o x.h5 --level timing" in out.stderr
    removed, hint = out.stderr.strip().splitlines()[-2:]
    assert hint.startswith("hookdbg: the script exited with status 2 before any module call")
    assert f"`hookdbg record -o x.h5 --level timing {script} --epochs 3`" in hint
    # the file named for this run holds nothing: it is not left behind
    assert removed.startswith(
        "hookdbg: nothing recorded (no module call, step or alert): removed hookdbg-train."
    )
    assert not list(tmp_path.glob("*.h5"))


@pytest.mark.parametrize(
    ("option", "value", "unit"),
    [
        ("--flush-interval", "inf", "seconds"),
        ("--flush-interval", "1e300", "seconds"),
        ("--flush-interval", "nan", "seconds"),
        ("--flush-interval", "0", "seconds"),
        ("--flush-interval", "-1", "seconds"),
        ("--flight-recorder", "nan", "MB"),
        ("--flight-recorder", "inf", "MB"),
        ("--flight-recorder", "-1", "MB"),
        ("--capture-budget", "nan", "MB"),
        ("--capture-budget", "inf", "MB"),
        ("--capture-budget", "0", "MB"),
        ("--capture-budget", "1e300", "MB"),
    ],
)
def test_numeric_options_are_refused_alike_by_the_cli_and_the_api(
    tmp_path, probe, option, value, unit
):
    """Finite, in a sane range, with the unit in the message: one line and exit 2 from
    the command line, the same OptionError from hookdbg.record, and no file either way."""
    import hookdbg
    from hookdbg.cli import cli
    from hookdbg.options import OptionError

    out = CliRunner().invoke(
        cli, ["record", "-o", str(tmp_path / "run.h5"), option, value, str(probe)]
    )
    assert out.exit_code == 2, out.output
    assert len(out.stderr.strip().splitlines()) == 1 and out.exception.__class__ is SystemExit
    assert f"{option} must be" in out.stderr and unit in out.stderr
    keyword = {
        "--flush-interval": "flush_interval",
        "--flight-recorder": "flight_recorder_mb",
        "--capture-budget": "capture_budget_mb",
    }[option]
    with pytest.raises(OptionError) as api:
        hookdbg.record(tmp_path / "api.h5", **{keyword: float(value)})
    # the same words, naming the keyword argument instead of the flag
    assert str(api.value).startswith(f"{keyword} must be")
    assert str(api.value).replace(keyword, option, 1) in out.stderr
    assert not list(tmp_path.glob("*.h5"))


def test_which_per_call_path_runs_is_said_by_version_and_the_recording(tmp_path):
    """A build without a C compiler records on the slower Python path: hookdbg says
    which path it takes, in --version and in each recording."""
    from hookdbg.recorder import accelerated

    built = "C" if accelerated.enabled() else "Python"  # (C wherever a compiler was)
    assert f"per-call path: {built}" in hookdbg("--version").stdout
    env = {**os.environ, "HOOKDBG_PURE_PYTHON": "1"}
    shown = hookdbg("--version", env=env)
    assert "per-call path: Python (HOOKDBG_PURE_PYTHON is set)" in shown.stdout
    for name, extra in (("c", {}), ("python", {"HOOKDBG_PURE_PYTHON": "1"})):
        out = tmp_path / f"{name}.h5"
        args = ("record", "-q", "-o", out, SAMPLES / "nan_blowup.py", "--steps", "2")
        assert hookdbg(*args, env={**os.environ, **extra}).returncode == 0
        path = built if name == "c" else "Python"
        assert f"({path} per-call path)" in hookdbg("summary", out).stdout


PLAIN_TENSORS = """
import torch
torch.manual_seed(0)
w = torch.randn(8, 4, requires_grad=True)
b = torch.zeros(4, requires_grad=True)
opt = torch.optim.SGD([w, b], lr=0.1)
x, y = torch.randn(32, 8), torch.randn(32, 4)
for step in range(3):
    opt.zero_grad()
    loss = ((x @ w + b - y) ** 2).mean()
    loss.backward()
    opt.step()
    print(repr(loss.item()), repr(w.grad.norm().item()), repr(w.detach().double().norm().item()))
"""


def test_a_loop_without_modules_records_its_steps_loss_and_weights(tmp_path):
    """Plain tensors, an optimizer, a loss: three steps, their loss, the tensors'
    gradients and their norms after each step, under the optimizer and named from the
    script's variables; training is the same as without hookdbg."""
    script = tmp_path / "plain.py"
    script.write_text(PLAIN_TENSORS)
    plain = subprocess.run([sys.executable, script], capture_output=True, text=True, check=True)
    out = hookdbg("record", script, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == plain.stdout  # bitwise the same training
    [path] = tmp_path.glob("hookdbg-plain.*.h5")  # kept: it holds steps
    assert "recorded 3 steps, 0 module calls, 0 alerts" in out.stderr
    summary = json.loads(hookdbg("summary", path, "--json").stdout)
    assert (summary["steps"], summary["optimizers"]) == (3, ["opt (SGD, 36 parameters of its own)"])
    printed = [[float(v) for v in line.split()] for line in plain.stdout.splitlines()]
    [loss] = summary["losses"]
    assert (loss["passes"], loss["first"], loss["last"]) == (
        3,
        [0, printed[0][0]],
        [2, printed[2][0]],
    )
    shown = json.loads(hookdbg("show", path, "opt", "--json").stdout)
    rows = {(r["step"], f"{r['slot']}[{r['path']}]"): r for r in shown["rows"]}
    assert {slot for _, slot in rows} == {"param_grad[w]", "param_grad[b]", "param[w]", "param[b]"}
    assert len(rows) == len(shown["rows"]) == 3 * 4
    for step, (_, grad_norm, weight_norm) in enumerate(printed):
        assert rows[step, "param_grad[w]"]["norm"] == pytest.approx(grad_norm, rel=1e-6)
        assert rows[step, "param[w]"]["norm"] == pytest.approx(weight_norm, rel=1e-12)
