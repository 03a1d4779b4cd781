"""The steering channel attacked from a second process while a real recorder trains:
lines nobody should be able to slip in, lines too long or too many, things put at the
control file's path, numbers out of range, half-written lines (hookdbg/control.py has
the contract). One recorder serves the tests of this file, in order (but one that needs
a recorder of its own); each leaves the control file as ``ctl`` made it."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from hookdbg.control import MAX_LINE, REFUSED
from tests.cli.live import LiveRun, append
from tests.helpers import hookdbg


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    live = LiveRun(tmp_path_factory.mktemp("hostile"))
    first = hookdbg("ctl", live.out, "level", "idle")  # makes the control file, private
    assert first.returncode == 0, first.stdout + first.stderr
    yield live
    live.kill()


def line(seq: int, **fields: object) -> bytes:
    return (json.dumps({"seq": seq, "sent": time.time(), **fields}) + "\n").encode()


def answer_to(run: LiveRun, seq: int, after: float) -> str | None:
    found = [text for when, s, _, text in run.answers() if s == seq and when >= after]
    return found[0] if found else None


def ctl(run: LiveRun, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return hookdbg("ctl", run.out, *args, timeout=timeout)


def test_a_file_others_could_write_is_never_applied_again_until_made_anew(run):
    os.chmod(run.ctl, 0o666)
    try:
        since = time.time()
        held = os.open(run.ctl, os.O_WRONLY | os.O_APPEND)  # another user's, kept open
        os.write(held, line(900, op="record", steps=3, modules=["INJECTED"]))
        run.wait_for(
            lambda: any("others may write it" in note for note in run.notes()),
            "the recorder never said it refused the file",
        )
    finally:
        os.chmod(run.ctl, 0o600)
    try:
        os.write(held, line(901, op="record", steps=3, modules=["INJECTED"]))  # private now
        refused = ctl(run, "record", "--steps", "1", "--level", "timing")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert refused.stdout.splitlines()[-1].startswith("refused: others could write it")
        assert "remove it, and `hookdbg ctl` makes a new one" in refused.stdout
        for seq in (900, 901):
            assert (answer_to(run, seq, since) or "").startswith(REFUSED), seq
        run.ctl.unlink()  # as the answer says; the held descriptor keeps the old file
        asked = ctl(run, "record", "--steps", "1", "--level", "timing")
        assert asked.returncode == 0, asked.stdout + asked.stderr
    finally:
        os.close(held)
    assert not [t for *_, t in run.answers() if "INJECTED" in t and not t.startswith(REFUSED)]


def test_a_line_longer_than_any_command_is_skipped_and_the_channel_goes_on(run):
    glob = "x" * 300_000
    append(run.ctl, line(901, op="record", steps=2, modules=[glob]))
    asked = ctl(run, "record", "--steps", "1", "--level", "timing")
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert "recording step" in asked.stdout
    said = "".join(run.stderr)
    assert re.search(r"ignored a line of .*run\.h5\.ctl: a line of 300,\d{3} bytes", said), said


def test_ctl_refuses_what_a_recorder_would_refuse_before_writing_it(run):
    size = run.ctl.stat().st_size
    many = [arg for i in range(60) for arg in ("--modules", f"{i}" + "x" * 250)]  # 15 kB
    cases = [
        (many, f"more than a control line may hold ({MAX_LINE:,})"),
        (["--modules", "y" * 5_000], "a module glob of 5,000 characters: at most 256"),
        (["--modules", "[a-" * 80], None),  # costly to match, but as long as a name: taken
    ]
    for globs, why in cases:
        asked = ctl(run, "record", "--steps", "1", "--level", "timing", *globs)
        if why is None:
            assert asked.returncode == 0, asked.stdout + asked.stderr
            size = run.ctl.stat().st_size
            continue
        assert asked.returncode == 2, asked.stdout + asked.stderr
        assert why in asked.stderr and len(asked.stderr.strip().splitlines()) == 1
        assert run.ctl.stat().st_size == size  # nothing was written


def test_a_numbered_line_the_recorder_refuses_is_answered_with_why(run):
    since = time.time()
    append(run.ctl, line(902, op="explode"))
    append(run.ctl, line(903, op="record", steps=1, first=10**29))
    append(run.ctl, b"[" * 4_000 + b"\n")  # deeper than Python's JSON reader goes
    append(run.ctl, b'{"seq": 905, "op": "dump", "sent": 9' + b"9" * 400 + b"}\n")
    append(run.ctl, line(906, op="dump", steps=3))
    append(run.ctl, line(904, op="record", steps=1, first=10**12))
    run.wait_for(lambda: answer_to(run, 904, since), "the refusals were never answered")
    assert answer_to(run, 905, since) == f"{REFUSED}bad command time 9" + "9" * 400
    assert answer_to(run, 906, since) == f"{REFUSED}dump takes no steps"
    assert "internal error" not in "".join(run.stderr)  # the deep line: a bad line, no more
    assert answer_to(run, 902, since) == f"{REFUSED}unknown command 'explode'; use one of: " + (
        "record, level, stop, dump"
    )
    assert "bad first step 100000000000000000000000000000" in (answer_to(run, 903, since) or "")
    assert "steps ahead of this process" in (answer_to(run, 904, since) or "")
    asked = ctl(run, "record", "--steps", "1", "--level", "timing")  # nothing queued ahead
    assert asked.returncode == 0, asked.stdout + asked.stderr
    first = int(re.search(r"recording step (\d+)", asked.stdout).group(1))  # type: ignore[union-attr]
    assert first < run.step() + 100


def test_ctl_ends_a_half_written_last_line_before_its_own(run):
    append(run.ctl, b'{"seq": 905, "op": "du')  # a writer that died mid-line
    asked = ctl(run, "dump")
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert "flight recorder" in asked.stdout


@pytest.mark.parametrize("kind", ["fifo", "socket", "directory", "link to a device"])
def test_ctl_never_hangs_on_what_sits_at_the_control_path(run, kind):
    saved = run.ctl.with_name("saved.ctl")
    os.rename(run.ctl, saved)
    made = None
    try:
        if kind == "fifo":
            os.mkfifo(run.ctl)
        elif kind == "socket":
            made = socket.socket(socket.AF_UNIX)
            made.bind(str(run.ctl))
        elif kind == "directory":
            run.ctl.mkdir()
        else:
            run.ctl.symlink_to("/dev/zero")
        start = time.monotonic()
        refused = ctl(run, "dump", "--wait", "2", timeout=30)
        assert time.monotonic() - start < 30
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "not a control file of yours" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    finally:
        if made is not None:
            made.close()
        if run.ctl.is_dir() and not run.ctl.is_symlink():
            run.ctl.rmdir()
        else:
            run.ctl.unlink()
        os.rename(saved, run.ctl)
    back = ctl(run, "dump")
    assert back.returncode == 0, back.stdout + back.stderr


def test_a_flood_of_commands_is_answered_in_order_over_many_boundaries(run):
    since = time.time()
    flood = b"".join(
        line(10_000 + i, op="level", level="idle") if i % 2 else line(10_000 + i, op="dump")
        for i in range(2_000)
    )
    append(run.ctl, flood + b"garbage\n" * 2_000)
    behind = ctl(run, "dump", "--wait", "2")
    assert behind.returncode == 1, behind.stdout + behind.stderr
    working = r"working through commands sent before this one \(it answered [\d,]+ meanwhile\)"
    assert re.search(working + r"\. Command \d+ stays sent", behind.stderr), behind.stderr
    asked = ctl(run, "record", "--steps", "1", "--level", "timing", "--wait", "120", timeout=180)
    assert asked.returncode == 0, asked.stdout + asked.stderr
    answered = [(when, seq) for when, seq, _, _ in run.answers() if seq >= 10_000 and when >= since]
    assert [seq for _, seq in answered] == list(range(10_000, 12_000))  # each once, in order
    polls = _bursts([when for when, _ in answered])  # a recorder looks 0.1 s apart at least
    assert len(polls) > 2 and max(polls) < 1_000, polls  # a bounded share of each look
    said = "".join(run.stderr)
    assert said.count("ignored a line") <= 2  # the garbage: said once, then counted
    assert "more steering commands answered" in said  # stderr got a count, not 2,000 lines


def test_ctl_gives_up_on_a_lock_another_writer_holds(run):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(run.ctl)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        start = time.monotonic()
        blocked = ctl(run, "dump", "--wait", "2", timeout=60)
        assert time.monotonic() - start < 15  # --wait, and the interpreter's start
        assert blocked.returncode == 2, blocked.stdout + blocked.stderr
        assert "stayed locked by another writer for 2 s" in blocked.stderr
    finally:
        holder.kill()
        holder.wait()
    assert ctl(run, "dump").returncode == 0


HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(120)
"""


