"""The recorder's side of the steering channel (hookdbg/recorder/steps/inbox.py): the
control file read from where it last stopped, through a descriptor it checked itself,
within a budget per look; what it must not apply, refused with why."""

from __future__ import annotations

import os
import re
import time

import pytest

from hookdbg.control import MAX_LINE, Command, send
from hookdbg.options import OptionError
from hookdbg.recorder.steps.inbox import Reader, Refused


def test_commands_go_out_numbered_and_come_back_whole(tmp_path):
    path = tmp_path / "run.h5.ctl"
    reader = Reader(path, since=time.time() - 1, budget=60.0)
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
    reader = Reader(path, since=time.time() + 1, budget=60.0)
    send(path, op="dump", sent=time.time() + 2)
    assert [c.op for c in list(reader.poll(time.monotonic()))] == ["dump"]


def test_a_line_still_being_written_waits_for_its_end(tmp_path):
    path = tmp_path / "run.h5.ctl"
    reader = Reader(path, since=0, budget=60.0)
    line = Command(seq=1, op="dump").line()
    path.write_bytes(line[:10])
    os.chmod(path, 0o600)
    assert list(reader.poll(time.monotonic())) == []
    path.write_bytes(line)
    assert [c.op for c in list(reader.poll(time.monotonic() + 1))] == ["dump"]


def test_a_control_file_others_may_write_is_not_read(tmp_path):
    path = tmp_path / "run.h5.ctl"
    reader = Reader(path, since=0, budget=60.0)
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
    reader = Reader(path, since=0, budget=60.0)
    target.write_text(Command(seq=1, op="stop").line().decode())
    assert list(reader.poll(time.monotonic())) == []


def test_bad_lines_are_skipped_and_said(tmp_path):
    path = tmp_path / "run.h5.ctl"
    reader = Reader(path, since=0, budget=60.0)
    path.write_bytes(b"garbage\n" + Command(seq=2, op="dump").line())
    os.chmod(path, 0o600)
    assert [c.op for c in list(reader.poll(time.monotonic()))] == ["dump"]
    assert len(reader.problems) == 1 and "not a JSON line" in reader.problems[0]


def test_a_control_file_removed_and_made_anew_is_read_from_its_start(tmp_path):
    path = tmp_path / "run.h5.ctl"
    reader = Reader(path, since=0, budget=60.0)
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
    reader = Reader(path, since=0, budget=60.0)
    send(path, op="dump")
    assert len(list(reader.poll(time.monotonic()))) == 1
    longer = Command(seq=1, op="record", steps=3, level="timing").line()
    path.write_bytes(longer + Command(seq=2, op="stop").line())  # same inode, longer
    assert [c.op for c in list(reader.poll(time.monotonic() + 1))] == ["record", "stop"]
    assert reader.problems == []


def private(path, data: bytes) -> None:
    path.write_bytes(data)
    os.chmod(path, 0o600)


def lines(*commands: Command) -> bytes:
    return b"".join(c.line() for c in commands)


def test_a_backlog_is_read_a_budget_at_a_time_and_in_order(tmp_path):
    path = tmp_path / "run.h5.ctl"
    reader = Reader(path, since=0)
    private(path, lines(*(Command(seq=i, op="dump") for i in range(1, 50_001))))
    first = list(reader.poll(0.0))
    assert 0 < len(first) < 50_000  # no look spends more than its budget
    got = first
    for look in range(1, 10_000):
        more = list(reader.poll(float(look)))
        if not more:
            break
        got += more
    assert [c.seq for c in got] == list(range(1, 50_001))
    assert list(reader.poll(0.05 + look)) == []  # too soon: not even looked at


def test_a_line_longer_than_any_command_is_skipped_across_reads(tmp_path):
    path = tmp_path / "run.h5.ctl"
    reader = Reader(path, since=0)
    reader.budget = 60.0  # reads of a bounded size, not of a bounded time: a loaded machine
    # would otherwise fall behind, and say so, in 300 KB
    private(path, b"{" + b"x" * 300_000 + b"}\n" + Command(seq=2, op="dump").line())
    got = []
    for look in range(100):
        got += reader.poll(float(look))
    assert [c.seq for c in got] == [2]
    assert reader.said(100.0) == [
        f"ignored a line of {path}: a line of 300,003 bytes, more than any command (4,096)"
    ]


def test_a_line_too_long_still_being_written_is_dropped_as_it_comes(tmp_path):
    path = tmp_path / "run.h5.ctl"
    reader = Reader(path, since=0, budget=60.0)
    private(path, b"x" * (MAX_LINE + 10))  # no end yet
    assert list(reader.poll(0.0)) == []
    with open(path, "ab") as f:
        f.write(b"y" * 100_000 + b"\n" + Command(seq=2, op="stop").line())
    assert [c.op for c in reader.poll(1.0)] == ["stop"]


TAINTED = (
    "others could write it, or it was another user's, while this recording watched it, "
    "and may still hold it open: remove it, and `hookdbg ctl` makes a new one"
)


