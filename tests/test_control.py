"""The steering channel: a control file beside the recording, private to its owner,
read by the recorder from where it last stopped (hookdbg/control.py)."""

from __future__ import annotations

import os
import time

import pytest

from hookdbg import control
from hookdbg.control import Command, control_path, parse, send
from hookdbg.options import OptionError
from hookdbg.recorder.steps.inbox import Reader


def test_every_rank_of_a_run_reads_the_runs_one_control_file(tmp_path):
    assert control_path(tmp_path / "run.h5") == tmp_path / "run.h5.ctl"
    assert control_path(tmp_path / "run.rank3.h5") == tmp_path / "run.h5.ctl"
    assert control_path(tmp_path / "my.rankings.h5") == tmp_path / "my.rankings.h5.ctl"


def test_commands_go_out_numbered_and_come_back_whole(tmp_path):
    path = tmp_path / "run.h5.ctl"
    reader = Reader(path, since=time.time() - 1)
    first = send(path, op="record", steps=5, level="shapes", modules=("layer4.*",))
    second = send(path, op="level", level="idle", first=120)
    assert (first.seq, second.seq) == (1, 2)
    assert os.stat(path).st_mode & 0o777 == 0o600
    got = list(reader.poll(time.monotonic()))
    assert [(c.seq, c.op) for c in got] == [(1, "record"), (2, "level")]
    assert got[0].modules == ("layer4.*",) and got[0].level == "shapes" and got[1].first == 120
    assert list(reader.poll(time.monotonic() + 1)) == []  # nothing new: nothing read again
    assert first.describe() == "record 5 steps at shapes, modules layer4.*"


def test_a_reader_skips_commands_sent_before_its_recording_began(tmp_path):
    path = tmp_path / "run.h5.ctl"
    send(path, op="stop")  # for an earlier run
    reader = Reader(path, since=time.time() + 1)
    send(path, op="dump", sent=time.time() + 2)
    assert [c.op for c in list(reader.poll(time.monotonic()))] == ["dump"]


def test_a_line_still_being_written_waits_for_its_end(tmp_path):
    path = tmp_path / "run.h5.ctl"
    reader = Reader(path, since=0)
    line = Command(seq=1, op="dump").line()
    path.write_bytes(line[:10])
    os.chmod(path, 0o600)
    assert list(reader.poll(time.monotonic())) == []
    path.write_bytes(line)
    assert [c.op for c in list(reader.poll(time.monotonic() + 1))] == ["dump"]


def test_a_control_file_others_may_write_is_not_read(tmp_path):
    path = tmp_path / "run.h5.ctl"
    reader = Reader(path, since=0)
    send(path, op="stop")
    os.chmod(path, 0o666)
    assert list(reader.poll(time.monotonic())) == []
    assert reader.problems == [f"not reading {path}: others may write it"]
    with pytest.raises(OptionError, match="not a control file of yours"):
        send(path, op="dump")


def test_a_link_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("")
    path = tmp_path / "run.h5.ctl"
    path.symlink_to(target)
    with pytest.raises(OptionError, match="it is a symbolic link"):
        send(path, op="stop")
    reader = Reader(path, since=0)
    target.write_text(Command(seq=1, op="stop").line().decode())
    assert list(reader.poll(time.monotonic())) == []


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


def test_bad_lines_are_skipped_and_said(tmp_path):
    path = tmp_path / "run.h5.ctl"
    reader = Reader(path, since=0)
    path.write_bytes(b"garbage\n" + Command(seq=2, op="dump").line())
    os.chmod(path, 0o600)
    assert [c.op for c in list(reader.poll(time.monotonic()))] == ["dump"]
    assert len(reader.problems) == 1 and "not a JSON line" in reader.problems[0]


def test_an_invalid_command_leaves_no_file(tmp_path):
    path = tmp_path / "run.h5.ctl"
    with pytest.raises(OptionError):
        send(path, op="record", steps=-1)
    assert not path.exists()


def test_a_control_file_removed_and_made_anew_is_read_from_its_start(tmp_path):
    path = tmp_path / "run.h5.ctl"
    reader = Reader(path, since=0)
    send(path, op="dump")
    send(path, op="dump")
    assert len(list(reader.poll(time.monotonic()))) == 2
    path.unlink()
    send(path, op="stop")  # number 1 again, in a new, shorter file
    assert [c.op for c in list(reader.poll(time.monotonic() + 1))] == ["stop"]
    assert reader.problems == []


def test_a_control_file_written_anew_in_place_is_read_from_its_start(tmp_path):
    """The same inode made anew (a removed file's inode is reused at once on ext4): its
    first bytes tell."""
    path = tmp_path / "run.h5.ctl"
    reader = Reader(path, since=0)
    send(path, op="dump")
    assert len(list(reader.poll(time.monotonic()))) == 1
    longer = Command(seq=1, op="record", steps=3, level="timing").line()
    path.write_bytes(longer + Command(seq=2, op="stop").line())  # same inode, longer
    assert [c.op for c in list(reader.poll(time.monotonic() + 1))] == ["record", "stop"]
    assert reader.problems == []
