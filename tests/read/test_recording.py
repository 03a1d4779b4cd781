"""open_recording validates before it trusts, never writes, and follows live files."""

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from torch import nn

from hookdbg.read import RecordingError, Status, open_recording
from hookdbg.store import schema, summary
from tests.helpers import hookdbg, live_recording, with_older_summaries


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_opens_a_complete_recording_lazily(mlp_h5):
    before = digest(mlp_h5)
    with open_recording(mlp_h5) as rec:
        assert rec.status is Status.COMPLETE and rec.dropped_rows == 0
        assert rec.info.argv[0].endswith("numnet_mlp.py") and rec.info.options["level"] == "stats"
        assert list(rec.recorded_steps) == [0, 1, 2, 3]
        assert rec.modules.resolve("body.1").name == "model.body.1"
        assert rec.modules.resolve("model.head").type == "Linear"
        step2 = rec.tensors(2, 2, ["step", "module", "std"])
        assert set(step2["step"]) == {2} and step2.dtype.names == ("step", "module", "std")
        all_rows = rec.tensors()
        assert len(all_rows) == len(rec.tensors_table)
        assert np.array_equal(all_rows[all_rows["step"] == 2]["std"], step2["std"], equal_nan=True)
    assert digest(mlp_h5) == before  # reading never writes


def test_step_rows_by_binary_search_match_a_full_scan(resnet_h5):
    with open_recording(resnet_h5) as rec:
        table = rec.tensors_table
        steps = table.column("step")
        for step in (0, 1):
            rows = table.step_rows(step, step)
            assert np.all(steps[rows] == step) and rows.stop - rows.start == np.sum(steps == step)


def test_unknown_module_names_get_suggestions(mlp_h5):
    with (
        open_recording(mlp_h5) as rec,
        pytest.raises(LookupError, match=r"did you mean model\.head"),
    ):
        rec.modules.resolve("head2")
    with open_recording(mlp_h5) as rec, pytest.raises(LookupError, match="matches 5 modules"):
        rec.modules.resolve("body.*")


def corrupt_files(source, tmp_path):
    data = source.read_bytes()
    for fraction in (0.001, 0.25, 0.5, 0.9, 0.99):
        cut = tmp_path / f"truncated-{fraction}.h5"
        cut.write_bytes(data[: int(len(data) * fraction)])
        yield cut, "damaged|not a hookdbg recording"
    noise = tmp_path / "random.h5"
    noise.write_bytes(np.random.default_rng(0).bytes(50_000))
    yield noise, "not a hookdbg recording \\(not an HDF5 file\\)"
    empty = tmp_path / "empty.h5"
    empty.write_bytes(b"")
    yield empty, "is empty \\(0 bytes\\): nothing was ever written to it"
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["weights"] = np.arange(10)
    yield foreign, "an HDF5 file but not a hookdbg recording"
    newer = tmp_path / "newer.h5"
    shutil.copy(source, newer)
    with h5py.File(newer, "r+") as f:
        f.attrs["schema_version"] = 99
    yield newer, "newer hookdbg \\(schema version 99"
    holed = tmp_path / "holed.h5"
    shutil.copy(source, holed)
    with h5py.File(holed, "r+") as f:
        del f["tensors/std"]
    yield holed, "damaged: table 'tensors' has no column 'std'"
    yield tmp_path, "is a directory"
    yield tmp_path / "missing.h5", "no such file"


def test_broken_files_give_one_clean_line(mlp_h5, tmp_path):
    for path, message in corrupt_files(mlp_h5, tmp_path):
        before = digest(path) if path.is_file() else None
        with pytest.raises(RecordingError, match=message):
            open_recording(path).check()  # a column is checked when its table is first read
        out = hookdbg("summary", path)
        assert out.returncode == 2, (path, out.stderr)
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
        if before is not None:
            assert digest(path) == before, f"{path} was modified"


