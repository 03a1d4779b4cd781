"""``o``: a module's code in the user's editor, with the app suspended meanwhile.

The recorder notes where each module's class defines ``forward`` (the modules table's
``file`` and ``line``); the editor is started as ``$EDITOR +LINE FILE``, the way git,
less and most terminal editors (vim, nano, emacs, micro, kakoune) take a line.
"""

from __future__ import annotations

import os
import shlex
import subprocess

from textual.app import App, SuspendNotSupported

from hookdbg.read.modules import Module, ModuleTable
from hookdbg.text import printable


def source_problem(module: Module, modules: ModuleTable) -> str | None:
    """Why the module's code cannot be opened, or None if it can."""
    if not modules.sources:
        return (
            "this recording does not say where modules are defined (recorded by a hookdbg "
            "older than schema version 7): record it again to open modules' code with o"
        )
    source = module.source
    if source is None:
        return (
            f"no source recorded for {module.name} ({module.type}): its class has no "
            "forward of its own, or its code is not in a file"
        )
    file, line = source
    # absolute, so that it cannot read as an option of the editor's
    if not os.path.isabs(file) or not os.path.isfile(file):
        return f"{file}:{line} is not a file on this machine (the run was recorded elsewhere?)"
    return None


def editor_command() -> list[str]:
    """``$EDITOR``, else ``$VISUAL``, split as a shell would (``code --wait``); raises
    ValueError saying what to set if neither is, or if one cannot be split."""
    for name in ("EDITOR", "VISUAL"):
        value = os.environ.get(name, "").strip()
        if value:
            try:
                return shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"${name} cannot be split into a command: {exc}") from None
    raise ValueError("set $EDITOR (or $VISUAL) to open a module's code with o")


def edit(app: App, file: str, line: int) -> str | None:
    """Run the editor on ``file`` at ``line``, the terminal handed over to it while it
    runs; what went wrong, or None. A headless app (a test) has no terminal to hand
    over: the editor runs without one."""
    try:
        command = [*editor_command(), f"+{line}", file]
    except ValueError as exc:
        return str(exc)
    try:
        if app.is_headless:
            done = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
            )
        else:
            with app.suspend():
                done = subprocess.run(command, check=False)
    except SuspendNotSupported:
        return f"this terminal cannot be handed to an editor: open {file}:{line} yourself"
    except OSError as exc:
        return f"cannot run {printable(command[0])}: {exc.strerror or exc}"
    if done.returncode:
        return f"{printable(command[0])} exited with status {done.returncode}"
    return None
