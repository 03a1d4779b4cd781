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
        opened = set(seen)
        copied = what_reports_read(rec)
        rec.check()  # its columns hold what the copy holds
    with open_recording(plain) as rec:
        assert what_reports_read(rec) == copied
    assert copied["status"].value == "complete" and len(copied["steps"])
    # at open: the copy, the end row's status and write error, what is committed
    assert opened == {schema.SMALL, "end/status", "end/write_failed", schema.COMMITTED}
    # and the reports say the same
    for command in (["summary", "--json"], ["alerts", "--json"]):
        assert hookdbg(*command[:1], path, *command[1:]).stdout == (
            hookdbg(*command[:1], plain, *command[1:]).stdout.replace(str(plain), str(path))
        )


def _counts(f: h5py.File) -> tuple[np.ndarray, bytes]:
    raw = zlib.decompress(f[schema.SMALL][()].tobytes())
    head = 8 * len(schema.SMALL_PARTS)
    return np.frombuffer(raw[:head], dtype="<i8").copy(), raw[head:]


def _restream(f: h5py.File, data: bytes) -> None:
    ds = f[schema.SMALL]
    ds.resize((len(data),))
    ds[...] = np.frombuffer(data, dtype="u1")


def garbled(f: h5py.File) -> None:
    ds = f[schema.SMALL]
    middle = ds.shape[0] // 2
    ds[middle : middle + 16] = np.full(16, 0xA5, dtype="u1")


def truncated(f: h5py.File) -> None:
    f[schema.SMALL].resize((f[schema.SMALL].shape[0] // 2,))


def short_rows(f: h5py.File) -> None:
    """Counts as committed, a row's bytes missing after them."""
    counts, body = _counts(f)
    _restream(f, zlib.compress(counts.tobytes() + body[:-10]))


def negative_counts(f: h5py.File) -> None:
    counts, body = _counts(f)
    counts[:] = -1
    _restream(f, zlib.compress(counts.tobytes() + body))


def claims_a_billion_steps(f: h5py.File) -> None:
    """``committed`` and the copy agree on 10^9 steps, in a few kB."""
    counts, body = _counts(f)
    counts[schema.SMALL_PARTS.index("steps")] = 10**9
    _restream(f, zlib.compress(counts.tobytes() + body))
    committed = f[schema.COMMITTED][()]
    committed[schema.SEALED, list(schema.TABLES).index("steps")] = 10**9
    f[schema.COMMITTED][...] = committed


def retyped(f: h5py.File) -> None:
    data = f[schema.SMALL][()]
    del f[schema.SMALL]
    f[schema.SMALL] = data.astype("f8")


def filtered(f: h5py.File) -> None:
    data = f[schema.SMALL][()]
    del f[schema.SMALL]
    f.create_dataset(schema.SMALL, data=data, chunks=True, compression="gzip")


DAMAGED: dict[str, tuple[Mutation, str]] = {
    "garbled": (garbled, "small_tables does not"),
    "truncated": (truncated, "small_tables does not"),
    "short of a row": (short_rows, "small_tables does not hold the rows its counts say"),
    "negative counts": (negative_counts, "small_tables does not begin with its row counts"),
    "a billion steps": (claims_a_billion_steps, "more than its"),
    "retyped": (retyped, "small_tables has type float64, expected u1"),
    "compressed": (filtered, "small_tables uses HDF5 filters hookdbg never writes"),
    "10^12 bytes": (lambda f: f[schema.SMALL].resize((hostile.HUGE,)), "small_tables claims"),
    "a soft link": (hostile.soft(schema.SMALL, "/" + schema.SMALL), "small_tables is a soft link"),
}


@pytest.mark.parametrize("name", DAMAGED)
def test_every_command_refuses_a_damaged_copy_in_one_line(name, nan_h5, tmp_path):
    mutate, message = DAMAGED[name]
    path = changed(nan_h5, tmp_path / "bad.h5", mutate)
    with pytest.raises(RecordingError, match=message):
        open_recording(path)
    for args in hostile.commands(path, nan_h5, tmp_path):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, (name, args, result.output[-300:])
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (name, args, lines)


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


STALE: dict[str, Mutation] = {
    "deleted": without_copy,
    "empty": lambda f: f[schema.SMALL].resize((0,)),
    "a table rewritten since": _drop_last_step,
    "the end row not written": _not_ended,
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
    summary = json.loads(hookdbg("summary", path, "--json").stdout)
    assert summary == json.loads(
        hookdbg("summary", plain, "--json").stdout.replace(str(plain), str(path))
    )


def test_check_finds_columns_that_disagree_with_the_copy(nan_h5, tmp_path):
    """A step's time changed in its column alone: reports read the copy (as the
    recorder wrote it); ``check``, which the TUI runs first, says the two differ."""
    path = changed(nan_h5, tmp_path / "edited.h5", lambda f: f["steps/end"].__setitem__(0, 1.0))
    assert hookdbg("summary", path).returncode == 0
    with open_recording(path) as rec, pytest.raises(RecordingError) as err:
        rec.check()
    assert str(err.value) == (
        f"{path} is damaged: table 'steps' holds other rows than its copy among the small tables"
    )