def test_live_recording_refreshes_then_reads_as_cut_short_after_kill_9(tmp_path):
    path = tmp_path / "live.h5"
    with live_recording(path):
        rec = open_recording(path)
        assert rec.status is Status.LIVE
        seen = len(rec.calls_table)
        time.sleep(0.5)
        assert rec.refresh() and len(rec.calls_table) > seen
        assert len(rec.steps) > 0 and len(rec.tensors()) >= len(rec.calls_table)
    rec.refresh()
    assert rec.status is Status.CUT_SHORT and rec.end is None
    rec.close()
    out = hookdbg("summary", path)
    assert out.returncode == 0 and "was cut short" in out.stderr
    assert os.path.getsize(path) > 0


def _as_version_6(new: Path, old: Path) -> None:
    """A copy of a new recording as a version 6 recorder wrote it: modules without
    ``file`` and ``line``, no copy of the small tables."""
    shutil.copy(new, old)
    with h5py.File(old, "r+") as f:
        f.attrs["schema_version"] = 6
        del f["modules/file"], f["modules/line"], f[schema.SMALL]
        f["modules"].attrs[schema.TAIL_COLUMNS] = list(schema.MODULES.names or ())[:-2]


def _as_version_4(new: Path, old: Path) -> None:
    """A copy of a new recording as a version 4 recorder wrote it: no device_times, no
    tails, one committed length per table (a closed file's tails are empty: every row
    is sealed)."""
    _as_version_6(new, old)
    with h5py.File(old, "r+") as f:
        f.attrs["schema_version"] = 4
        committed = f[schema.COMMITTED][()]
        assert not committed[schema.TAIL_BYTES].any()
        assert list(schema.TABLES)[-1] == "device_times"
        del f[schema.COMMITTED], f["device_times"]
        for name in summary.missing_since(4):  # summary fields added since
            del f[f"tensors/{name}"]
        f[schema.COMMITTED] = committed[schema.SEALED][:-1]
        for table in list(schema.TABLES)[:-1]:
            del f[table].attrs[schema.TAIL_COLUMNS]
            for slot in schema.TAIL_SLOTS:
                del f[table][slot]


def _as_version_3(new: Path, old: Path) -> None:
    """A copy of a new recording as a version 3 recorder wrote it: no losses table, no
    steps.overhead, a committed length for each of the eight tables it had."""
    _as_version_4(new, old)
    with h5py.File(old, "r+") as f:
        f.attrs["schema_version"] = 3
        del f["losses"], f["steps/overhead"]
        committed = f[schema.COMMITTED][:8]
        del f[schema.COMMITTED]
        f[schema.COMMITTED] = committed


def test_modules_say_where_their_forward_is_and_show_prints_it(mlp_h5):
    rec = open_recording(mlp_h5)
    forward = nn.Linear.forward.__code__
    where = (os.path.abspath(forward.co_filename), forward.co_firstlineno)
    assert rec.modules.sources and rec.modules.resolve("head").source == where
    out = hookdbg("show", mlp_h5, "head", "--step", "1")
    assert out.returncode == 0 and f"source: {where[0]}:{where[1]}" in out.stdout


def test_a_version_6_recording_reads_with_no_module_sources(mlp_h5, tmp_path):
    """Before schema version 7 modules had no ``file`` and ``line``: their code is not
    known, and everything else reads as before."""
    old = tmp_path / "v6.h5"
    _as_version_6(mlp_h5, old)
    rec, new = open_recording(old), open_recording(mlp_h5)
    assert rec.info.schema_version == 6 and not rec.modules.sources
    assert [m.name for m in rec.modules] == [m.name for m in new.modules]
    assert all(m.source is None for m in rec.modules)
    assert (rec.module_rows["file"] == b"").all() and (rec.module_rows["line"] == 0).all()
    out = hookdbg("show", old, "head", "--step", "1")
    assert out.returncode == 0 and "source:" not in out.stdout, out.stderr


