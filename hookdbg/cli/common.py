"""What every command shares: the clean-error exception and small formatting helpers."""

from __future__ import annotations

import click

from hookdbg.read import Recording
from hookdbg.text import human_bytes, plural, printable

__all__ = ["BadInput", "human_bytes", "plural"]


def commands_answered(rec: Recording) -> str:
    """'3 commands' of steering the recording answered ('more than 4,100 commands'
    where a flood of them left more info rows than a report reads)."""
    count = plural(len(rec.answers), "command")
    return f"more than {count}" if rec.facts_cut else count


def steered(rec: Recording) -> str | None:
    """The summary's line on steering: how many commands, and the last answer."""
    if not rec.answers:
        return None
    return f"{commands_answered(rec)}, the last: {rec.answers[-1][2]}"


class BadInput(click.ClickException):
    """Bad input from the user: one line on stderr, exit status 2, no traceback. The
    line may quote a recording (a module name, a path), so it is shown printable."""

    exit_code = 2

    def format_message(self) -> str:
        return printable(self.message)
