"""How every report command prints: it builds a ``Report`` and hands it to ``emit``.

A report (memray's reporters are the model) holds what a command found, already
computed, and knows two ways to write it: ``to_json()`` for machines (``--json``) and
``render()`` for people. ``emit`` picks one by the shared options and applies
``--exit-code``, so a command function only checks its options, builds its report and
emits it. ``--json`` output is exact: JSON escapes control characters itself; NaN and
infinities, which JSON lacks, become null and "inf"/"-inf".
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, TypeVar

import click

from hookdbg.cli.terminal import Output
from hookdbg.text import utf8

F = TypeVar("F", bound=Callable[..., Any])

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def exit_code_option(help: str) -> Callable[[F], F]:
    """--exit-code: fail a CI job (status 1) on what the report found; ``help`` says on what."""
    return click.option("--exit-code", is_flag=True, help=help)


class Report(ABC):
    """What one report command found, ready to print as JSON or as text."""

    @abstractmethod
    def to_json(self) -> dict[str, object]:
        """The report as JSON-ready data (numpy scalars and NaN are converted on output)."""

    @abstractmethod
    def render(self, out: Output) -> None:
        """The report as text for people, printed through ``out``."""

    def exit_status(self) -> int:
        """What ``--exit-code`` exits with: 0, or 1 when the report found a problem."""
        return 0


def emit(report: Report, *, as_json: bool, exit_code: bool = False) -> None:
    """Print ``report`` as JSON or as text; with ``exit_code``, exit with its status."""
    if as_json:
        click.echo(json.dumps(plain(report.to_json()), indent=2))
    else:
        report.render(Output())
    if exit_code and report.exit_status():
        raise SystemExit(report.exit_status())


def plain(value: object) -> object:
    """JSON has no NaN or infinity: NaN becomes null, infinities the strings "inf"/"-inf"."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item"):
        return plain(value.item())  # numpy scalars
    if isinstance(value, bytes):
        return utf8(value)
    return value
