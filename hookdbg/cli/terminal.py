"""What reaches the terminal: rich markup without colour when piped, a recording's
strings shown as text, and status lines on stderr.

Everything printed for people goes through ``Output``, ``literal`` or ``note`` (and the
tables of ``hookdbg.cli.tables``), which show a recording's strings (module names, paths,
messages, the command line) as text: control characters escaped (``\\x1b``), rich markup
(``[bold]``) and emoji codes (``:smile:``) left as they are.
"""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from hookdbg.text import printable, printable_lines


def note(message: str) -> None:
    """A status line for people, on stderr (it may name files from a recording)."""
    click.echo(f"hookdbg: {printable(message)}", err=True)


def literal(value: object) -> str:
    """``value`` as plain text inside rich markup: ``[bold]`` in a module name prints as
    ``[bold]``, and control characters print escaped. Use it (not rich's ``escape``)
    for anything a recording or a user supplied."""
    return escape(printable(str(value)))


class Output:
    """Prints rich markup and tables to stdout, without the trailing spaces rich pads
    lines with (they clutter files and CI logs), and without colour when piped. A
    control character in markup is escaped here too, whatever the caller forgot."""

    def __init__(self) -> None:
        tty = sys.stdout.isatty()
        self._console = Console(
            highlight=False,
            emoji=False,
            soft_wrap=False,
            width=None if tty else 200,
            force_terminal=tty,
            no_color=not tty,
        )

    def print(self, *renderables: Any) -> None:
        renderables = tuple(printable_lines(r) if isinstance(r, str) else r for r in renderables)
        with self._console.capture() as capture:
            self._console.print(*renderables)
        text = "\n".join(line.rstrip() for line in capture.get().splitlines())
        click.echo(text)
