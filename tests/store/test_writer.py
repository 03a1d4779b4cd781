"""The writer: crash safety under kill -9, the full-queue policy, a full disk."""

import json
import os
import re
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from hookdbg.store import newfile, rows, schema
from hookdbg.store.schema import ModuleKind, Phase
from hookdbg.store.writer import Writer, WriterError, batch_bytes
from hookdbg.text import plural
from tests.helpers import hookdbg, live_recording, tables

# the end row of a run that completed with nothing in it (tests add their counts)
END = {
    "time": 0.0,
    "status": "complete",
    "exit_code": 0,
    "steps": 0,
    "calls": 0,
    "alerts": 0,
    "message": "",
}
STEP_ROW = (0, 0, 0, 0.0, 1.0, 3, 1, 1, 1, float("nan"), 0, 0.0)  # step, segment, kind, ...
ROW_COST = batch_bytes({"steps": [STEP_ROW]})  # what a steps row weighs in the backlog


def test_rows_are_appended_and_the_end_row_marks_completion(tmp_path):
    writer = Writer(tmp_path / "w.h5", {"format": schema.FORMAT}, flush_interval=0.05)
    writer.submit({"steps": [STEP_ROW, (1, 1, 0, 1.0, 2.0, 3, 1, 1, 1, float("nan"), 0, 0.0)]})
    writer.close({**END, "steps": 2, "calls": 6})
    t = tables(tmp_path / "w.h5")
    assert list(t["steps"]["step"]) == [0, 1] and t["end"]["status"][0] == b"complete"
    assert len(t["progress"]) >= 1
    with h5py.File(tmp_path / "w.h5", "r") as f:  # closed cleanly: a plain open works too
        assert f.attrs["format"] == schema.FORMAT


def test_a_file_closed_with_no_room_for_the_copy_of_its_small_tables_stays_complete(
    tmp_path, monkeypatch
):
    """Every row is committed when the copy is written: with the disk nearly full the
    writer leaves it out (the columns hold everything) rather than risk a write error
    that would call the recording failed."""
    real = newfile.free_space  # the new file is made as usual; growing it finds 4 kB

    def free_space(path, replacing=True):
        return real(path) if replacing else 4096

    monkeypatch.setattr(newfile, "free_space", free_space)
    writer = Writer(tmp_path / "w.h5", {"format": schema.FORMAT}, flush_interval=0.05)
    writer.submit({"steps": [STEP_ROW]})
    writer.close({**END, "steps": 1})
    assert writer.failed is None
    with h5py.File(tmp_path / "w.h5", "r") as f:
        assert f[schema.SMALL].shape == (0,) and f["end/status"][0] == b"complete"
    monkeypatch.undo()
    writer = Writer(tmp_path / "room.h5", {"format": schema.FORMAT}, flush_interval=0.05)
    writer.submit({"steps": [STEP_ROW]})
    writer.close({**END, "steps": 1})
    with h5py.File(tmp_path / "room.h5", "r") as f:
        assert f[schema.SMALL].shape[0] > 0


def test_columns_are_compressed_as_the_format_says(tmp_path):
    """docs/format.md: floats with LZF after shuffle, the rest with gzip after shuffle;
    every value comes back as it went in."""
    writer = Writer(tmp_path / "w.h5", {"format": schema.FORMAT}, flush_interval=0.05)
    steps = [(s, s, 0, s / 3, float("inf"), 3, 1, 1, 1, float("nan"), 0, 0.0) for s in range(50)]
    writer.submit({"steps": steps})
    writer.close({**END, "steps": 50})
    with h5py.File(tmp_path / "w.h5", "r") as f:
        seen = set()
        for table in schema.TABLES:
            for name, column in f[table].items():
                if name in schema.TAIL_SLOTS:  # bytes rewritten in place, never compressed
                    assert column.compression is None and column.dtype == np.uint8
                    continue
                kind = column.dtype.kind
                expected = ("lzf" if kind == "f" else "gzip", True)
                assert (column.compression, column.shuffle) == expected, (table, name)
                seen.add(kind)
        assert {"f", "S", "i", "u"} <= seen
        start = f["steps/start"][()]
        assert np.array_equal(start, [s / 3 for s in range(50)])
        assert np.isinf(f["steps/end"][()]).all()


def test_flush_writes_what_was_handed_over_and_pulled_before_it_returns(tmp_path):
    """The writer sleeps for half an hour between drains here: flush() drains now, the
    recorder's rows (pull) included, and returns once they are written."""
    pulled = []
    writer = Writer(tmp_path / "w.h5", {}, flush_interval=3600, pull=lambda: pulled.append(1))
    writer.submit({"steps": [STEP_ROW] * 4})
    time.sleep(0.2)
    assert writer.backlog_bytes > 0 and not pulled  # nothing happens on its own
    assert writer.flush(timeout=30) is True
    assert writer.backlog_bytes == 0 and pulled
    writer.close({**END, "steps": 4})
    assert writer.flush(timeout=30) is False  # closed: nothing more reaches the file
    assert len(tables(tmp_path / "w.h5")["steps"]) == 4


