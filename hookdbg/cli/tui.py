"""``hookdbg tui``: replay, search and diff recordings in the terminal."""

from __future__ import annotations

import sys

import click

from hookdbg.cli.app import cli
from hookdbg.cli.common import BadInput
from hookdbg.cli.output import open_or_fail


@cli.command(
    epilog="""\b
Keys: ←/→ steps, ↑/↓ modules, s plot, p profile, a alerts, / search,
f first divergence or alert, F follow, ? help, q quit."""
)
@click.argument("recording")
@click.argument("other", required=False)
@click.option(
    "--follow", is_flag=True, help="Show new steps as a running recorder writes them, like tail -f."
)
def tui(recording: str, other: str | None, follow: bool) -> None:
    """Step through RECORDING module by module: tensor summaries, timings, plots over
    steps, profile, alerts and search. With OTHER, compare the two side by side and
    jump to where they first diverge."""
    if not sys.stdout.isatty() or not sys.stdin.isatty():
        raise BadInput(
            "hookdbg tui needs a terminal; for scripts use summary, alerts, "
            "search or diff (with --json)"
        )
    first = open_or_fail(recording, quiet=True)
    second = open_or_fail(other, quiet=True) if other else None
    from hookdbg.tui.app import HookdbgApp  # Textual loads only for this command

    HookdbgApp(first, second, follow=follow).run()
