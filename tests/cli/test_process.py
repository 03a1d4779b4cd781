"""Under ``hookdbg record`` the script's process behaves as under ``python``: how it
ends (Ctrl-C included), the traceback it prints, what it sees of itself, and no file
left behind by a run that recorded nothing."""

import json
import signal
import subprocess
import sys
import textwrap

from tests.helpers import hookdbg, tables

CTRL_C = """
import atexit, os, signal, sys
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        if x.shape[0] == 3:
            os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C
        return self.fc(x)

atexit.register(lambda: print("the script's exit handler ran:", sys.argv, flush=True))
net = Net()
net(torch.ones(2, 4))
net(torch.ones(3, 4))
"""

FAILS = """
import torch

class Boom(torch.nn.Module):
    def forward(self, x):
        if self.cause is not None:
            raise KeyError("gave up") from self.cause
        raise ValueError("forward failed")

class Broken(torch.optim.SGD):
    def step(self, closure=None):
        raise RuntimeError("step failed")

boom = Boom()
boom.cause = None
boom.register_forward_pre_hook(lambda module, args: None)  # torch's `inner` runs for boom
model = torch.nn.Sequential(torch.nn.Linear(4, 4), boom)
opt = Broken(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu")
x = torch.ones(2, 4)
scaler.scale(model[0](x).sum()).backward()
try:
    model(x)  # raises in a forward
except ValueError:
    try:
        scaler.step(opt)  # raises in the optimizer step, through the GradScaler
    except RuntimeError as exc:
        boom.cause = exc
        model(x)  # raises in a forward, from the step's error
"""

PROBE = """
import json, sys

def train(lr: float): ...

print(json.dumps({
    "annotation": repr(train.__annotations__["lr"]),  # no __future__ of hookdbg's
    "argv": sys.argv,
    "file": __file__,
    "code": sys._getframe().f_code.co_filename,
    "path0": sys.path[0],
    "name": __name__,
    "package": __package__,
    "spec": None if __spec__ is None else __spec__.name,
    "loader": type(__loader__).__name__,
    "globals": sorted(globals()),
    "builtins": type(__builtins__).__name__,
    "is_main": sys.modules["__main__"].__dict__ is globals(),
}))
"""


def python(*args, cwd):
    return subprocess.run(
        [sys.executable, *map(str, args)], capture_output=True, text=True, cwd=cwd
    )


def test_ctrl_c_ends_hookdbg_by_sigint_as_it_ends_python(tmp_path):
    (tmp_path / "train.py").write_text(CTRL_C)
    plain = python("train.py", cwd=tmp_path)
    out = hookdbg("record", "-q", "-o", "run.h5", "train.py", cwd=tmp_path)
    # the parent sees the signal (a shell shows 130), after the script's exit handler
    assert out.returncode == plain.returncode == -signal.SIGINT
    assert out.stdout == plain.stdout == "the script's exit handler ran: ['train.py']\n"
    assert out.stderr == plain.stderr  # the same traceback, ending in KeyboardInterrupt
    end = tables(tmp_path / "run.h5")["end"]
    assert end["status"][0] == b"interrupted" and end["exit_code"][0] == 130


def test_ctrl_c_under_the_python_api_is_left_to_python(tmp_path):
    script = tmp_path / "api.py"
    script.write_text(
        "import torch, hookdbg\n"
        "with hookdbg.record('run.h5', quiet=True):\n"
        "    torch.nn.Linear(2, 2)(torch.ones(1, 2))\n"
        "    raise KeyboardInterrupt\n"
    )
    out = python(script, cwd=tmp_path)
    assert out.returncode == -signal.SIGINT and out.stderr.endswith("KeyboardInterrupt\n")
    assert tables(tmp_path / "run.h5")["end"]["status"][0] == b"interrupted"


def test_traceback_is_the_one_python_prints(tmp_path):
    """No hookdbg frame (its GradScaler wrapper), and no torch ``inner`` frame where
    only hookdbg's hooks made torch call it, in the exception or its causes and
    contexts; the ``inner`` of a module with a hook of the script's own stays."""
    (tmp_path / "fails.py").write_text(FAILS)
    plain = python("fails.py", cwd=tmp_path)
    out = hookdbg("record", "-q", "-o", "run.h5", "fails.py", cwd=tmp_path)
    assert out.returncode == plain.returncode == 1
    assert "direct cause" in plain.stderr and "During handling" in plain.stderr
    assert "in step\n" in plain.stderr and plain.stderr.count(", in inner\n") == 2
    assert out.stderr == plain.stderr
    assert tables(tmp_path / "run.h5")["end"]["status"][0] == b"exception"


def test_quiet_hides_status_lines_never_alerts(tmp_path):
    (tmp_path / "nan.py").write_text(
        textwrap.dedent(
            """
            import torch
            model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LogSoftmax(-1))
            x = torch.ones(2, 4)
            x[0, 0] = float("nan")
            model(x).sum().backward()
            """
        )
    )
    out = hookdbg("record", "-q", "-o", "run.h5", "nan.py", cwd=tmp_path)
    assert out.returncode == 0
    [line] = out.stderr.splitlines()  # no "recording", "flight recorder", "recorded" lines
    assert line.startswith("hookdbg: NaN first appeared at step 0 in model (Sequential)")


def test_script_sees_itself_as_under_python(tmp_path):
    """A script typed as a relative path through a symlink, and a module under -m:
    argv[0], __file__, sys.path[0], __main__ and its globals are python's."""
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "probe.py").write_text(PROBE)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "train.py").symlink_to(tmp_path / "real" / "probe.py")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(PROBE)
    for target in (["./sub/../sub/train.py"], ["-m", "pkg.train"]):
        plain = python(*target, "--lr", "0.1", cwd=tmp_path)
        out = hookdbg("record", *target, "--lr", "0.1", cwd=tmp_path)
        assert out.returncode == plain.returncode == 0, out.stderr
        assert json.loads(out.stdout) == json.loads(plain.stdout)
    assert json.loads(plain.stdout)["argv"][0] == str(tmp_path / "pkg" / "train.py")


def test_a_run_that_records_nothing_leaves_no_file_named_by_hookdbg(tmp_path):
    """`train.py --help` exits before any module call: the file hookdbg named for it
    is removed, saying so; a file the user named, here one -f replaced, stays."""
    (tmp_path / "train.py").write_text(
        "import argparse\nargparse.ArgumentParser(description='trains').parse_args()\n"
    )
    out = hookdbg("record", "train.py", "--help", cwd=tmp_path)
    assert out.returncode == 0 and "trains" in out.stdout
    assert out.stderr.splitlines()[-1].startswith(
        "hookdbg: nothing recorded (no module call, step or alert): removed hookdbg-train."
    )
    assert not list(tmp_path.glob("*.h5"))

    (tmp_path / "run.h5").write_bytes(b"an earlier run")
    out = hookdbg("record", "-f", "-o", "run.h5", "train.py", "--help", cwd=tmp_path)
    assert out.returncode == 0
    assert "hookdbg: recorded 0 steps, 0 module calls, 0 alerts -> run.h5" in out.stderr
    assert tables(tmp_path / "run.h5")["end"]["status"][0] == b"complete"
