"""Strings from a recording never drive the terminal: a module name holding an OSC
title sequence, a screen-clearing CSI, a bidi override and rich markup prints as text."""

import csv
import io
import json

import pytest

from tests.helpers import hookdbg, hookdbg_in_terminal

# what nn.Module.add_module accepts: anything but "." and ""
EVIL = "\x1b]0;pwned\x07[bold]x[/bold]:smile:\x1b[2J\u202e"
SHOWN = r"\x1b]0;pwned\x07[bold]x[/bold]:smile:\x1b[2J\u202e"
ARG = "arg\x1b]0;argv\x07"

SCRIPT = f"""
import sys, torch
from torch import nn

class Root(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return (x * self.scale).sqrt()

torch.manual_seed(int(sys.argv[1]))
model = nn.Sequential()
model.add_module({EVIL!r}, Root())
model.add_module("act", nn.ReLU())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    x = torch.rand(2, 4) + 0.5
    if step == 2:
        x[0, 0] = -1.0  # sqrt of a negative: NaN born in the module with the hostile name
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.fixture(scope="module")
def evil(tmp_path_factory):
    """Two recordings (seeds 0 and 1) of a model with a hostile module name, run with a
    hostile command-line argument; the NaN alert messages name the module too."""
    base = tmp_path_factory.mktemp("evil")
    (base / "evil.py").write_text(SCRIPT)
    for seed in (0, 1):
        out = hookdbg("record", "-q", "-o", base / f"s{seed}.h5", base / "evil.py", str(seed), ARG)
        assert out.returncode == 0, out.stderr
    return base


REPORTS = [
    ["summary", "{a}"],
    ["profile", "{a}"],
    ["alerts", "{a}"],
    ["search", "{a}", "nan"],
    ["search", "{a}", "type:Root"],
    ["show", "{a}", "*pwned*"],
    ["diff", "{a}", "{b}"],
    ["tensor", "{a}", "*pwned*"],
]


@pytest.mark.parametrize("args", REPORTS, ids=lambda a: "-".join(a[:1] + a[2:]))
def test_reports_print_control_characters_escaped(evil, args):
    out = hookdbg(*[a.format(a=evil / "s0.h5", b=evil / "s1.h5") for a in args])
    assert out.returncode in (0, 1), out.stderr
    assert "\x1b" not in out.stdout + out.stderr and "\u202e" not in out.stdout
    assert SHOWN in out.stdout  # markup and emoji codes print as they are
    if args[0] == "summary":
        assert r"arg\x1b]0;argv\x07" in out.stdout


def test_one_line_errors_quote_names_escaped(evil):
    out = hookdbg("show", evil / "s0.h5", "pwned")  # "did you mean <the evil name>?"
    assert out.returncode == 2 and "\x1b" not in out.stderr
    assert SHOWN in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_json_stays_exact(evil):
    summary = json.loads(hookdbg("summary", evil / "s0.h5", "--json").stdout)
    assert f"model.{EVIL}" in [m["name"] for m in summary["module_table"]]
    assert summary["command"][-1] == ARG
    alerts = json.loads(hookdbg("alerts", evil / "s0.h5", "--json").stdout)
    assert any(EVIL in a["message"] for a in alerts["alerts"])


def test_csv_is_exact_in_a_pipe_and_escaped_on_a_terminal(evil):
    args = ("export", evil / "s0.h5", "--format", "csv", "--table", "modules", "-o", "-")
    piped = hookdbg(*args)
    names = [r["name"] for r in csv.DictReader(io.StringIO(piped.stdout))]
    assert f"model.{EVIL}" in names
    status, screen = hookdbg_in_terminal(*args)
    assert status == 0 and SHOWN.encode() in screen and EVIL.encode() not in screen


def test_csv_into_a_terminal_given_by_path_is_escaped_and_into_a_pipe_exact(evil):
    """-o /dev/stdout is a terminal or a pipe, not a file to overwrite: no --force, and
    escaped on a terminal as -o - is."""
    args = ("export", evil / "s0.h5", "--format", "csv", "-o", "/dev/stdout")
    status, screen = hookdbg_in_terminal(*args)
    assert status == 0, screen
    assert SHOWN.encode() in screen and b"\x1b]0;pwned" not in screen and b"\x1b[2J" not in screen
    assert b"wrote 36 tensors rows to /dev/stdout\r\n" in screen  # no size: it is no file
    piped = hookdbg(*args)
    assert piped.returncode == 0, piped.stderr
    paths = [r["module"] for r in csv.DictReader(io.StringIO(piped.stdout))]
    assert f"model.{EVIL}" in paths


def test_record_writes_module_names_escaped(evil, tmp_path):
    """The NaN alert hookdbg record prints names the module with the hostile name."""
    out = hookdbg("record", "-o", tmp_path / "run.h5", evil / "evil.py", "0", ARG)
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stderr and "\u202e" not in out.stderr
    assert f"NaN first appeared at step 2 in model.{SHOWN} (Root) forward output" in out.stderr


def test_summary_on_a_terminal(evil):
    status, screen = hookdbg_in_terminal("summary", evil / "s0.h5")
    assert status == 0, screen
    assert SHOWN.encode() in screen and b"\x1b]0;pwned" not in screen
    assert b"\x1b]0;argv" not in screen and b":smile:\x1b[2J" not in screen


def test_tui_on_a_terminal(evil):
    """The replay screen, the alerts screen and the profile, drawn on a real terminal."""
    status, screen = hookdbg_in_terminal(
        "tui",
        evil / "s0.h5",
        keys=(b"a", b"\x1b", b"p", b"\x1b", b"q"),
        ready=SHOWN.encode(),
    )
    assert status == 0
    assert SHOWN.encode() in screen
    assert b"\x1b]0;pwned" not in screen and b":smile:\x1b[2J" not in screen