def test_flush_returns_false_at_once_when_the_writer_thread_broke(tmp_path):
    def pull():
        raise RuntimeError("a bug")

    writer = Writer(tmp_path / "w.h5", {}, flush_interval=3600, pull=pull, warn=lambda m: None)
    started = time.monotonic()
    assert writer.flush(timeout=30) is False and time.monotonic() - started < 10
    assert writer.died == "RuntimeError: a bug"
    writer.close(END)


def test_a_full_queue_drops_whole_batches_and_counts_them(tmp_path):
    warnings = []
    batch = {"steps": [STEP_ROW] * 8}
    room = 2 * batch_bytes(batch)  # two batches fit, a third does not
    writer = Writer(
        tmp_path / "w.h5", {}, flush_interval=60, max_backlog_bytes=room, warn=warnings.append
    )
    for _ in range(3):  # the writer sleeps for 60 s: nothing drains meanwhile
        writer.submit(dict(batch))
    assert writer.dropped_rows == 8 and len(warnings) == 1 and "dropping" in warnings[0]
    writer.close(END)
    t = tables(tmp_path / "w.h5")
    assert len(t["steps"]) == 16 and t["end"]["dropped"][0] == 8
    assert t["progress"]["dropped"][-1] == 8


def captured(step: int, nbytes: int) -> tuple:
    """A captures row as the recorder hands it over: its fields, then its bytes."""
    return (step, step, 0, 0, int(Phase.FWD), 1, "", "float32", "(1,)", 1, bytes(nbytes))


