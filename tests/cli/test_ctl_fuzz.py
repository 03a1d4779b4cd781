"""A fuzzer against the steering channel of a real recorder: random and adversarial
lines (garbage, JSON of every shape, lines too long, half-written ones), things put at
the control file's path for a while (pipes, sockets, directories, links, another user's
file), writes while others may write it, and real commands among them. Nothing that
must be refused may ever be applied, every real command is answered once, training is
what it is without hookdbg, and no ``ctl`` call outlives its ``--wait``."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time

from hookdbg.control import REFUSED, send
from tests.cli.live import LiveRun, append
from tests.helpers import SAMPLES, hookdbg

SEED = 20261201
SECONDS = 12.0
MARK = "INJECTED"  # in every command that must never be applied


def marked(seq: int) -> bytes:
    command = {"seq": seq, "op": "record", "steps": 1, "modules": [MARK], "sent": time.time()}
    return (json.dumps(command) + "\n").encode()


def random_json(rng: random.Random) -> bytes:
    values = [None, True, -1, 0, 1, 2**70, 1e308, float("nan"), "", "x" * 40, [], {}, ["*"]]
    keys = ["seq", "op", "steps", "level", "first", "modules", "capture", "sent", "uid"]
    data = {k: rng.choice(values) for k in rng.sample(keys, rng.randint(0, len(keys)))}
    if "seq" in data:  # never the number of a real command
        data["seq"] = rng.choice([10**9 + rng.randrange(10**6), None, "7", -5, 1.5, 2**70])
    if rng.random() < 0.5:
        data["op"] = rng.choice(["record", "level", "dump", "explode", 3])
    return (json.dumps(data) + rng.choice(["\n", "\n", ""])).encode()


class Attacker:
    def __init__(self, run: LiveRun, rng: random.Random) -> None:
        self.run, self.rng = run, rng
        self.sent: list[tuple[int, float]] = []  # the real commands: number, time sent
        self.marked = 2 * 10**9
        self.removed = 0.0  # when the owner last removed the file others could write
        self.ctl_calls = 2  # real ``hookdbg ctl`` calls left to make at odd paths

    def real_command(self) -> None:
        op = self.rng.choice(["record", "level", "dump"])
        fields: dict[str, object] = {"op": op}
        if op == "record":
            fields.update(steps=self.rng.randint(1, 2), level="timing")
        elif op == "level":
            fields.update(level=self.rng.choice(["idle", "timing"]))
        command = send(self.run.ctl, **fields)
        self.sent.append((command.seq, command.sent))

    def garbage(self) -> None:
        """Random bytes, line breaks among them; or one line too long for any command."""
        size = self.rng.choice([0, 1, 10, 300, 5_000, 300_000])
        if size <= 300:
            data = bytes(self.rng.getrandbits(8) for _ in range(size))
        else:
            data = bytes(self.rng.choice(b'{}[]",:x0') for _ in range(size // 100)) * 100
        append(self.run.ctl, data + self.rng.choice([b"\n", b""]))

    def json_lines(self) -> None:
        append(
            self.run.ctl, b"".join(random_json(self.rng) for _ in range(self.rng.randint(1, 50)))
        )

    def while_others_may_write(self) -> None:
        """Another user's line, through a descriptor kept open after the file is private
        again: the recorder applies nothing of that file any more; the owner removes it,
        as the refusals say, and the next command makes a new one."""
        notes = self.run.notes
        os.chmod(self.run.ctl, 0o666)
        held = os.open(self.run.ctl, os.O_WRONLY | os.O_APPEND)
        try:
            self.marked += 1
            os.write(held, marked(self.marked))
            seen = len(notes())
            self.run.wait_for(lambda: len(notes()) > seen, "the refusal went unsaid")
            os.chmod(self.run.ctl, 0o600)
            self.marked += 1
            os.write(held, marked(self.marked))
        finally:
            os.chmod(self.run.ctl, 0o600)
            self.removed = time.time()  # what was sent to the file before may be lost
            self.run.ctl.unlink()
            os.close(held)
        self.real_command()  # the file made anew

    def something_else_at_the_path(self) -> None:
        ctl = self.run.ctl
        saved = ctl.with_name("saved.ctl")
        os.rename(ctl, saved)
        kind = self.rng.choice(["fifo", "socket", "dir", "link", "foreign"])
        held = None
        try:
            if kind == "fifo":
                os.mkfifo(ctl)
            elif kind == "socket":
                held = socket.socket(socket.AF_UNIX)
                held.bind(str(ctl))
            elif kind == "dir":
                ctl.mkdir()
            else:
                target = ctl.with_name("target.ctl")
                self.marked += 1
                target.write_bytes(marked(self.marked))
                os.chmod(target, 0o600)
                if kind == "link":
                    ctl.symlink_to(target)
                else:
                    os.chown(target, 65534, 65534)
                    os.rename(target, ctl)
            if self.ctl_calls and self.rng.random() < 0.5:  # a real ctl must not hang on it
                self.ctl_calls -= 1
                start = time.monotonic()
                out = hookdbg("ctl", self.run.out, "dump", "--wait", "1", timeout=30)
                assert time.monotonic() - start < 1 + 15  # its interpreter's start included
                assert out.returncode == 2, out.stdout + out.stderr
            time.sleep(self.rng.uniform(0, 0.3))
        finally:
            if held is not None:
                held.close()
            if ctl.is_dir() and not ctl.is_symlink():
                ctl.rmdir()
            elif ctl.exists() or ctl.is_symlink():
                ctl.unlink()
            ctl.with_name("target.ctl").unlink(missing_ok=True)
            os.rename(saved, ctl)


def test_a_fuzzed_channel_applies_nothing_it_must_not_and_answers_every_command(tmp_path):
    rng = random.Random(SEED)
    run = LiveRun(tmp_path)
    try:
        attacker = Attacker(run, rng)
        attacker.real_command()  # the control file, made private by send
        actions = [
            (attacker.real_command, 30),
            (attacker.garbage, 20),
            (attacker.json_lines, 20),
            (attacker.while_others_may_write, 2),
            (attacker.something_else_at_the_path, 6),
        ]
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            (action,) = rng.choices([a for a, _ in actions], [w for _, w in actions])
            action()
            time.sleep(rng.choice([0, 0, 0.01, 0.05]))
        sent = attacker.sent
        last_seq, last_sent = sent[-1]
        run.wait_for(
            lambda: any(s == last_seq and at == last_sent for _, s, at, _ in run.answers()),
            "the last real command was never answered",
            timeout=180,
        )
        printed, said = run.finish()
    finally:
        run.kill()
    answers = run.answers()
    assert not [t for *_, t in answers if MARK in t and not t.startswith(REFUSED)]
    for seq, when in sent:
        mine = [t for _, s, at, t in answers if s == seq and at == when]
        if when < attacker.removed:  # applied, refused (exposed) or lost (removed unread)
            assert len(mine) <= 1, (seq, mine)
            continue
        assert len(mine) == 1, (seq, mine)
        assert not mine[0].startswith(REFUSED), (seq, mine)
    assert "Traceback" not in said and "internal error" not in said, said
    trained = int(printed.split()[1])
    alone = subprocess.run(
        [sys.executable, str(SAMPLES / "long_run.py"), "--steps", str(trained), "--pause", "0"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert printed.split("last loss")[1] == alone.stdout.split("last loss")[1]
