"""``hookdbg export``: a Perfetto trace, CSV/JSON tables for pandas, or TensorBoard logs."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click

from hookdbg.analysis.export import TABLES, perfetto, table_rows, write_csv, write_json
from hookdbg.analysis.scalars import DEFAULT_STATS, StatSelection
from hookdbg.cli.common import BadInput, human_bytes, plural
from hookdbg.cli.inputs import check_steps, open_or_fail, rank_option, require_calls, step_options
from hookdbg.cli.report import Report, emit, json_option
from hookdbg.cli.terminal import Output, note
from hookdbg.options import ModuleFilter, OptionError
from hookdbg.read import Recording
from hookdbg.text import printable

_SUFFIXES = {"perfetto": ".trace.json", "tensorboard": ".tensorboard"}


@click.command(
    epilog="""\b
Examples:
  hookdbg export run.h5 --format perfetto -o run.trace.json   # open in ui.perfetto.dev
  hookdbg export run.h5 --format csv -o tensors.csv           # pandas.read_csv
  hookdbg export run.h5 --format json --table calls -o -      # to stdout
  hookdbg export run.h5 --format tensorboard -o runs/hookdbg  # tensorboard --logdir runs
  hookdbg export run.h5 --format tensorboard --modules 'layer1.*' --stat 'grad_output/*'"""
)
@click.argument("recording")
@rank_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["perfetto", "csv", "json", "tensorboard"]),
    required=True,
    help="perfetto: Chrome trace JSON of module timings; csv/json: a table; tensorboard: "
    "event files of per-module statistics and times (runs train and eval).",
)
@click.option(
    "-o",
    "--output",
    metavar="PATH",
    help="Where to write ('-' for stdout; CSV shown on a terminal has control "
    "characters escaped); for tensorboard a log directory [default: RECORDING with "
    "a new suffix].",
)
@click.option(
    "--table",
    "table_name",
    type=click.Choice(TABLES),
    default="tensors",
    show_default=True,
    help="Which table csv/json export.",
)
@click.option(
    "--modules",
    "module_globs",
    multiple=True,
    metavar="GLOB",
    help="tensorboard: modules to export (repeatable; !GLOB excludes) [default: all].",
)
@click.option(
    "--stat",
    "stat_globs",
    multiple=True,
    metavar="SLOT/STAT",
    help="tensorboard: statistics to export, as globs: output/std, 'param_grad*/norm', "
    "'*/max', fwd_ms, bwd_ms, fwd_device_ms, bwd_device_ms (repeatable) [default: "
    + ", ".join(DEFAULT_STATS)
    + "].",
)
@step_options
@click.option("-f", "--force", is_flag=True, help="Overwrite what an earlier export wrote.")
@json_option
def export(
    recording: str,
    rank: int | None,
    fmt: str,
    output: str | None,
    table_name: str,
    module_globs: tuple[str, ...],
    stat_globs: tuple[str, ...],
    steps: tuple[int | None, int | None],
    force: bool,
    as_json: bool,
) -> None:
    """Write RECORDING in a format other tools read. With --json, a summary of what
    was written goes to stdout."""
    if fmt != "tensorboard" and (module_globs or stat_globs):
        raise BadInput("--modules and --stat select what --format tensorboard writes")
    rec = open_or_fail(recording, rank=rank, quiet=as_json)
    first, last = steps
    if fmt in ("perfetto", "tensorboard") or table_name in ("tensors", "calls"):
        require_calls(rec)
        if steps != (None, None):
            first, last = check_steps(rec, steps)
    suffix = _SUFFIXES.get(fmt, f".{table_name}.{fmt}")
    target = output or str(Path(recording).with_suffix("")) + suffix
    if target == "-" and (as_json or fmt == "tensorboard"):
        raise BadInput(
            "--format tensorboard writes a directory: give it with -o DIR"
            if fmt == "tensorboard"
            else "--json prints a summary on stdout: write the export to a file with -o FILE"
        )
    _check_target(Path(target), Path(recording), fmt, force)
    if fmt == "tensorboard":
        written = _tensorboard(rec, Path(target), module_globs, stat_globs, first, last)
    else:
        written = _to_file(rec, fmt, target, table_name, first, last)
    emit(written, as_json=as_json)


@dataclass
class Written(Report):
    """What an export wrote where: for ``--json`` on stdout, for people a line on
    stderr (stdout may hold the export itself)."""

    recording: Recording
    format: str
    target: str
    facts: dict[str, object]  # the JSON fields of this format: path, bytes, rows...
    said: str

    def to_json(self) -> dict[str, object]:
        return {"recording": str(self.recording.path), "format": self.format, **self.facts}

    def render(self, out: Output) -> None:
        if self.target != "-":
            note(self.said)


def _check_target(path: Path, recording: Path, fmt: str, force: bool) -> None:
    if str(path) == "-":
        return
    if path.exists() and path.resolve() == recording.resolve():
        raise BadInput(f"refusing to write the export over the recording itself ({path})")
    if fmt == "tensorboard":
        from hookdbg.analysis.tensorboard import existing_event_files

        if path.exists() and not path.is_dir():
            raise BadInput(f"{path} is a file; --format tensorboard writes a directory")
        old = existing_event_files(path)
        if old and not force:
            raise BadInput(
                f"{path} already holds event files of an export ({old[0].parent.name}/); "
                "pass --force to replace them"
            )
        parent = path if path.exists() else path.parent
        if not parent.is_dir() and not _makeable(path):
            raise BadInput(f"cannot write {path}: no directory {path.parent}")
        return
    if path.exists() and not force and not _stream(path):
        raise BadInput(f"{path} already exists; pass --force to overwrite it")
    if not path.parent.is_dir():
        raise BadInput(f"cannot write {path}: no directory {path.parent}")


def _stream(path: Path) -> bool:
    """Whether ``path`` is a terminal, a pipe or another device (``/dev/stdout``,
    ``/dev/tty``): written to, not overwritten, so no --force is needed."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _makeable(path: Path) -> bool:
    """Whether ``path`` can be created with its missing parents (runs/hookdbg under an
    existing folder)."""
    for parent in path.parents:
        if parent.exists():
            return parent.is_dir()
    return False