def test_a_refused_control_file_is_said_once_and_kept_in_the_recording(run):
    before = "".join(run.stderr).count("it belongs to another user")
    saved = run.ctl.with_name("saved.ctl")
    os.rename(run.ctl, saved)
    try:
        for _ in range(20):  # a new file of another user, again and again
            tmp = run.ctl.with_name("other.ctl")
            tmp.write_bytes(line(907, op="stop"))
            os.chown(tmp, 65534, 65534)
            os.rename(tmp, run.ctl)
            time.sleep(0.1)
        run.wait_for(
            lambda: any("belongs to another user" in n for n in run.notes()),
            "the refusal never reached the recording",
        )
    finally:
        run.ctl.unlink()
        os.rename(saved, run.ctl)
    back = ctl(run, "dump")
    assert back.returncode == 0, back.stdout + back.stderr
    assert "".join(run.stderr).count("it belongs to another user") == before + 1
    assert answer_to(run, 907, 0) is None  # its stop was never read


def test_ctl_and_the_recorder_show_a_glob_s_control_characters_escaped(tmp_path):
    """On a recorder of its own: the shared one's stderr says only a count of answers
    for a while after the floods of the tests before (steering.AnswerEcho)."""
    run = LiveRun(tmp_path)
    try:
        said = len(run.stderr)
        glob = "\x1b]0;PWNED\x07\x1b[2J\u202eevil"
        asked = ctl(run, "record", "--steps", "1", "--level", "timing", "--modules", glob)
        assert asked.returncode == 0, asked.stdout + asked.stderr
        assert "\x1b" not in asked.stdout and "\\x1b]0;PWNED\\x07" in asked.stdout
        run.wait_for(lambda: any("PWNED" in line for line in run.stderr[said:]), "never said")
        echoed = "".join(run.stderr[said:])
        assert "\x1b" not in echoed and "\u202e" not in echoed and "\\x1b]0;PWNED" in echoed
    finally:
        run.kill()


