"""``hookdbg tui``: replay, search and diff recordings in the terminal."""

from __future__ import annotations

import sys

import click

from hookdbg.cli.app import cli
from hookdbg.cli.common import BadInput
from hookdbg.cli.output import open_or_fail, open_run_or_fail
from hookdbg.read import RankSet


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
    jump to where they first diverge. A distributed run (run.h5 for run.rankN.h5) opens
    every rank: r switches between them."""
    if not sys.stdout.isatty() or not sys.stdin.isatty():
        raise BadInput(
            "hookdbg tui needs a terminal; for scripts use summary, alerts, "
            "search or diff (with --json)"
        )
    run = open_run_or_fail(recording, quiet=True)
    second = open_or_fail(other, quiet=True) if other else None
    from hookdbg.tui.app import HookdbgApp  # Textual loads only for this command

    if isinstance(run, RankSet):
        first, more = run[run.ranks[0]], [run[r] for r in run.ranks[1:]]
    else:
        first, more = run, []
    HookdbgApp(first, second, follow=follow, more_ranks=more).run()
