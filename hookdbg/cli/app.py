"""The click group and the one list of its commands.

Each command lives in its own module as a plain ``click.Command`` and knows nothing of
the group; ``COMMANDS`` below is the only place that lists them, so no command module
imports this one back. None imports torch at import time, so reports start fast."""

from typing import Any

import click

from hookdbg.cli import (
    alerts,
    ctl,
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
from hookdbg.cli.common import BadInput
from hookdbg.read.checks import RecordingError
from hookdbg.version import __version__, per_call_path

COMMANDS: tuple[click.Command, ...] = (
    record.record,
    summary.summary,
    profile.profile_command,
    alerts.alerts,
    show.show,
    tensor.tensor,
    search.search,
    diff.diff_command,
    export.export,
    tui.tui,
    ctl.ctl,
)


class _Group(click.Group):
    """A recording found damaged after it was opened (a report reading a corrupt chunk)
    ends like one found damaged at open: one line, exit status 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RecordingError as exc:
            raise BadInput(str(exc)) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    __version__,
    prog_name="hookdbg",
    message=f"%(prog)s, version %(version)s; per-call path: {per_call_path()}",
)
def cli() -> None:
    """hookdbg: record, inspect and debug PyTorch training.

    Record a run with `hookdbg record train.py`, then look at it with `hookdbg
    summary`, `profile`, `alerts`, `show`, `search`, `diff`, `export` or `tui`;
    steer a run while it trains with `hookdbg ctl`.
    """


for _command in COMMANDS:
    cli.add_command(_command)


def main(args: list[str] | None = None) -> None:
    """The ``hookdbg`` entry point (click already exits quietly when a pipe closes)."""
    cli.main(args=args, prog_name="hookdbg")