@pytest.mark.parametrize("exposure", ["mode", "owner"])
def test_a_file_others_could_write_is_never_applied_again_even_once_private(tmp_path, exposure):
    """Whoever could write it then may hold it open and write it later."""
    path = tmp_path / "run.h5.ctl"
    reader = Reader(path, since=0, budget=60.0)
    private(path, b"")
    if exposure == "mode":
        os.chmod(path, 0o666)
    else:
        os.chown(path, 65534, 65534)
    with open(path, "ab") as held:  # another user's descriptor, kept open
        held.write(Command(seq=1, op="stop").line())
        held.flush()
        assert list(reader.poll(0.0)) == []
        os.chmod(path, 0o600)
        os.chown(path, os.getuid(), os.getgid())
        held.write(Command(seq=2, op="stop").line())  # written after it is private again
    sent = send(path, op="dump")  # the owner's own
    got = list(reader.poll(1.0))
    assert [(r.seq, r.why) for r in got] == [(1, TAINTED), (2, TAINTED), (sent.seq, TAINTED)]
    assert all(isinstance(r, Refused) for r in got) and got[2].sent == sent.sent
    why = "others may write it" if exposure == "mode" else "it belongs to another user"
    assert reader.said(1.0) == [
        f"not reading {path}: {why}",
        f"applying no command of {path}: {TAINTED}",
    ]
    path.unlink()  # as the refusal says
    again = send(path, op="dump")
    assert list(reader.poll(2.0)) == [again]
    assert reader.said(2.0) == [f"reading {path} again"]


def test_a_copy_of_an_older_control_file_put_back_applies_nothing_again(tmp_path):
    path, copy = tmp_path / "run.h5.ctl", tmp_path / "copy"
    reader = Reader(path, since=0, budget=60.0)
    first = send(path, op="level", level="timing")
    assert list(reader.poll(0.0)) == [first]
    copy.write_bytes(path.read_bytes())
    os.chmod(copy, 0o600)
    second = send(path, op="dump")
    assert list(reader.poll(1.0)) == [second]
    os.rename(copy, path)  # the older file back in its place, as long as before or not
    later = send(path, op="record", steps=2, level="timing", modules=("a.long.glob.*",))
    assert list(reader.poll(2.0)) == [later]  # its first line is not applied again
    assert reader.said(2.0) == [
        f"skipped 1 command of {path} sent before the last one read (a copy of an older "
        "control file put back?)"
    ]


def test_a_line_that_never_ends_costs_a_look_its_budget_only(tmp_path):
    path = tmp_path / "run.h5.ctl"
    reader = Reader(path, since=0)
    private(path, b"")
    os.truncate(path, 64 << 20)  # 64 MiB without a line break
    with open(path, "ab") as f:
        f.write(b"\n" + Command(seq=2, op="dump").line())
    looks, got = 0, []
    while not got:
        got = list(reader.poll(float(looks)))
        looks += 1
    assert looks > 1  # not read in one look
    assert [c.seq for c in got] == [2]
    said = reader.said(float(looks))
    assert re.fullmatch(
        rf"reading a backlog of [\d,]+ bytes of {re.escape(str(path))}, 1 ms a look", said[0]
    )
    assert f"read the backlog of {path}" in said


def test_another_thing_at_the_path_for_a_while_leaves_the_file_trusted(tmp_path):
    path, saved = tmp_path / "run.h5.ctl", tmp_path / "saved"
    reader = Reader(path, since=0, budget=60.0)
    send(path, op="dump")
    os.rename(path, saved)
    os.mkfifo(path)
    assert list(reader.poll(0.0)) == []
    assert list(reader.poll(1.0)) == []
    path.unlink()
    os.rename(saved, path)
    assert [c.seq for c in reader.poll(2.0)] == [1]  # never exposed: applied
    assert reader.said(2.0) == [f"not reading {path}: it is a named pipe", f"reading {path} again"]


def test_another_users_file_is_refused_once_however_often_it_is_made_anew(tmp_path):
    path = tmp_path / "run.h5.ctl"
    reader = Reader(path, since=0, budget=60.0)
    for look in range(20):
        made = tmp_path / "new"
        private(made, Command(seq=1, op="stop").line())
        os.chown(made, 65534, 65534)
        os.rename(made, path)
        assert list(reader.poll(float(look))) == []
    assert reader.said(20.0) == [f"not reading {path}: it belongs to another user"]


def test_bad_lines_are_said_first_with_why_then_counted(tmp_path):
    path = tmp_path / "run.h5.ctl"
    reader = Reader(path, since=0, budget=60.0)
    private(path, b"garbage\n" * 5 + b'{"seq": 9, "op": "explode"}\n')
    assert list(reader.poll(0.0)) == [
        Refused(9, "unknown command 'explode'; use one of: record, level, stop, dump")
    ]
    assert reader.said(time.monotonic()) == [
        f"ignored a line of {path}: not a JSON line: Expecting value: line 1 column 1 (char 0)"
    ]
    assert reader.said(time.monotonic()) == []  # the others: counted, said within a minute
    assert reader.said(time.monotonic(), final=True) == [f"ignored 4 more bad lines of {path}"]
