"""``hookdbg tui``: replay, search and diff recordings in the terminal."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hookdbg.cli.common import BadInput
from hookdbg.cli.inputs import open_or_fail, open_run_or_fail
from hookdbg.read import RankSet, rank_files

if TYPE_CHECKING:
    from textual.app import App


@click.command(
    epilog="""\b
Keys: ←/→ steps ([ ] ten, { } a hundred), g go to step, ↑/↓ or j/k modules,
h/l fold, tab tree/table, s/S plot, L loss, m statistics, t time tree,
o open the module's code, p profile, a alerts, / search, f first divergence
or NaN/inf origin, e eval batches, F follow, y copy, ? help, q quit."""
)
@click.argument("recording")
@click.argument("other", required=False)
@click.option(
    "--follow",
    is_flag=True,
    help="Show new steps as a running recorder writes them, like tail -f; waits for a "
    "recording that does not exist yet.",
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
    second = open_or_fail(other, quiet=True) if other else None
    if second is not None:
        second.check()  # every table the views read (the group says a damaged one in a line)
    if follow and not Path(recording).exists() and not rank_files(recording):
        from hookdbg.tui.app import HookdbgApp  # Textual loads only for this command

        run_app(HookdbgApp(None, second, follow=True, wait_for=Path(recording)))
        return
    run = open_run_or_fail(recording, quiet=True)
    from hookdbg.tui.app import HookdbgApp

    if isinstance(run, RankSet):
        first, more = run[run.ranks[0]], [run[r] for r in run.ranks[1:]]
    else:
        first, more = run, []
    first.check()  # the other ranks as they are first shown
    run_app(HookdbgApp(first, second, follow=follow, more_ranks=more))


def run_app(app: App[None]) -> None:
    """Run the app; an app that ended on an error (Textual has printed it) exits with
    its status, so that a shell or a script sees the crash."""
    app.run()
    if app.return_code:
        click.get_current_context().exit(app.return_code)