# A version 6 recorder, killed while its rows were in the tables' tails: the module rows
# it wrote had no file and line (this version's writer, given that version's row)
V6_KILLED = """
import os, signal, sys, time
import numpy as np
from hookdbg.options import RecordOptions
from hookdbg.recorder.steps.meta import run_metadata
from hookdbg.store import rows, schema
from hookdbg.store.writer import Writer

v6 = np.dtype([(n, schema.MODULES[n]) for n in schema.MODULES.names[:-2]])
schema.TABLES["modules"] = (v6, schema.TABLES["modules"][1])
rows.CONVERTERS["modules"] = rows._texts_encoded(v6)
meta = run_metadata(["train.py"], RecordOptions())
meta["schema_version"] = 6
writer = Writer(sys.argv[1], meta, flush_interval=0.05)
net, fc = (0, "model", "Net", -1, 0, 0, 0, 0), (1, "model.fc", "Linear", 0, 0, 1, 0, 6)
writer.submit({"modules": [net, fc]})
time.sleep(1.0)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_cut_short_version_6_recording_reads_its_module_rows_from_the_tail(tmp_path):
    """A tail holds the columns its version had: the modules' rows of a version 6 file
    cut short, all in their tail, read without the columns added since."""
    path = tmp_path / "v6-killed.h5"
    subprocess.run([sys.executable, "-c", V6_KILLED, str(path)], timeout=120)
    with h5py.File(path, "r", swmr=True) as f:
        state = f[schema.COMMITTED][()][:, list(schema.TABLES).index("modules")]
    assert state[schema.SEALED] == 0 and state[schema.TAIL_BYTES] > 0
    rec = open_recording(path)
    assert rec.status is Status.CUT_SHORT and rec.info.schema_version == 6
    assert [(m.name, m.type, m.params, m.source) for m in rec.modules] == [
        ("model", "Net", 0, None),
        ("model.fc", "Linear", 6, None),
    ]


def test_a_version_4_recording_reads_all_its_rows_from_the_columns(mlp_h5, tmp_path):
    old = tmp_path / "v4.h5"
    _as_version_4(mlp_h5, old)
    rec, new = open_recording(old), open_recording(mlp_h5)
    assert rec.info.schema_version == 4
    assert np.array_equal(rec.calls_table.read(), new.calls_table.read())
    kept = [n for n in schema.TENSORS.names or () if n not in summary.missing_since(4)]
    assert rec.tensors_table.read(kept).tobytes() == new.tensors_table.read(kept).tobytes()
    assert np.isnan(rec.tensors_table.read(["sat_frac"])["sat_frac"]).all()
    assert rec.losses.tobytes() == new.losses.tobytes() and len(rec.steps) == len(new.steps)


def test_a_version_2_recording_reads_with_no_gradscaler_columns(mlp_h5, tmp_path):
    """Before schema version 3 the steps table had no ``scale`` and ``skipped``: such a
    file (made here from a new one, as a version 2 recorder wrote it) reads as 'no
    GradScaler'."""
    old = tmp_path / "v2.h5"
    _as_version_3(mlp_h5, old)
    with h5py.File(old, "r+") as f:
        f.attrs["schema_version"] = 2
        del f["steps/scale"], f["steps/skipped"]
    rec = open_recording(old)
    assert rec.info.schema_version == 2 and len(rec.steps) > 0
    assert np.isnan(rec.steps["scale"]).all() and (rec.steps["skipped"] == 0).all()
    assert open_recording(mlp_h5).steps["skipped"].dtype == np.int32


def test_a_version_3_recording_reads_with_no_losses(mlp_h5, tmp_path):
    """Before schema version 4 there were no losses and no overhead per step: such a file
    reads with none, and its reports say nothing of them."""
    old = tmp_path / "v3.h5"
    _as_version_3(mlp_h5, old)
    rec = open_recording(old)
    assert rec.info.schema_version == 3 and len(rec.steps) == len(open_recording(mlp_h5).steps)
    assert len(rec.losses) == 0 and rec.losses.dtype == schema.LOSSES
    assert np.isnan(rec.steps["overhead"]).all()
    assert len(open_recording(mlp_h5).losses) == 4  # one backward pass per step
    out = hookdbg("summary", old)
    assert out.returncode == 0 and "loss " not in out.stdout, out.stdout