def test_ctl_reaches_the_recorder_through_a_link_to_its_recording(run):
    link = run.out.with_name("link.h5")
    link.symlink_to(run.out)
    asked = ctl(run, "dump")  # beside the file itself
    assert asked.returncode == 0
    through = hookdbg("ctl", link, "dump", "--wait", "30")
    assert through.returncode == 0, through.stdout + through.stderr
    assert not link.with_name("link.h5.ctl").exists()


def test_ctl_takes_no_answer_to_another_command_of_the_same_number(run):
    """The control file emptied after a command went in and before the recorder read it:
    the next command gets the same number; its answer is not the first one's."""
    os.kill(run.proc.pid, signal.SIGSTOP)  # the recorder reads nothing meanwhile
    try:
        run.ctl.write_bytes(b"")  # (its mode stays)
        first = subprocess.Popen(
            [sys.executable, "-m", "hookdbg", "ctl", str(run.out), "level", "idle", "--wait", "8"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while not run.ctl.stat().st_size:
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.05)
        run.ctl.write_bytes(b"")  # emptied before the recorder read it
        second = subprocess.Popen(
            [sys.executable, "-m", "hookdbg", "ctl", str(run.out), "dump", "--wait", "30"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        while not run.ctl.stat().st_size:
            assert time.monotonic() < deadline and second.poll() is None
            time.sleep(0.05)
    finally:
        os.kill(run.proc.pid, signal.SIGCONT)
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, out + err
    assert out.splitlines()[0] == "sent command 1: dump"
    out, err = first.communicate(timeout=60)
    assert out.splitlines() == ["sent command 1: level idle"], out + err
    assert first.returncode == 1 and "no answer from 1 rank" in err


def test_a_wait_that_is_no_number_is_refused(run):
    refused = ctl(run, "dump", "--wait", "nan")
    assert refused.returncode == 2 and "nan is no number of seconds" in refused.stderr


def _bursts(times: list[float], gap: float = 0.05) -> list[int]:
    """How many of the answers at ``times`` came together, burst by burst."""
    sizes = [1]
    for before, after in itertools.pairwise(times):
        if after - before > gap:
            sizes.append(0)
        sizes[-1] += 1
    return sizes


def test_ctl_prints_why_a_recorder_refused_its_command_and_exits_2(run):
    """(Last: it leaves the recorder with windows queued far ahead.)"""
    since, far = time.time(), run.step() + 500_000
    append(
        run.ctl,
        b"".join(line(20_000 + i, op="record", steps=1, first=far + 2 * i) for i in range(1_000)),
    )
    run.wait_for(lambda: answer_to(run, 20_999, since), "the windows were never queued", 180)
    refused = ctl(run, "record", "--steps", "1")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stdout.splitlines()[-1] == "refused: 1,000 windows wait to be recorded already"
    assert refused.stderr.strip().endswith("was refused (see above)")
