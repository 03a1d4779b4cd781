"""Work that hookdbg does not record, counted so that the recording can say so.

hookdbg records the thread and the process it started in. Module calls and optimizer
steps on other threads (a model run by a thread pool, Hogwild with threads, a second
training loop in a thread of its own) are dropped by the hooks and counted per thread
(``OtherThreads``), so that the recording can say how many ran where. A child process
forked while recording (DataLoader workers running per-sample transforms,
``torch.multiprocessing`` trainers as in Hogwild) inherits the hooks, disabled
(core.py); here it also gets two hooks of its own that tell the parent, through a pipe
made when recording starts, the first time it runs a module and the first time it
steps an optimizer: one short write each, never waited for. A child started with the
``spawn`` or ``forkserver`` method is a new interpreter that hookdbg never sees.
"""

from __future__ import annotations

import contextlib
import os
import threading
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


class OtherThreads:
    """Module calls and optimizer steps on threads other than the recording one, counted
    per thread as the hooks drop them."""

    def __init__(self) -> None:
        # each thread (kept to the end: a thread's ident is reused once it ends) ->
        # [module calls, optimizer steps]
        self.counts: dict[threading.Thread, list[int]] = {}

    def module_call(self) -> None:
        self._count(0)

    def optimizer_step(self) -> None:
        self._count(1)

    def _count(self, what: int) -> None:
        thread = threading.current_thread()
        counts = self.counts.get(thread)
        if counts is None:
            counts = self.counts[thread] = [0, 0]
        counts[what] += 1


_NAMED = 3  # thread names given in the words, the busiest first


def unrecorded_threads(others: OtherThreads, recording: str) -> str | None:
    """What the hooks counted on threads other than the one named ``recording``, in
    words: how many calls and steps, on how many threads, by their names (a name
    several threads had, as a pool's workers, once). None: nothing."""
    if not others.counts:
        return None
    by_name: dict[str, list[int]] = {}  # name -> [threads, module calls, optimizer steps]
    for thread, (calls, steps) in others.counts.items():
        total = by_name.setdefault(thread.name, [0, 0, 0])
        total[0] += 1
        total[1] += calls
        total[2] += steps
    threads, calls, steps = (sum(t[i] for t in by_name.values()) for i in range(3))
    what = " and ".join(
        [plural(calls, "module call")] * bool(calls or not steps)
        + [plural(steps, "optimizer step")] * bool(steps)
    )
    busiest = sorted(by_name.items(), key=lambda item: (-item[1][1] - item[1][2], item[0]))
    named = []
    for name, (n, c, s) in busiest[:_NAMED]:
        parts = [f"{n:,} threads"] * (n > 1) + [plural(c, "call")] * bool(c)
        named.append(f"{_short(name)!r} ({', '.join(parts + [plural(s, 'step')] * bool(s))})")
    if len(busiest) > _NAMED:
        named.append(plural(len(busiest) - _NAMED, "more thread name"))
    were = "was" if calls + steps == 1 else "were"
    return (
        f"{what} on {plural(threads, 'other thread')} {were} not recorded: {', '.join(named)}; "
        f"hookdbg records the thread that started recording ({_short(recording)!r})"
    )


def _short(name: str, most: int = 40) -> str:
    """A thread's name, cut to ``most`` characters: the words must fit the file's row."""
    return name if len(name) <= most else name[: most - 1] + "\u2026"


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