def test_a_version_6_recording_reads_with_no_saturation_fraction(mlp_h5, tmp_path):
    """Before schema version 7 a tensor summary had no ``sat_frac`` (a field of
    hookdbg/store/summary.py added since): such a file reads it as not measured, shown
    as ``-`` and matching no search, where a new one has it."""
    old = with_older_summaries(mlp_h5, tmp_path / "v6.h5", 6)
    rec, new = open_recording(old), open_recording(mlp_h5)
    assert rec.info.schema_version == 6 and len(rec.tensors_table) == len(new.tensors_table)
    assert np.isnan(rec.tensors_table.read(["sat_frac"])["sat_frac"]).all()
    assert (new.tensors_table.read(["sat_frac"])["sat_frac"] > 0.5).any()
    assert "0 tensor summaries match" in hookdbg("search", old, "sat_frac>0.5").stdout
    assert "0 tensor summaries match" not in hookdbg("search", mlp_h5, "sat_frac>0.5").stdout
    shown = hookdbg("show", old, "model.body.2", "--step", "1").stdout.splitlines()
    header = next(line for line in shown if "zeros" in line).split()
    output = next(line for line in shown if " output " in line).split()
    sat, zeros = (header.index(name) - len(header) for name in ("sat", "zeros"))  # from the right
    assert output[sat] == "-" and output[zeros].endswith("%")


def test_a_file_its_writer_still_holds_locked_is_said_being_created(tmp_path):
    """Before SWMR starts, HDF5 holds the file's lock: a reader is told to wait, not
    that the file is damaged."""
    path = tmp_path / "new.h5"
    code = (
        f"import h5py, time\nf = h5py.File({str(path)!r}, 'w')\n"
        "print('open', flush=True)\ntime.sleep(20)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(RecordingError, match="is being created by its recorder"):
            open_recording(path)
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_someone_else_holds_on_a_recording_keeps_no_reader_out(mlp_h5, tmp_path):
    """Anyone who may read a file may lock it: a reader does not wait for HDF5's lock."""
    path = tmp_path / "locked.h5"
    shutil.copy(mlp_h5, path)
    code = (
        f"import fcntl, os, time\nfd = os.open({str(path)!r}, os.O_RDONLY)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(20)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        held = open_recording(path)  # opened without HDF5's locks
        assert held.status is Status.COMPLETE
        shown = hookdbg("summary", path)
        assert shown.returncode == 0, shown.stderr
    finally:
        holder.kill()
        holder.wait()
    # The lock is gone; the file this process holds open opens again all the same.
    assert open_recording(path).status is Status.COMPLETE
    assert held.status is Status.COMPLETE


def test_a_version_7_recording_reads_with_no_mean_magnitude(mlp_h5, tmp_path):
    """``absmean`` (schema version 8): the mean of |x| over the finite values, searched
    (``absmean<1e-6`` finds vanishing activations) and shown; a version 7 file reads it
    as not measured."""
    old = with_older_summaries(mlp_h5, tmp_path / "v7.h5", 7)
    rec, new = open_recording(old), open_recording(mlp_h5)
    assert rec.info.schema_version == 7 and new.info.schema_version == schema.SCHEMA_VERSION
    assert np.isnan(rec.tensors_table.read(["absmean"])["absmean"]).all()
    table = new.tensors_table.read(["absmean", "mean", "min"])
    positive = table["min"] >= 0  # where every value is >= 0, |x| is x
    assert positive.any()
    same = np.allclose(table["absmean"][positive], table["mean"][positive], equal_nan=True)
    assert same and not np.isnan(table["absmean"][positive]).all()
    assert "0 tensor summaries match" in hookdbg("search", old, "absmean>0").stdout
    assert "0 tensor summaries match" not in hookdbg("search", mlp_h5, "absmean>0").stdout
    assert "0 tensor summaries match" in hookdbg("search", mlp_h5, "absmean<1e-30").stdout
    shown = hookdbg("show", mlp_h5, "model.body.2", "--step", "1").stdout.splitlines()
    header = next(line for line in shown if "zeros" in line).split()
    output = next(line for line in shown if " output " in line).split()
    assert "absmean" in header
    at = header.index("absmean") - len(header)  # columns counted from the right
    assert float(output[at]) == pytest.approx(float(output[header.index("mean") - len(header)]))
