"""HookSet: one owner for every hook hookdbg installs, so that all of them go away together.

Modelled on torch's ``RemovableHandle``: each registration returns a handle, and the
set removes them all (newest first) on ``remove()`` or when its ``with`` block ends,
however it ends. Removal is idempotent.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol, TypeVar


class Handle(Protocol):
    def remove(self) -> None: ...


H = TypeVar("H", bound=Handle)


class HookSet:
    def __init__(self) -> None:
        self._handles: list[Handle] = []

    def add(self, register: Callable[..., H], *args: Any, **kwargs: Any) -> H:
        """Call ``register(*args, **kwargs)`` and keep the handle it returns."""
        handle = register(*args, **kwargs)
        self._handles.append(handle)
        return handle

    def remove(self) -> None:
        errors: list[BaseException] = []
        while self._handles:
            try:
                self._handles.pop().remove()
            except Exception as exc:  # keep removing the rest; report the first
                errors.append(exc)
        if errors:
            raise errors[0]

    def __len__(self) -> int:
        return len(self._handles)

    def __enter__(self) -> HookSet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()
