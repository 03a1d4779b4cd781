"""What every command shares: the clean-error exception and small formatting helpers."""

from __future__ import annotations

import click


class BadInput(click.ClickException):
    """Bad input from the user: one line on stderr, exit status 2, no traceback."""

    exit_code = 2


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 step', '3 steps', '2 matches' (with ``many`` for irregular plurals)."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"