def _to_file(
    rec: Recording, fmt: str, target: str, table: str, first: int | None, last: int | None
) -> Written:
    try:
        stream = sys.stdout if target == "-" else open(target, "w", encoding="utf-8", newline="")  # noqa: SIM115
    except OSError as exc:
        raise BadInput(f"cannot write {target}: {exc.strerror or exc}") from None
    try:
        if fmt == "perfetto":
            count = perfetto(rec, stream, first, last)
            what = plural(count, "trace event")
        else:
            rows = table_rows(rec, table, first, last)
            if fmt == "csv" and stream.isatty():  # -o -, or a path that is a terminal
                rows = _printable_rows(rows)
            count = (write_csv if fmt == "csv" else write_json)(rows, stream)
            what = plural(count, f"{table} row")
    except BrokenPipeError:
        raise  # a closed pipe (| head) is not an error of ours; click exits quietly
    except OSError as exc:
        raise BadInput(f"cannot write {target}: {exc.strerror or exc}") from None
    finally:
        if stream is not sys.stdout:
            stream.close()
    size = os.path.getsize(target) if target != "-" and not _stream(Path(target)) else None
    facts: dict[str, object] = {"path": target, "bytes": size}
    if fmt == "perfetto":
        facts["events"] = count
    else:
        facts |= {"table": table, "rows": count}
    said = f"wrote {what} to {target}" + (f" ({human_bytes(size)})" if size is not None else "")
    return Written(rec, fmt, target, facts, said)


def _tensorboard(
    rec: Recording,
    logdir: Path,
    module_globs: tuple[str, ...],
    stat_globs: tuple[str, ...],
    first: int | None,
    last: int | None,
) -> Written:
    from hookdbg.analysis.tensorboard import (
        TensorBoardMissing,
        existing_event_files,
        write_tensorboard,
    )

    try:
        stats = StatSelection(stat_globs) if stat_globs else StatSelection()
        ModuleFilter.parse(module_globs)
    except (ValueError, OptionError) as exc:
        raise BadInput(str(exc)) from None
    for old in existing_event_files(logdir):  # checked above: --force was given
        old.unlink()
    try:
        written = write_tensorboard(rec, logdir, module_globs, stats, first, last)
    except TensorBoardMissing as exc:
        raise BadInput(str(exc)) from None
    except OSError as exc:
        raise BadInput(f"cannot write {logdir}: {exc.strerror or exc}") from None
    if not any(r.scalars or r.histograms for r in written.runs.values()):
        shown = ", ".join(module_globs) or "any module"
        note(f"note: no statistic matched {shown} and --stat {', '.join(stats.globs)}")
    runs = ", ".join(f"{name} {plural(r.events, 'event')}" for name, r in written.runs.items())
    facts = {
        "path": str(logdir),
        "events": written.events,
        "runs": {
            name: {
                "path": str(r.path),
                "scalars": r.scalars,
                "texts": r.texts,
                "histograms": r.histograms,
                "tags": len(r.tags),
            }
            for name, r in written.runs.items()
        },
    }
    said = f"wrote {runs} to {logdir} (tensorboard --logdir {logdir})"
    return Written(rec, "tensorboard", str(logdir), facts, said)


def _printable_rows(rows: Iterator[dict[str, object]]) -> Iterator[dict[str, object]]:
    """CSV shown on a terminal: strings from the recording with control characters
    escaped. Into a file or a pipe the CSV stays exact (JSON escapes them itself)."""
    for row in rows:
        yield {k: printable(v) if isinstance(v, str) else v for k, v in row.items()}
