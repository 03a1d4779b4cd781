"""Work that hookdbg does not record, counted so that the recording can say so.

hookdbg records the thread and the process it started in. Module calls on other threads
(a model run by a thread pool, Hogwild with threads) are counted per thread by the
module hooks (modulehooks.py). A child process forked while recording (DataLoader
workers running per-sample transforms, ``torch.multiprocessing`` trainers as in Hogwild)
inherits the hooks, disabled (core.py); here it also gets two hooks of its own that tell
the parent, through a pipe made when recording starts, the first time it runs a module
and the first time it steps an optimizer: one short write each, never waited for. A
child started with the ``spawn`` or ``forkserver`` method is a new interpreter that
hookdbg never sees.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

from torch.nn.modules import module as module_hooks
from torch.optim import optimizer as optimizer_hooks

from hookdbg.text import plural


class Elsewhere:
    """The pipe from forked children, and what they said."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        for fd in (self._read, self._write):
            os.set_blocking(fd, False)  # a child never waits; the parent reads what is there
        self._said: dict[int, set[str]] = {}  # child pid -> "module", "trained"

    def in_child(self) -> None:
        """In a child just forked: tell the parent of its first module call and its first
        optimizer step."""
        os.close(self._read)
        self._tell(module_hooks.register_module_forward_pre_hook, "module")
        self._tell(optimizer_hooks.register_optimizer_step_post_hook, "trained")

    def _tell(self, register: Callable[..., object], what: str) -> None:
        fd, message = self._write, f"{what} {os.getpid()}\n".encode()
        handle = None

        def once(*args: object) -> None:
            if handle is not None:
                handle.remove()  # type: ignore[attr-defined]
            with contextlib.suppress(OSError):  # the parent is gone or its pipe is full
                os.write(fd, message)

        handle = register(once)

    def children(self) -> tuple[int, int]:
        """(children that ran modules, those of them that stepped an optimizer), so far."""
        data = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(self._read, 1 << 16):
                data += chunk
        for line in data.decode(errors="replace").splitlines():
            what, _, pid = line.partition(" ")
            if pid.isdigit():
                self._said.setdefault(int(pid), set()).add(what)
        ran = sum(1 for said in self._said.values() if "module" in said)
        return ran, sum(1 for said in self._said.values() if "trained" in said)

    def close(self) -> None:
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)


def unrecorded_threads(calls: dict[int, int]) -> str | None:
    """What the module hooks counted on other threads, in words (None: nothing)."""
    if not calls:
        return None
    total = sum(calls.values())
    return (
        f"{plural(total, 'module call')} on {plural(len(calls), 'other thread')} "
        "were not recorded (hookdbg records the thread that started recording)"
    )


def unrecorded_processes(ran: int, trained: int) -> str | None:
    """What forked children said, in words (None: nothing)."""
    if not ran:
        return None
    how = f" ({trained} of them stepped an optimizer: training there is not recorded)"
    return (
        f"{plural(ran, 'child process', 'child processes')} ran modules that were not "
        f"recorded{how if trained else ' (DataLoader workers running transforms do)'}; "
        "hookdbg records the process it started in"
    )
