"""HookSet: one owner for every hook hookdbg installs, so that all of them go away together.

Modelled on torch's ``RemovableHandle``: each registration returns a handle, and the
set removes them all (newest first) on ``remove()`` or when its ``with`` block ends,
however it ends. Removal is idempotent.

A hook in one of torch's global registries can also be removed behind hookdbg's back:
some libraries and test helpers empty them (``_global_forward_hooks.clear()``).
``missing`` says which of those hookdbg registered are gone, one membership test each:
the recorder asks at step boundaries, not per call.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType, TracebackType
from typing import Any, Protocol, TypeVar


class Handle(Protocol):
    def remove(self) -> None: ...


H = TypeVar("H", bound=Handle)


class HookSet:
    def __init__(self) -> None:
        self._handles: list[Handle] = []
        # (where the registry is, its name, the handle's id in it) of add_global's hooks
        self._global: list[tuple[ModuleType, str, int]] = []

    def add(self, register: Callable[..., H], *args: Any, **kwargs: Any) -> H:
        """Call ``register(*args, **kwargs)`` and keep the handle it returns."""
        handle = register(*args, **kwargs)
        self._handles.append(handle)
        return handle

    def add_global(
        self,
        owner: ModuleType,
        registry: str,
        register: Callable[..., H],
        *args: Any,
        **kwargs: Any,
    ) -> H:
        """``add`` for a hook that ``register`` puts in the global dict ``registry`` of
        module ``owner`` (torch's, keyed by the handle's ``id``), for ``missing``."""
        handle = self.add(register, *args, **kwargs)
        self._global.append((owner, registry, handle.id))  # type: ignore[attr-defined]
        return handle

    def missing(self) -> list[str]:
        """The global registries (``torch.nn.modules.module._global_forward_hooks``) that
        no longer hold the hook ``add_global`` put there, however it was removed: the
        entry deleted, the dict emptied or replaced."""
        return [
            f"{owner.__name__}.{registry}"
            for owner, registry, key in self._global
            if key not in getattr(owner, registry, ())
        ]

    def remove(self) -> None:
        self._global.clear()
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
