"""The click group. Each command lives in its own module and registers itself here;
none imports torch at import time, so reports start fast."""

from typing import Any

import click

from hookdbg import __version__
from hookdbg.cli.common import BadInput
from hookdbg.read.checks import RecordingError


class _Group(click.Group):
    """A recording found damaged after it was opened (a report reading a corrupt chunk)
    ends like one found damaged at open: one line, exit status 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RecordingError as exc:
            raise BadInput(str(exc)) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hookdbg")
def cli() -> None:
    """hookdbg: record, inspect and debug PyTorch training.

    Record a run with `hookdbg record train.py`, then look at it with `hookdbg
    summary`, `profile`, `alerts`, `show`, `search`, `diff`, `export` or `tui`.
    """


def _register() -> None:
    from hookdbg.cli import (  # noqa: F401
        alerts,
        diff,
        export,
        profile,
        record,
        search,
        show,
        summary,
        tensor,
        tui,
    )


_register()


def main(args: list[str] | None = None) -> None:
    """The ``hookdbg`` entry point (click already exits quietly when a pipe closes)."""
    cli.main(args=args, prog_name="hookdbg")
