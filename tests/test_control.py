"""The steering channel: a control file beside the recording, private to its owner,
read by the recorder from where it last stopped (hookdbg/control.py)."""

from __future__ import annotations

import fcntl
import os
import re
import sys

import pytest

from hookdbg import control
from hookdbg.control import control_path, parse, send
from hookdbg.options import ModuleFilter, OptionError


def test_every_rank_of_a_run_reads_the_runs_one_control_file(tmp_path):
    assert control_path(tmp_path / "run.h5") == tmp_path / "run.h5.ctl"
    assert control_path(tmp_path / "run.rank3.h5") == tmp_path / "run.h5.ctl"
    assert control_path(tmp_path / "my.rankings.h5") == tmp_path / "my.rankings.h5.ctl"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"not json", "not a JSON line"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"seq": 1, "op": "explode"}', "unknown command 'explode'"),
        (b'{"seq": 0, "op": "stop"}', "bad command number 0"),
        (b'{"seq": 1, "op": "record", "steps": 0}', "--steps must be a whole number"),
        (b'{"seq": 1, "op": "record", "steps": true}', "--steps must be a whole number"),
        (b'{"seq": 1, "op": "level", "level": "loud"}', "unknown level 'loud'"),
        (b'{"seq": 1, "op": "level"}', "level needs one of"),
        (b'{"seq": 1, "op": "record", "steps": 1, "level": "idle"}', "records nothing"),
        (b'{"seq": 1, "op": "stop", "first": -3}', "bad first step"),
        (b'{"seq": 1, "op": "stop", "sent": 1e999}', "bad command time"),
        (b'{"seq": 1, "op": "stop", "uid": 0}', "unknown fields uid"),
        (b'{"seq": 1, "op": "record", "steps": 1, "modules": "x"}', "list of globs"),
        (b'{"seq": 1, "op": "record", "steps": 1, "capture": [""]}', "empty module glob"),
        (b"{" + b" " * control.MAX_LINE + b"}", "more than any command"),
    ],
)
def test_a_bad_line_is_refused_with_why(line, message):
    with pytest.raises(OptionError, match=message):
        parse(line)


def test_an_invalid_command_leaves_no_file(tmp_path):
    path = tmp_path / "run.h5.ctl"
    with pytest.raises(OptionError):
        send(path, op="record", steps=-1)
    assert not path.exists()


def test_a_command_longer_than_a_line_may_be_is_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "run.h5.ctl"
    globs = tuple(f"{i}" + "x" * 200 for i in range(20))  # 4,000 bytes and more
    with pytest.raises(OptionError, match=r"more than a control line may hold \(4,096\)"):
        send(path, op="record", steps=1, modules=globs)
    assert not path.exists()
    longest = send(path, op="record", steps=1, modules=globs[:19])
    assert parse(longest.line().rstrip(b"\n")) == longest  # what ctl sends, a recorder takes


@pytest.mark.parametrize("kind", ["fifo", "directory", "link"])
def test_send_opens_no_pipe_directory_or_link(tmp_path, kind):
    path = tmp_path / "run.h5.ctl"
    if kind == "fifo":
        os.mkfifo(path)  # opened for writing, it would wait for a reader forever
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OptionError, match=r"is not a control file of yours: it is a"):
        send(path, op="dump")
    assert not (tmp_path / "elsewhere").exists()


def test_send_ends_a_half_written_last_line_before_its_own(tmp_path):
    path = tmp_path / "run.h5.ctl"
    path.write_bytes(b'{"seq": 1, "op": "du')
    os.chmod(path, 0o600)
    command = send(path, op="dump")
    lines = path.read_bytes().split(b"\n")
    assert lines == [b'{"seq": 1, "op": "du', command.line().rstrip(b"\n"), b""]
    assert command.seq == 2


def test_send_waits_for_the_lock_no_longer_than_asked(tmp_path):
    path = tmp_path / "run.h5.ctl"
    send(path, op="dump")
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another writer holding it
    try:
        with pytest.raises(OptionError, match=r"stayed locked by another writer for 0\.2 s"):
            send(path, 0.2, op="dump")
    finally:
        os.close(fd)
    assert send(path, 0.2, op="dump").seq == 2


@pytest.mark.parametrize(
    ("line", "seq"),
    [
        (b'{"seq": 7, "op": "explode"}', 7),
        (b'{"seq": 7, "op": "record", "steps": 1, "first": 1e30}', 7),
        (b'{"seq": 7, "op": "stop", "uid": 0}', 7),
        (b'{"seq": true, "op": "stop"}', None),
        (b'{"op": "stop"}', None),
    ],
)
def test_a_bad_line_keeps_its_command_number_to_be_answered(line, seq):
    with pytest.raises(control.BadLine) as refused:
        parse(line)
    assert refused.value.seq == seq


def test_a_control_file_past_16_mib_numbers_by_its_size_without_reading_it(tmp_path):
    path = tmp_path / "run.h5.ctl"
    send(path, op="dump")
    os.truncate(path, 32 << 20)  # a flood's worth, no line break in it
    command = send(path, op="dump")
    assert command.seq == (32 << 20) + 1  # one more than its size: more than its lines
    assert path.read_bytes().endswith(b"\n" + command.line())


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"[" * 4_000, "nested deeper than Python reads"),
        (b'{"seq": 3, "op": "dump", "sent": 1' + b"0" * 400 + b"}", "bad command time 1"),
        (b'{"seq": 3, "op": "dump", "level": "stats"}', "dump takes no level"),
        (b'{"seq": 3, "op": "level", "level": "idle", "modules": [""]}', "level takes no modules"),
        (b'{"seq": 3, "op": "stop", "first": 0, "steps": 2}', "stop takes no steps"),
        (b'{"seq": 3, "op": "record", "steps": 1, "modules": ["' + b"x" * 300 + b'"]}', "300"),
    ],
)
def test_a_line_no_command_could_be_is_refused_and_never_raises_else(line, why):
    # at Python's own recursion limit: a recording closed inside a module call leaves
    # the limit it raised (recorder/hooks/recursion.py), and an earlier test may have
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        with pytest.raises(control.BadLine, match=re.escape(why)):
            parse(line)
    finally:
        sys.setrecursionlimit(before)


def test_module_globs_are_bounded_as_module_names_are():
    with pytest.raises(OptionError, match="at most 64 may be given"):
        ModuleFilter.parse([f"layer{i}.*" for i in range(65)])
    with pytest.raises(OptionError, match="a module glob of 257 characters: at most 256"):
        ModuleFilter.parse(["x" * 257])
    assert ModuleFilter.parse(["x" * 256]).include == ("x" * 256,)
