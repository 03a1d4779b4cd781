"""What every command shares: the clean-error exception and small formatting helpers."""

from __future__ import annotations

import click

from hookdbg.text import human_bytes, plural

__all__ = ["BadInput", "human_bytes", "plural"]


class BadInput(click.ClickException):
    """Bad input from the user: one line on stderr, exit status 2, no traceback."""

    exit_code = 2
