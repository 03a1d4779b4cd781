"""``hookdbg export``: a Perfetto trace, or CSV/JSON tables for pandas."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from hookdbg.analysis.export import TABLES, perfetto, table_rows, write_csv, write_json
from hookdbg.cli.app import cli
from hookdbg.cli.common import BadInput, human_bytes, plural
from hookdbg.cli.output import (
    check_steps,
    note,
    open_or_fail,
    rank_option,
    require_calls,
    step_options,
)
from hookdbg.text import printable


@cli.command(
    epilog="""\b
Examples:
  hookdbg export run.h5 --format perfetto -o run.trace.json   # open in ui.perfetto.dev
  hookdbg export run.h5 --format csv -o tensors.csv           # pandas.read_csv
  hookdbg export run.h5 --format json --table calls -o -      # to stdout"""
)
@click.argument("recording")
@rank_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["perfetto", "csv", "json"]),
    required=True,
    help="perfetto: Chrome trace JSON of module timings; csv/json: a table.",
)
@click.option(
    "-o",
    "--output",
    metavar="FILE",
    help="Where to write ('-' for stdout; CSV shown on a terminal has control "
    "characters escaped) [default: RECORDING with a new suffix].",
)
@click.option(
    "--table",
    "table_name",
    type=click.Choice(TABLES),
    default="tensors",
    show_default=True,
    help="Which table csv/json export.",
)
@step_options
@click.option("-f", "--force", is_flag=True, help="Overwrite FILE if it exists.")
def export(
    recording: str,
    rank: int | None,
    fmt: str,
    output: str | None,
    table_name: str,
    steps: tuple[int | None, int | None],
    force: bool,
) -> None:
    """Write RECORDING in a format other tools read."""
    rec = open_or_fail(recording, rank=rank)
    first, last = steps
    if fmt == "perfetto" or table_name in ("tensors", "calls"):
        require_calls(rec)
        if steps != (None, None):
            first, last = check_steps(rec, steps)
    suffix = ".trace.json" if fmt == "perfetto" else f".{table_name}.{fmt}"
    target = output or str(Path(recording).with_suffix("")) + suffix
    if target != "-":
        path = Path(target)
        if path.exists() and path.resolve() == Path(recording).resolve():
            raise BadInput(f"refusing to write the export over the recording itself ({target})")
        if path.exists() and not force:
            raise BadInput(f"{target} already exists; pass --force to overwrite it")
        if not path.parent.is_dir():
            raise BadInput(f"cannot write {target}: no directory {path.parent}")
    stream = sys.stdout if target == "-" else open(target, "w", encoding="utf-8", newline="")  # noqa: SIM115
    try:
        if fmt == "perfetto":
            count = perfetto(rec, stream, first, last)
            what = plural(count, "trace event")
        else:
            rows = table_rows(rec, table_name, first, last)
            if fmt == "csv" and stream is sys.stdout and sys.stdout.isatty():
                rows = _printable_rows(rows)
            count = (write_csv if fmt == "csv" else write_json)(rows, stream)
            what = plural(count, f"{table_name} row")
    except BrokenPipeError:
        raise  # a closed pipe (| head) is not an error of ours; click exits quietly
    except OSError as exc:
        raise BadInput(f"cannot write {target}: {exc.strerror or exc}") from None
    finally:
        if stream is not sys.stdout:
            stream.close()
    if target != "-":
        note(f"wrote {what} to {target} ({human_bytes(os.path.getsize(target))})")


def _printable_rows(rows: Iterator[dict[str, object]]) -> Iterator[dict[str, object]]:
    """CSV shown on a terminal: strings from the recording with control characters
    escaped. Into a file or a pipe the CSV stays exact (JSON escapes them itself)."""
    for row in rows:
        yield {k: printable(v) if isinstance(v, str) else v for k, v in row.items()}
