"""What every command shares: the clean-error exception and small formatting helpers."""

from __future__ import annotations

import click

from hookdbg.text import human_bytes, plural, printable

__all__ = ["BadInput", "human_bytes", "plural"]


class BadInput(click.ClickException):
    """Bad input from the user: one line on stderr, exit status 2, no traceback. The
    line may quote a recording (a module name, a path), so it is shown printable."""

    exit_code = 2

    def format_message(self) -> str:
        return printable(self.message)
