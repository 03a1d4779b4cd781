"""torch.compile: compiled code stays exactly what it would be without hookdbg, and a
compiled model is recorded as one call, under the user's name for it.

* Every hook returns at once while dynamo traces (``torch.compiler.is_compiling()``,
  recorder/calls/envelope.py), so nothing of hookdbg enters a graph: no graph breaks, no
  guards on hookdbg's state, no recompiles, the same numbers to the last bit.
* ``torch.compile(model)`` returns an OptimizedModule whose own hooks run outside the
  compiled code: that call is recorded, named and typed as the model (its inputs,
  outputs, gradients and times); the model's submodules run inside the compiled code
  and are not seen (recorder/calls/naming.py).
* ``model.compile()`` compiles the model's ``_call_impl`` in place, hooks included, so
  no hook of that model runs outside compiled code. hookdbg wraps the compiled call of
  such a model (models compiled before recording starts, found in the script's
  variables, and those compiled while it runs) in an eager call that runs the module
  hooks around it, and puts the original back when recording ends.

To see inside a compiled model, record a run without compiling it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hookdbg.recorder.calls.envelope import run_eagerly
from hookdbg.recorder.calls.labels import user_modules


def compiled_in_place(module: object) -> Callable[..., Any] | None:
    """The compiled call of a module that ``module.compile()`` compiled, else None."""
    return getattr(module, "__dict__", {}).get("_compiled_call_impl")


class _RecordedCall:
    """A model's compiled ``_call_impl``, with hookdbg's module hooks around it."""

    def __init__(
        self,
        module: torch.nn.Module,
        compiled: Callable[..., Any],
        pre: Callable[..., None],
        post: Callable[..., None],
    ) -> None:
        self.module = module
        self.compiled = compiled
        self._pre = pre
        self._post = post

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self.module
        self._pre(module, args)
        try:
            result = self.compiled(*args, **kwargs)
        except BaseException:
            self._post(module, args, kwargs)
            raise
        self._post(module, args, kwargs, result)
        return result

    def __getattr__(self, name: str) -> Any:  # what torch may ask of the compiled fn
        return getattr(self.compiled, name)


run_eagerly(_RecordedCall.__call__.__code__)


class InPlaceCompiled:
    """Wraps the compiled calls of models compiled in place, while recording; ``remove``
    restores them and ``nn.Module.compile``."""

    def __init__(self, pre: Callable[..., None], post: Callable[..., None]) -> None:
        self._pre = pre
        self._post = post
        self._wrapped: list[_RecordedCall] = []
        self._compile = torch.nn.Module.compile
        for module in user_modules():
            for sub in module.modules():
                self.wrap(sub)
        original, wrap = self._compile, self.wrap

        def compile(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            wrap(self)

        compile.__doc__ = original.__doc__
        torch.nn.Module.compile = compile  # type: ignore[method-assign]

    def wrap(self, module: torch.nn.Module) -> None:
        compiled = compiled_in_place(module)
        if compiled is None or isinstance(compiled, _RecordedCall):
            return
        recorded = _RecordedCall(module, compiled, self._pre, self._post)
        module._compiled_call_impl = recorded
        self._wrapped.append(recorded)

    def remove(self) -> None:
        torch.nn.Module.compile = self._compile  # type: ignore[method-assign]
        while self._wrapped:
            recorded = self._wrapped.pop()
            if recorded.module.__dict__.get("_compiled_call_impl") is recorded:
                recorded.module._compiled_call_impl = recorded.compiled
