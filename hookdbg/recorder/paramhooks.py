"""The parameters' gradient hooks, which can be taken off while steps are not recorded.

A post-accumulate-grad hook on every parameter runs in every backward pass, recorded or
not: on a model of small modules that is a quarter of what a step that is not recorded
costs (about 0.6 us per parameter on the benchmark MLP). Under ``--every N`` or
``--steps A:B`` the recorder knows which steps are recorded, so before a stretch of
at least ``PAUSE`` steps that are not, it takes the hooks off, and puts them back when a
recorded step begins (segments.py), before its backward. Putting them back costs a
registration per parameter, a few times what one unrecorded step's hook costs, hence
the minimum stretch.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from hookdbg.recorder.hookset import Handle

PAUSE = 4  # steps not recorded ahead, at least, for the hooks to come off


class ParamHooks:
    """One ``register_post_accumulate_grad_hook`` per parameter, on or off together. It
    is also the recorder's handle on them all: ``remove`` takes them off for good."""

    def __init__(self) -> None:
        self._hooks: list[tuple[weakref.ref[torch.Tensor], Callable[[torch.Tensor], None]]] = []
        self._handles: list[Handle] = []
        self.on = True

    def add(self, param: torch.Tensor, hook: Callable[[torch.Tensor], None]) -> None:
        self._hooks.append((weakref.ref(param), hook))
        if self.on:
            self._handles.append(param.register_post_accumulate_grad_hook(hook))

    def switch(self, on: bool) -> None:
        """Put the hooks on (of the parameters still alive) or take them off."""
        if on == self.on:
            return
        self.on = on
        if not on:
            self._take_off()
            return
        alive = []
        for ref, hook in self._hooks:
            param = ref()
            if param is not None:
                alive.append((ref, hook))
                self._handles.append(param.register_post_accumulate_grad_hook(hook))
        self._hooks = alive

    def remove(self) -> None:
        """Take every hook off for good: the recording is over."""
        self._hooks = []
        self._take_off()

    def _take_off(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