def test_captured_tensors_give_their_room_to_the_statistics(tmp_path):
    """Captured tensors go first: one larger than the bound is taken while no other
    waits, the next is dropped, and rows are never dropped for their sake; rows that
    come while captured tensors fill the bound take their room, the latest first."""
    room = 1 << 20
    warnings: list[str] = []
    writer = Writer(
        tmp_path / "w.h5", {}, flush_interval=60, max_backlog_bytes=room, warn=warnings.append
    )
    step = {"steps": [STEP_ROW] * 8}
    writer.submit({**step, "captures": [captured(0, 2 * room)]})  # alone: taken
    writer.submit({**step, "captures": [captured(1, 1000)]})  # no room beside it
    for _ in range(3):  # the writer sleeps for 60 s: nothing drains meanwhile
        writer.submit(dict(step))
    assert writer.dropped_rows == 1 and len(warnings) == 1
    assert "dropping captured tensors (the statistics go on)" in warnings[0]
    writer.close(END)
    t = tables(tmp_path / "w.h5")
    assert len(t["steps"]) == 40 and list(t["captures"]["step"]) == [0]

    writer = Writer(tmp_path / "v.h5", {}, flush_interval=60, max_backlog_bytes=room)
    nine = [captured(k, room // 10) for k in range(9)]
    writer.submit({"captures": nine})  # they fit
    rows = {"steps": [STEP_ROW] * (room // 5 // ROW_COST)}  # the room of two
    writer.submit(rows)
    assert writer.dropped_rows == 0  # taken: the writer makes room when it takes them in
    assert writer.flush(timeout=30) and writer.backlog_bytes == 0
    writer.close(END)
    t = tables(tmp_path / "v.h5")
    kept = list(t["captures"]["step"])
    assert kept == list(range(len(kept))) and writer.dropped_rows == 9 - len(kept) > 0
    assert batch_bytes({"captures": nine[: len(kept)]}) + batch_bytes(rows) <= room
    assert len(t["steps"]) == len(rows["steps"])


def test_histogram_counts_count_towards_the_backlog(tmp_path):
    """With --histograms 1024 a tensor row also holds 8 kB of counts: a backlog limit
    that fits a batch of plain rows twice over does not fit it with histograms."""
    row = (0, 0, 0, 0, 0, 1, "", ((4,), "float32", "cpu", 4, *[0.0] * 5, 0, 0, 0, 0.0))
    batch = {"tensors": [row] * 100}
    room = 2 * batch_bytes(batch)
    plain = Writer(tmp_path / "plain.h5", {}, flush_interval=60, max_backlog_bytes=room)
    binned = Writer(
        tmp_path / "binned.h5",
        {},
        flush_interval=60,
        max_backlog_bytes=room,
        tables=schema.tables(1024),
        warn=lambda message: None,
    )
    for writer in (plain, binned):
        for _ in range(2):  # the writer sleeps for 60 s: nothing drains meanwhile
            writer.submit(dict(batch))
    assert plain.dropped_rows == 0 and binned.dropped_rows == 100
    for writer in (plain, binned):
        writer.close(END)


def test_an_uncreatable_file_is_a_clean_error(tmp_path):
    with pytest.raises(WriterError, match=r"cannot create .*missing"):
        Writer(tmp_path / "missing" / "w.h5", {})


def test_kill_9_leaves_a_readable_file_with_what_was_flushed(tmp_path):
    path = tmp_path / "killed.h5"
    with live_recording(path, calls=200):
        rows = len(tables(path)["calls"])
    t = tables(path)
    assert len(t["calls"]) >= rows and t["end"]["status"][0] == b""  # cut short: not ended
    sites = t["modules"]["id"][t["modules"]["kind"] == ModuleKind.LOSS]
    own = (t["calls"]["phase"] != Phase.BWD) | np.isin(t["calls"]["module"], sites)
    calls = t["calls"]["call"][own]  # forward, optimizer and backward pass rows
    assert len(np.unique(calls)) == len(calls)
    assert np.setdiff1d(np.arange(calls.max() + 1), calls).size <= 3  # in flight at the kill


DISK_FULL = """
import signal, resource, torch, hookdbg
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
model = torch.nn.Linear(64, 64)
with hookdbg.record({path!r}, flush_interval=0.05, quiet=False) as rec:
    resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))
    for _ in range(3000):
        model(torch.randn(8, 64)).sum().backward()
print("training finished", rec.write_error is not None)
"""


def test_a_full_disk_stops_recording_but_not_training(tmp_path):
    path = tmp_path / "full.h5"
    out = subprocess.run(
        [sys.executable, "-c", DISK_FULL.format(path=str(path))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "training finished True" in out.stdout
    assert "recording stopped, training goes on" in out.stderr
    assert os.path.getsize(path) <= 300_000
    assert "Exception ignored" not in out.stderr and "(File too large)" in out.stderr
    # the file says that writing stopped, why, and how much was lost
    report = subprocess.run(
        [sys.executable, "-m", "hookdbg", "summary", "--json", str(path)],
        capture_output=True,
        text=True,
    )
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    assert data["write_error"] == "File too large" and data["dropped_rows"] > 0
    assert data["ended"] == "complete" and data["write_failed_at"] is not None
    assert data["steps"] > 0  # what was written before stays readable
    text = subprocess.run(
        [sys.executable, "-m", "hookdbg", "summary", str(path)], capture_output=True, text=True
    ).stdout
    assert "writing stopped at" in text and "(File too large)" in text
    # no phantom rows: every step row the committed state vouches for was written whole
    whole = tables(path)["steps"]
    assert len(whole) and np.all(whole["end"] > 0) and np.all(whole["calls"] > 0)


FILLS_THE_DISK = """
import os, resource, signal, sys, time, torch
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
full = os.path.getsize(sys.argv[1]) + 330_000  # some 20 steps in
resource.setrlimit(resource.RLIMIT_FSIZE, (full, full))
model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps_after_full = 0
for _ in range(3000):  # until 20 steps after the file is full
    opt.zero_grad()
    model(torch.randn(8, 64)).pow(2).mean().backward()
    time.sleep(0.02)  # some 25 steps a flush, whatever the machine
    opt.step()
    steps_after_full += os.path.getsize(sys.argv[1]) >= full
    if steps_after_full == 20:
        break
"""


def test_a_full_disk_is_reported_with_the_steps_the_file_really_holds(tmp_path):
    """The steps of the flush that failed never reached the file: the closing line
    counts those that did."""
    script, path = tmp_path / "train.py", tmp_path / "full.h5"
    script.write_text(FILLS_THE_DISK)
    out = hookdbg("record", "--flush-interval", "0.5", "-o", path, script, path)
    assert out.returncode == 0, out.stderr
    said = re.search(r"stopped early \(File too large\): it holds ([\d,]+) step", out.stderr)
    assert said, out.stderr
    held = len(tables(path)["steps"])
    assert held > 1 and int(said.group(1).replace(",", "")) == held


FIVE_STEPS = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(5):
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
"""


def test_the_closing_line_counts_what_the_file_holds_when_rows_were_dropped(tmp_path):
    """A bound of 1 kB and a writer that sleeps through the run: all but the first
    hand-over are dropped, and the closing line says what reached the file of what ran."""
    script, path = tmp_path / "train.py", tmp_path / "run.h5"
    script.write_text(FIVE_STEPS)
    out = hookdbg("record", "--max-backlog", "0.001", "--flush-interval", "60", "-o", path, script)
    assert out.returncode == 0, out.stderr
    t = tables(path)
    held = len(t["steps"])
    calls = int((t["calls"]["phase"] == Phase.FWD).sum())
    assert held < 5 and t["end"]["dropped"][0] > 0
    said = (
        f"recorded {plural(held, 'step')}, {plural(calls, 'module call')} of the 5 steps, "
        f"15 module calls seen, 0 alerts -> {path}"
    )
    assert said in out.stderr, out.stderr


PAUSE_AFTER_STEPS = """
import time, torch
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(5):
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
print("finished", flush=True)
time.sleep(60)  # loading the next batch takes long (or the run hangs here)
"""


def test_steps_finished_before_a_kill_9_are_in_the_file_whatever_the_script_does(tmp_path):
    """No hook runs during the pause: the writer collects the rows on its own timer."""
    script, path = tmp_path / "train.py", tmp_path / "run.h5"
    script.write_text(PAUSE_AFTER_STEPS)
    cmd = [sys.executable, "-m", "hookdbg", "record", "-q", "--flush-interval", "0.2"]
    proc = subprocess.Popen([*cmd, "-o", str(path), str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("finished")
    time.sleep(1.0)  # five flush intervals
    proc.kill()
    proc.wait()
    out = subprocess.run(
        [sys.executable, "-m", "hookdbg", "summary", "--json", str(path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["status"] in ("cut short", "live") and data["steps"] == 5


CAPTURING = """
import time, torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(1000):
    opt.zero_grad()
    model(torch.randn(256, 512)).pow(2).mean().backward()
    opt.step()
    print("finished", step, time.time(), flush=True)
    time.sleep(0.05)
"""


def test_steps_finished_before_a_kill_9_are_in_the_file_with_captures_on(tmp_path):
    """Every step captures about 15 MB, more than the writer compresses and writes in
    that time: the steps' rows must not wait behind the captured bytes, so a kill -9
    loses about a flush interval of finished steps, as without captures."""
    script, path = tmp_path / "train.py", tmp_path / "run.h5"
    script.write_text(CAPTURING)
    cmd = [sys.executable, "-m", "hookdbg", "record", "-q", "--flush-interval", "0.2"]
    cmd += ["--capture", "*", "--capture-budget", "100000", "-o", str(path), str(script)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    finished = {}
    try:
        while len(finished) < 6 or time.time() < finished[0] + 2.0:
            line = proc.stdout.readline()
            assert line, "the script ended before it trained 6 steps"
            _, step, at = line.split()
            finished[int(step)] = float(at)
    finally:
        proc.kill()
        killed_at = time.time()
        proc.wait()
    t = tables(path)
    steps = t["steps"]
    held = set(steps["step"][steps["kind"] == schema.StepKind.TRAIN].tolist())
    old = {step for step, at in finished.items() if at < killed_at - 1.0}  # 5 intervals
    assert len(old) >= 3 and old <= held, (sorted(old), sorted(held))
    assert len(t["captures"]) > 0  # and captured tensors with them


@pytest.mark.skipif(rows.RowBuffer is None, reason="the compiled packer is not built")
def test_packed_rows_and_row_tuples_are_written_in_the_order_they_came(tmp_path):
    """A table's rows may come packed (the recorder's row buffers) or as tuples (from
    elsewhere); the file holds them in the order they were handed over."""
    call = (0, 0, 0, 0, 3, 0, -1, 0, 0.0, 1.0, 1.0)
    buffer = rows.buffer_for(schema.CALLS)
    writer = Writer(tmp_path / "w.h5", {}, flush_interval=60)
    for first in range(0, 12, 3):
        batch = [(first + i, *call[1:]) for i in range(3)]
        if first % 2:
            buffer.extend(batch)
            writer.submit({"calls": rows.Packed(buffer.dtype, buffer.take())})
        else:
            writer.submit({"calls": batch})
    writer.close(END)
    assert tables(tmp_path / "w.h5")["calls"]["call"].tolist() == list(range(12))


def test_captured_tensors_are_stored_once_whatever_the_flushes(tmp_path):
    """100 flushes of a few captured tensors each: a compressed chunk of captured bytes
    rewritten at each flush would leave its old copies behind (38.6 MB for these 1.7 MB)."""
    import torch

    import hookdbg
    from hookdbg.read import open_recording

    path = tmp_path / "captures.h5"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU())
    with hookdbg.record(path, quiet=True, capture="model.0", flush_interval=3600) as rec:
        for _ in range(100):
            model(torch.randn(32, 32)).sum().backward()
            assert rec.flush()
    captured = open_recording(path).captured()
    stored = sum(c.nbytes for c in captured)
    assert len(captured) == 500 and os.path.getsize(path) < 1.3 * stored + 512 * 1024
    first = captured[0]
    assert open_recording(path).tensor(first).shape == tuple(first.shape)
