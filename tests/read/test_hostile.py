"""The reader survives any file: a real recording damaged in every way the format allows
(every attribute, every dataset, the tables, links, storage), run through every reader
command. A command refuses a damaged file with one line and exit status 2, never a
traceback, when it reads what is damaged: the file's attributes and its tables' groups
are checked at open, a table's columns as the table is first read (so a report reads,
and checks, only the tables it needs; of a closed file's small tables it reads their
copy, hookdbg/read/small.py). A damaged column a command does not read leaves it
working; ``Recording.check`` refuses every damage. Commands run in-process through
click's CliRunner (the same code path as the command line), and a few as real
processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from hookdbg.cli import cli
from hookdbg.read import RecordingError, checks, open_recording
from hookdbg.store import schema
from tests.helpers import ROOT, hookdbg
from tests.read import hostile

BASE = ROOT / "tests" / "data" / "nan_a.h5"  # alerts, flight-recorder tensors, 5 steps
OTHER = ROOT / "tests" / "data" / "nan_b.h5"


def reader_commands(path, tmp) -> list[list[str]]:
    return hostile.commands(path, BASE, tmp)


def run(args: list[str]):
    return CliRunner().invoke(cli, args)


def assert_refused(name: str, args: list[str], result) -> None:
    """Exit 2 with one line on stderr, and no traceback anywhere."""
    what = f"{name}: hookdbg {' '.join(args[:1] + args[2:])}"
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), f"{what} raised {result.exception!r}"
    assert result.exit_code == 2, f"{what} exited {result.exit_code}: {result.output[-300:]}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), f"{what}: {result.stderr!r}"
    assert "Traceback" not in result.output


def families() -> list[str]:
    return ["attributes", *schema.TABLES, schema.CAPTURE_DATA, "structure", "structure, new"]


# what BASE, a schema 1 recording, lacks: damaged in one of today's recordings instead
NEWER = {"losses", "shards", "device_times", "structure, new"}


def variants(family: str, tmp, base):
    if family == "attributes":
        with h5py.File(base, "r") as f:
            return list(hostile.attribute_variants(f))
    if family.startswith("structure"):
        return list(hostile.structure_variants(base, OTHER, tmp))
    with h5py.File(base, "r") as f:
        return list(hostile.dataset_variants(f, family))


def test_the_undamaged_recording_works(tmp_path):
    copy = hostile.make(BASE, tmp_path / "copy.h5", lambda f: None)
    for args in reader_commands(copy, tmp_path):
        result = run(args)
        assert result.exit_code == 0 and result.exception is None, (args, result.output)
        assert result.stdout.strip() or "wrote" in result.stderr, args


def damaged_column(name: str) -> str | None:
    """The column a variant damages (or the stored tensors' bytes), checked as it is
    first read. None: the file's attributes or a table's group, checked at open."""
    first = name.split()[0]
    return first if first == schema.CAPTURE_DATA or "/" in first else None


# every module that checks a dataset before it reads it
CHECKERS = ("hookdbg.read.checks", "hookdbg.read.small", "hookdbg.read.tails")


def columns_read(path, tmp) -> list[tuple[set[str], int]]:
    """For each reader command, the columns it checks, and so reads, of ``path`` (an
    undamaged file: ``table/column``, or the stored tensors' bytes), and its exit status
    (1: what it reports differs, or holds alerts)."""
    out = []
    checked = checks.checked_dataset
    for args in reader_commands(path, tmp):
        seen: set[str] = set()

        def spy(parent, name, where, expected, at, *rest, seen=seen, **kwargs):
            if at == path:
                seen.add(where)
            return checked(parent, name, where, expected, at, *rest, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            for module in CHECKERS:
                patch.setattr(f"{module}.checked_dataset", spy)
            result = run(args)
            assert result.exit_code in (0, 1), (args, result.output[-300:])
            assert result.exception is None or isinstance(result.exception, SystemExit), args
        out.append((seen, result.exit_code))
    return out


def tables_of(columns: set[str]) -> set[str]:
    return {c.split("/")[0] for c in columns}


def test_a_command_reads_only_the_tables_it_needs(tmp_path):
    """What checking a table as it is first read buys: a profile reads no tensor
    summaries, printing a stored tensor reads its bytes and no summary, and nothing
    but that reads the stored bytes."""
    copy = hostile.make(BASE, tmp_path / "copy.h5", lambda f: None)
    commands = reader_commands(copy, tmp_path)
    reads = {
        args[0] + " " + " ".join(args[2:]): tables_of(r)
        for args, (r, _) in zip(commands, columns_read(copy, tmp_path), strict=True)
    }
    assert {"steps", "calls", "modules"} <= reads["profile "] and "tensors" not in reads["profile "]
    stored = reads["tensor standardize --step 3 --slot output"]
    assert {"captures", schema.CAPTURE_DATA} <= stored and "tensors" not in stored
    assert [c for c, r in reads.items() if schema.CAPTURE_DATA in r] == [
        "tensor standardize --step 3 --slot output"
    ]


@pytest.mark.parametrize("family", families())
def test_every_reader_command_refuses_every_damage_it_reads(family, tmp_path, nan_h5):
    base = nan_h5 if family in NEWER else BASE
    made = variants(family, tmp_path, base)
    assert made, family
    undamaged = hostile.make(base, tmp_path / "undamaged.h5", lambda f: None)
    reads = columns_read(undamaged, tmp_path)
    refusals = 0
    answered: set[tuple[str, int]] = set()  # (column, command) shown to answer as before
    for i, (name, mutate) in enumerate(made):
        path = hostile.make(base, tmp_path / f"v{i}.h5", mutate)
        column = damaged_column(name)
        start = time.perf_counter()
        commands = enumerate(zip(reader_commands(path, tmp_path), reads, strict=True))
        for k, (args, (read, status)) in commands:
            refused = column is None or column in read
            if not refused and (column, k) in answered:
                continue  # a column it never reads: how it is damaged makes no difference
            result = run(args)
            if refused:
                assert_refused(name, args, result)
                refusals += 1
            else:  # the damage lies in a column it never reads: it answers as before
                what = f"{name}: hookdbg {' '.join(args[:1] + args[2:])}"
                assert result.exit_code == status, (
                    f"{what} exited {result.exit_code}: {result.output[-300:]}"
                )
                answered.add((column, k))
        seconds = time.perf_counter() - start  # refused before reading, not after
        assert seconds < 10, (
            f"{name}: {len(reader_commands(path, tmp_path))} commands took {seconds:.1f} s"
        )
        # what the TUI does before it starts: every table checked, every damage refused
        with pytest.raises(RecordingError):
            open_recording(path).check()
    # a recording of today keeps its small tables once more, and every command reads
    # that copy rather than their columns (BASE, of schema 1, has none)
    assert refusals or (family in schema.SMALL_TABLES and base is not BASE), (
        f"no command reads any damage of {family}"
    )


@pytest.mark.parametrize(
    ("name", "mutate", "message"),
    [
        (
            "schema_version 'abc'",
            lambda f: f.attrs.__setitem__("schema_version", "abc"),
            "attribute 'schema_version' should be an integer, not str 'abc'",
        ),
        (
            "options a JSON list",
            lambda f: f.attrs.__setitem__("options", "[1, 2]"),
            "attribute 'options' should be a JSON object, not list [1, 2]",
        ),
        (
            "modules 10^12 rows",
            lambda f: f["modules/name"].resize((hostile.HUGE,)),
            "modules/name claims 1,000,000,000,000 rows (256.0 TB), more than its",
        ),
        (
            "a soft link to itself",
            lambda f: (
                f.__delitem__("tensors/std"),
                f.__setitem__("tensors/std", h5py.SoftLink("/tensors/std")),
            ),
            "tensors/std is a soft link (to /tensors/std), which a recording never holds",
        ),
        (
            "an external link",
            lambda f: (
                f.__delitem__("calls"),
                f.__setitem__("calls", h5py.ExternalLink(str(OTHER), "/calls")),
            ),
            "table 'calls' is an external link (to ",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 30 else "",
)
def test_hostile_files_in_a_real_process(tmp_path, name, mutate, message):
    """The same refusals from the real command line, quickly (the 10^12-row table is
    refused before anything is allocated, not read into 312 TiB)."""
    path = hostile.make(BASE, tmp_path / "bad.h5", mutate)
    start = time.perf_counter()
    out = hookdbg("summary", path, timeout=60)
    assert time.perf_counter() - start < 20
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_damaged_values_never_give_a_traceback(tmp_path):
    """Well-formed files with meaningless values: a report either works around them
    (an unknown module id shows as <module 999>) or refuses with one line."""
    outcomes = {}
    for i, (name, mutate) in enumerate(hostile.value_variants()):
        path = hostile.make(BASE, tmp_path / f"v{i}.h5", mutate)
        for args in reader_commands(path, tmp_path):
            result = run(args)
            what = f"{name}: hookdbg {' '.join(args[:1] + args[2:])}"
            assert result.exception is None or isinstance(result.exception, SystemExit), (
                f"{what} raised {result.exception!r}"
            )
            assert result.exit_code in (0, 1, 2), what
            if result.exit_code == 2:
                assert_refused(name, args, result)
            outcomes.setdefault(name, set()).add(result.exit_code)
    refused = {name for name, codes in outcomes.items() if 2 in codes}
    assert {"modules parents loop", "captures/dtype object", "tensors/std chunk corrupt"} <= refused
    assert outcomes["tensors/module 999"] <= {0, 1}  # shown as <module 999>


def test_npy_into_a_missing_directory(tmp_path):
    target = tmp_path / "nowhere" / "x.npy"
    out = hookdbg("tensor", BASE, "standardize", "--step", "3", "--slot", "output", "--npy", target)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip() == f"Error: cannot write {target}: no directory {target.parent}"
    saved = tmp_path / "x"  # saved exactly where asked (np.save would add .npy)
    out = hookdbg("tensor", BASE, "standardize", "--step", "3", "--slot", "output", "--npy", saved)
    assert out.returncode == 0 and saved.exists() and f"to {saved}" in out.stderr


def test_huge_attributes_are_cut_and_the_summary_says_so(tmp_path):
    """A 50 MB argv, a 10 MB host and a 2 MB cwd stored at a fixed size: the reader
    keeps the first characters of each text, reads no fixed-size attribute that large,
    and says what it cut; summary answers with a page, not 60 MB."""
    path = tmp_path / "huge.h5"
    shutil.copy(BASE, path)
    with h5py.File(path, "r+") as f:
        argv = json.dumps(["train.py", "--tag", "x" * 50_000_000, "--last"])
        f.attrs["argv"] = argv
        f.attrs["host"] = "h" * 10_000_000
        f.attrs["cwd"] = np.bytes_(b"/" * 2_000_000)
    with open_recording(path) as rec:
        info = rec.info
        assert info.argv[:2] == ["train.py", "--tag"] and len(info.argv) == 3
        assert info.argv[2] == "x" * (4096 - len("train.py--tag")) + "…"
        assert info.host == "h" * 4096 + "…" and info.cwd == ""
        assert info.cut == {
            "argv": f"{len(argv):,} characters, shown to 4,096",
            "host": "10,000,000 characters, shown to 4,096",
            "cwd": "2.0 MB stored at a fixed size, not read",
        }
    out = hookdbg("summary", path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout) < 30_000
    cut = next(line for line in out.stdout.splitlines() if line.startswith("  cut "))
    assert cut.split(None, 1)[1] == "; ".join(f"attribute {n}: {w}" for n, w in info.cut.items())
    assert json.loads(hookdbg("summary", path, "--json").stdout)["cut_attributes"] == info.cut


# -- small files that expand ------------------------------------------------------------

LIMIT = 2 << 30  # the address space a file's commands get; a reader alone takes 180 MB
EXPANDING = dict(hostile.expanding_variants(schema.TABLES))


@pytest.mark.parametrize("name", EXPANDING)
def test_files_that_expand_stay_within_memory_and_time(name, tmp_path, nan_h5):
    """A few MB claiming gigabytes of rows, every reader command on it in a real
    process limited to 2 GiB: a table claiming more than a recording's rows compress to
    is refused in one line by a command that reads it; what is read (200,000 modules,
    millions of steps) is answered within the limit and a minute."""
    path = hostile.make(nan_h5, tmp_path / "big.h5", EXPANDING[name])
    assert path.stat().st_size < 4 << 20
    out = subprocess.run(
        [sys.executable, "-m", "tests.read.bounded", str(LIMIT), path, BASE, tmp_path],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    *reports, peak = map(json.loads, out.stdout.splitlines())
    for report in reports:
        args = report["args"]
        what = f"{name}: hookdbg {' '.join(args[:1] + args[2:])}"
        assert report["exception"] is None, f"{what} raised {report['exception']}"
        assert report["exit_code"] in (0, 1, 2), f"{what} exited {report['exit_code']}"
        if report["exit_code"] == 2:
            lines = report["stderr"].strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("Error: "), (what, lines)
        assert report["seconds"] < 60, f"{what} took {report['seconds']:.0f} s"
    if name.endswith("rows of zeros"):
        # a command that reads the table refuses it before reading; one that does not
        # answers (only `show --global` of a distributed run reads shards, and device
        # times exist where a GPU was timed)
        refused = [r for r in reports if r["exit_code"] == 2]
        assert all("refusing to read it" in r["stderr"] for r in refused), refused[0]
        assert refused or name.startswith(("shards", "device_times")), reports[0]
    else:
        assert reports[0]["exit_code"] == 0, reports[0]["stderr"]  # summary answers
    assert peak["peak_rss"] < LIMIT


# -- filters that load code --------------------------------------------------------------

_FAKE_PLUGIN = r"""
#include <stdio.h>
#include <stdlib.h>
/* runs as soon as the library is loaded: leaves a file where FAKE_PLUGIN_MARK says */
__attribute__((constructor)) static void loaded(void) {
    const char *mark = getenv("FAKE_PLUGIN_MARK");
    FILE *f = mark ? fopen(mark, "w") : NULL;
    if (f) fclose(f);
}
int H5PLget_plugin_type(void) { return -1; }
const void *H5PLget_plugin_info(void) { return NULL; }
"""


@pytest.fixture
def plugins(tmp_path):
    """HDF5_PLUGIN_PATH naming a directory with a library HDF5 would load as a plugin,
    which leaves a file (``mark``) if it is ever loaded."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a library for HDF5 to find")
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "fake.c").write_text(_FAKE_PLUGIN)
    subprocess.run(
        [cc, "-shared", "-fPIC", "-o", folder / "libfake.so", folder / "fake.c"], check=True
    )
    mark = tmp_path / "loaded"
    return {"HDF5_PLUGIN_PATH": str(folder), "FAKE_PLUGIN_MARK": str(mark)}, mark


