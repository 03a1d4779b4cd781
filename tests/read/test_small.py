"""The copy a closed recording keeps of its small tables (hookdbg/read/small.py): it
reads as its tables' columns do, it is used only where it is whole and current, and a
damaged one is refused in one line by every command."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from hookdbg.cli import cli
from hookdbg.read import Recording, RecordingError, checks, open_recording
from hookdbg.read.small import SmallTables
from hookdbg.store import schema
from tests.helpers import SAMPLES, hookdbg
from tests.read import hostile

Mutation = Callable[[h5py.File], None]


def changed(source: Path, target: Path, mutate: Mutation) -> Path:
    return hostile.make(source, target, mutate)


def without_copy(f: h5py.File) -> None:
    del f[schema.SMALL]


def what_reports_read(rec: Recording) -> dict[str, bytes | object]:
    """Everything a recording's small tables give, as bytes where they are rows."""
    return {
        "segments": rec.segments.tobytes(),
        "steps": rec.steps.tobytes(),
        "alerts": rec.alerts.tobytes(),
        "losses": rec.losses.tobytes(),
        "modules": rec.module_rows.tobytes(),
        "captures": rec.captures.tobytes(),
        "shards": sorted(rec.shards.items()),
        "facts": rec.facts,
        "end": None if rec.end_record is None else rec.end_record.tobytes(),
        "progress": None if rec.last_progress is None else rec.last_progress.tobytes(),
        "status": rec.status,
    }


@pytest.fixture(scope="module")
def kept_h5(tmp_path_factory) -> Path:
    """A run written anew as it went (--keep-last): its last file keeps the copy too."""
    path = tmp_path_factory.mktemp("kept") / "kept.h5"
    args = [SAMPLES / "nan_blowup.py", "--nan-step", "3", "--steps", "16"]
    out = hookdbg("record", "-q", "-o", path, "--capture", "proj", "--keep-last", "3", *args)
    assert out.returncode == 0, out.stderr
    return path


@pytest.mark.parametrize("fixture", ["nan_h5", "gan_h5", "eval_h5", "kept_h5"])
def test_the_copy_reads_as_the_tables_do_and_stands_for_their_columns(
    fixture, request, tmp_path, monkeypatch
):
    path = request.getfixturevalue(fixture)
    plain = changed(path, tmp_path / "plain.h5", without_copy)
    seen: set[str] = set()
    checked = checks.checked_dataset

    def spy(parent, name, where, *args, **kwargs):
        seen.add(where)
        return checked(parent, name, where, *args, **kwargs)

    for module in ("hookdbg.read.checks", "hookdbg.read.small", "hookdbg.read.tails"):
        monkeypatch.setattr(f"{module}.checked_dataset", spy)
    with open_recording(path) as rec:
        copied = what_reports_read(rec)
        # the copy, the end row's status and write error, what is committed: no column
        assert seen == {schema.SMALL, "end/status", "end/write_failed", schema.COMMITTED}
        rec.check()  # its columns hold what the copy holds
    with open_recording(plain) as rec:
        assert what_reports_read(rec) == copied
    assert copied["status"].value == "complete" and len(copied["steps"])
    # and the reports say the same
    for command in (["summary", "--json"], ["alerts", "--json"]):
        assert hookdbg(*command[:1], path, *command[1:]).stdout == (
            hookdbg(*command[:1], plain, *command[1:]).stdout.replace(str(plain), str(path))
        )


_HEAD = 16 * len(schema.SMALL_PARTS)


def _layout(f: h5py.File) -> tuple[np.ndarray, bytes]:
    """The copy's counts and stream sizes (2 rows), and its streams."""
    data = f[schema.SMALL][()].tobytes()
    return np.frombuffer(data[:_HEAD], "<i8").reshape(2, -1).copy(), data[_HEAD:]


def _restream(f: h5py.File, head: np.ndarray, streams: bytes) -> None:
    data = head.tobytes() + streams
    ds = f[schema.SMALL]
    ds.resize((len(data),))
    ds[...] = np.frombuffer(data, dtype="u1")


def garbled(part: str) -> Mutation:
    """The middle of ``part``'s stream overwritten."""

    def mutate(f: h5py.File) -> None:
        head, streams = _layout(f)
        i = schema.SMALL_PARTS.index(part)
        start, size = int(head[1, :i].sum()), int(head[1, i])
        middle, k = start + size // 2, min(8, size - size // 2)  # inside its stream
        data = bytearray(streams)
        data[middle : middle + k] = b"\xa5" * k
        _restream(f, head, bytes(data))

    return mutate


