"""The ``hookdbg`` command line: one click group, one module per command."""

from hookdbg.cli.app import cli, main

__all__ = ["cli", "main"]