def test_an_unknown_filter_loads_no_plugin(tmp_path, plugins):
    """A column compressed by a filter HDF5 lacks: h5py alone loads the library in
    HDF5_PLUGIN_PATH to read it; hookdbg refuses the file in one line, loading nothing."""
    env, mark = plugins
    path = hostile.make(BASE, tmp_path / "bad.h5", hostile.unknown_filter("tensors/std"))
    read = f"import h5py; h5py.File({str(path)!r}, 'r')['tensors/std'][:]"
    plain = subprocess.run(
        [sys.executable, "-c", read], env={**os.environ, **env}, capture_output=True, text=True
    )
    assert plain.returncode != 0 and mark.exists(), plain.stderr  # the library was loaded
    mark.unlink()
    out = hookdbg("summary", path, env=env)
    assert out.returncode == 2 and not mark.exists(), out.stderr
    assert out.stderr.strip().splitlines() == [
        f"Error: {path} is damaged: tensors/std uses HDF5 filters hookdbg never writes "
        "(40000); refusing to read it"
    ]


def test_once_a_recording_is_opened_hdf5_searches_no_plugin_directory(tmp_path, plugins):
    """Whatever else the process reads afterwards (here a column the reader never
    checked), HDF5 has no directory to load a plugin from."""
    env, mark = plugins
    path = hostile.make(BASE, tmp_path / "bad.h5", hostile.unknown_filter("tensors/std"))
    read = (
        "import h5py; from hookdbg.read import open_recording; "
        f"open_recording({str(BASE)!r}).close(); "
        f"h5py.File({str(path)!r}, 'r')['tensors/std'][:]"
    )
    out = subprocess.run(
        [sys.executable, "-c", read], env={**os.environ, **env}, capture_output=True, text=True
    )
    assert out.returncode != 0 and "can't find plugin" in out.stderr, out.stderr
    assert not mark.exists()