def truncated(f: h5py.File) -> None:
    f[schema.SMALL].resize((f[schema.SMALL].shape[0] // 2,))


def short_of_a_row(f: h5py.File) -> None:
    """The steps' count as committed, their stream a row short."""
    head, streams = _layout(f)
    i = schema.SMALL_PARTS.index("steps")
    start, size = int(head[1, :i].sum()), int(head[1, i])
    rows = zlib.decompress(streams[start : start + size])
    shorter = zlib.compress(rows[: len(rows) // int(head[0, i]) * (int(head[0, i]) - 1)])
    head[1, i] = len(shorter)
    _restream(f, head, streams[:start] + shorter + streams[start + size :])


def negative_size(f: h5py.File) -> None:
    head, streams = _layout(f)
    head[1, 0] -= 7
    head[1, 1] += 7
    head[1, 2] = -1
    _restream(f, head, streams)


def _commit(f: h5py.File, table: str, rows: int) -> None:
    committed = f[schema.COMMITTED][()]
    committed[schema.SEALED, list(schema.TABLES).index(table)] = rows
    f[schema.COMMITTED][...] = committed


def negative_count(f: h5py.File) -> None:
    """``committed`` and the copy agree that the shards table holds -1 rows."""
    head, streams = _layout(f)
    head[0, schema.SMALL_PARTS.index("shards")] = -1
    _restream(f, head, streams)
    _commit(f, "shards", -1)


def claims_a_billion_steps(f: h5py.File) -> None:
    """``committed`` and the copy agree on 10^9 steps, in a few kB."""
    head, streams = _layout(f)
    head[0, schema.SMALL_PARTS.index("steps")] = 10**9
    _restream(f, head, streams)
    _commit(f, "steps", 10**9)


def retyped(f: h5py.File) -> None:
    data = f[schema.SMALL][()]
    del f[schema.SMALL]
    f[schema.SMALL] = data.astype("f8")


def filtered(f: h5py.File) -> None:
    data = f[schema.SMALL][()]
    del f[schema.SMALL]
    f.create_dataset(schema.SMALL, data=data, chunks=True, compression="gzip")


DAMAGED: dict[str, tuple[Mutation, str]] = {
    "truncated": (truncated, "small_tables does not add up"),
    "a negative size": (negative_size, "small_tables does not add up"),
    "a negative count": (negative_count, "committed says table 'shards' holds -1 rows"),
    "a billion steps": (claims_a_billion_steps, "1,000,000,000 rows of 'steps'"),
    "retyped": (retyped, "small_tables has type float64, expected u1"),
    "compressed": (filtered, "small_tables uses HDF5 filters hookdbg never writes"),
    "10^12 bytes": (lambda f: f[schema.SMALL].resize((hostile.HUGE,)), "small_tables claims"),
    "a soft link": (hostile.soft(schema.SMALL, "/" + schema.SMALL), "small_tables is a soft link"),
    "the end row's stream garbled": (garbled("end"), "the copy of 'end' in small_tables"),
    "the last progress row garbled": (garbled("progress"), "of 'progress' in small_tables"),
}


def assert_refused(result, message: str, what: object) -> None:
    assert result.exit_code == 2, (what, result.output[-300:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], (what, lines)


@pytest.mark.parametrize("name", DAMAGED)
def test_every_command_refuses_a_damaged_copy_in_one_line(name, nan_h5, tmp_path):
    """Damage to what is read at open: the copy's layout, the end row and the last
    progress row."""
    mutate, message = DAMAGED[name]
    path = changed(nan_h5, tmp_path / "bad.h5", mutate)
    with pytest.raises(RecordingError, match=message):
        open_recording(path)
    for args in hostile.commands(path, nan_h5, tmp_path):
        assert_refused(CliRunner().invoke(cli, args), message, (name, args))


def parts_read(path: Path, tmp: Path, monkeypatch) -> list[tuple[set[str], int]]:
    """For each reader command, the parts of the copy it inflates, and its exit status."""
    out = []
    inflated = SmallTables._inflated
    for args in hostile.commands(path, path, tmp):
        seen: set[str] = set()

        def spy(small, name, seen=seen):
            seen.add(name)
            return inflated(small, name)

        with monkeypatch.context() as patch:
            patch.setattr(SmallTables, "_inflated", spy)
            result = CliRunner().invoke(cli, args)
        assert result.exit_code in (0, 1), (args, result.output[-300:])
        out.append((seen, result.exit_code))
    return out


def test_a_garbled_part_is_refused_by_the_commands_that_read_it(nan_h5, tmp_path, monkeypatch):
    """Each part is inflated as it is first read, and checked then: a command that
    reads it refuses it in one line; one that does not answers as before."""
    undamaged = changed(nan_h5, tmp_path / "undamaged.h5", lambda f: None)
    reads = parts_read(undamaged, tmp_path, monkeypatch)
    assert all({"end", "progress"} <= r for r, _ in reads)  # at open
    assert any("modules" in r for r, _ in reads) and not all("shards" in r for r, _ in reads)
    for part in schema.SMALL_TABLES:
        path = changed(nan_h5, tmp_path / f"{part}.h5", garbled(part))
        message = f"the copy of {part!r} in small_tables"
        for args, (read, status) in zip(
            hostile.commands(path, nan_h5, tmp_path), reads, strict=True
        ):
            result = CliRunner().invoke(cli, args)
            if part in read:
                assert_refused(result, message, (part, args))
            else:
                assert result.exit_code == status, (part, args, result.output[-300:])
        with pytest.raises(RecordingError, match=message):
            open_recording(path).check()


def _drop_last_step(f: h5py.File) -> None:
    """The steps table rewritten one row shorter, with ``committed``: by hand, after the
    file was closed."""
    n = f["steps/step"].shape[0] - 1
    for column in f["steps"].values():
        if column.name.rsplit("/", 1)[1] not in schema.TAIL_SLOTS:
            column.resize((n,))
    committed = f[schema.COMMITTED][()]
    committed[schema.SEALED, list(schema.TABLES).index("steps")] = n
    f[schema.COMMITTED][...] = committed


def _not_ended(f: h5py.File) -> None:
    """The end row as a recorder killed between writing the copy and the end row left it."""
    f["end/status"][0] = b""


def _a_step_in_a_tail(f: h5py.File) -> None:
    """One more step (the last one again) as a recording being written keeps it: in
    its table's tail."""
    group, i = f["steps"], list(schema.TABLES).index("steps")
    n = group["step"].shape[0]
    names = [str(c) for c in group.attrs[schema.TAIL_COLUMNS]]
    row = np.empty(1, np.dtype([(c, group[c].dtype) for c in names]))
    for c in names:
        row[c] = group[c][n - 1 : n]
    blob = np.frombuffer(zlib.compress(row.tobytes()), dtype="u1")
    slot = group[schema.TAIL_SLOTS[0]]
    slot.resize((max(slot.shape[0], len(blob)),))
    slot[: len(blob)] = blob
    committed = f[schema.COMMITTED][()]
    committed[:, i] = (n, 0, len(blob))
    f[schema.COMMITTED][...] = committed


STALE: dict[str, Mutation] = {
    "deleted": without_copy,
    "empty": lambda f: f[schema.SMALL].resize((0,)),
    "laid out otherwise": lambda f: f[schema.SMALL].attrs.__setitem__("parts", ["steps"]),
    "a table rewritten since": _drop_last_step,
    "the end row not written": _not_ended,
    "writing failed as it closed": lambda f: f["end/write_failed"].__setitem__(0, 1.7e9),
    "another status in place": lambda f: f["end/status"].__setitem__(0, b"exception"),
    "a table with a tail": _a_step_in_a_tail,
}


@pytest.mark.parametrize("name", STALE)
def test_a_copy_that_is_not_whole_and_current_is_not_used(name, nan_h5, tmp_path):
    path = changed(nan_h5, tmp_path / "stale.h5", STALE[name])
    plain = changed(path, tmp_path / "plain.h5", lambda f: f.pop(schema.SMALL, None))
    with open_recording(path) as rec, open_recording(plain) as tables:
        assert what_reports_read(rec) == what_reports_read(tables)
        assert rec.status is tables.status
        if name == "the end row not written":
            assert rec.status.value == "cut short"
        if name == "a table rewritten since":
            assert len(rec.steps) == 4
        if name == "a table with a tail":
            assert len(rec.segments) == 6
    summary = json.loads(hookdbg("summary", path, "--json").stdout)
    assert summary == json.loads(
        hookdbg("summary", plain, "--json").stdout.replace(str(plain), str(path))
    )


def _last_progress_dropped(f: h5py.File) -> None:
    f["progress/dropped"][-1] = 999


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda f: f["steps/end"].__setitem__(0, 1.0),
            "table 'steps' holds other rows than its copy among the small tables",
        ),
        (
            _last_progress_dropped,
            "its last progress row is not the one its copy among the small tables holds",
        ),
    ],
    ids=["a step's end", "the last progress row"],
)
def test_check_finds_columns_that_disagree_with_the_copy(nan_h5, tmp_path, edit, message):
    """A column changed in place to a value alone: reports read the copy (as the
    recorder wrote it); ``check``, which the TUI runs first, says the two differ."""
    path = changed(nan_h5, tmp_path / "edited.h5", edit)
    assert hookdbg("summary", path).returncode == 0
    with open_recording(path) as rec:
        for _ in range(2):  # and says so again when asked again
            with pytest.raises(RecordingError) as err:
                rec.check()
            assert str(err.value) == f"{path} is damaged: {message}"
