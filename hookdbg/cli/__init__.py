"""The ``hookdbg`` command line: one click group, one module per command."""

from hookdbg.cli.main import main

__all__ = ["main"]
