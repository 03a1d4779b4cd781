"""Where one training iteration ends and the next begins.

hookdbg only sees module calls, backward passes and optimizer steps, so it infers steps
with one rule, applied whenever a root module (the model, a loss module, either network
of a GAN) starts a forward pass. That forward starts a new step when

1. an optimizer has stepped since the step began, and every optimizer known so far has:
   one training iteration, however many optimizers it has (a GAN's two) and however
   many forward/backward passes it takes (gradient accumulation); or
2. no optimizer has stepped since the step began, the same root already ran in this
   step, and either the forward is inference (grad disabled, or the root in eval mode:
   each validation batch is a step), or the step so far was inference and training
   resumes, or no optimizer is known but a backward ran (scripts that update weights
   by hand: each forward+backward is a step).

Optimizers become known when they step, and at the first root forward and the first
optimizer step hookdbg also looks for them in the training loop's variables (``opt``,
``opt_d``, ``opt_g``, ``self.optimizers``), so that the first iteration of a GAN or of
gradient accumulation is not cut in two. A forward run by an optimizer itself
(LBFGS's closure) never starts a step. Known limits: an iteration whose optimizer step
is skipped (AMP's GradScaler after an inf) merges with the next one, and an optimizer
created after the first forward and hidden from the loop's variables is only known
from its first step on. An optimizer that does not step every iteration (a spare one,
or a WGAN's generator stepping every 5th) is noticed when another steps twice within
one step; from then on a step is a cycle of the optimizers seen stepping.
"""

from __future__ import annotations

import os
import sys
import types

import torch

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_HOOKDBG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class StepTracker:
    def __init__(self) -> None:
        self.step = -1  # no step has begun
        self._roots: set[int] = set()
        self._stepped: set[int] = set()
        self._known: set[int] = set()
        self._ever: set[int] = set()  # optimizers that have stepped at least once
        self._backward = False
        self._inference = False  # the step's first root forward was inference
        self._in_optimizer = 0
        self._searched = False
        self.optimizer_steps = 0  # in the current step

    def starts_step(self, root: int, inference: bool) -> bool:
        """Whether a forward of root module ``root`` starting now begins a new step."""
        if self.step < 0:
            self._known.update(id(o) for o in _find_optimizers())
            return True
        if self._stepped:
            return self._known <= self._stepped  # also inside an optimizer: LBFGS
        if self._in_optimizer or root not in self._roots:
            return False
        return inference or self._inference or (not self._known and self._backward)

    def begin(self, inference: bool) -> None:
        """Start the next step (after the recorder has closed the previous one)."""
        self.step += 1
        self._roots.clear()
        self._stepped.clear()
        self._backward = False
        self._inference = inference
        self.optimizer_steps = 0

    def root_seen(self, root: int) -> None:
        self._roots.add(root)

    def backward_ran(self) -> None:
        self._backward = True

    @property
    def saw_backward(self) -> bool:
        return self._backward

    def optimizer_begin(self) -> None:
        self._in_optimizer += 1

    def optimizer_end(self, opt: torch.optim.Optimizer) -> None:
        self._in_optimizer = max(0, self._in_optimizer - 1)
        if not self._searched:  # it may have been created after the first forward
            self._searched = True
            self._known.update(id(o) for o in _find_optimizers())
        key = id(opt)
        if key in self._stepped and not self._known <= self._stepped:
            # it stepped twice in one step: a known optimizer is not used every
            # iteration (or not at all); only count those seen stepping from now on
            self._known = set(self._ever)
        self._ever.add(key)
        self._known.add(key)
        self._stepped.add(key)
        self.optimizer_steps += 1


def _find_optimizers() -> list[torch.optim.Optimizer]:
    """Optimizers held by the user's code: locals of the calling frames, one level of
    their attributes and containers, and ``__main__``'s globals."""
    found: dict[int, torch.optim.Optimizer] = {}

    def visit(value: object, depth: int) -> None:
        if isinstance(value, torch.optim.Optimizer):
            found[id(value)] = value
        elif depth == 0:
            return
        elif isinstance(value, (list, tuple, set)):
            for item in list(value)[:64]:
                visit(item, depth - 1)
        elif isinstance(value, dict):
            for item in list(value.values())[:64]:
                visit(item, depth - 1)
        elif not isinstance(value, (type, types.ModuleType, torch.Tensor)) and hasattr(
            value, "__dict__"
        ):
            try:
                attrs = list(vars(value).values())[:256]
            except TypeError:
                return
            for item in attrs:
                visit(item, depth - 1)

    frame = sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith((_TORCH_DIR, _HOOKDBG_DIR)):
            for value in list(frame.f_locals.values()):
                visit(value, 2)
        frame = frame.f_back
    main = sys.modules.get("__main__")
    if main is not None:
        for value in list(vars(main).values()):
            if not isinstance(value, types.ModuleType):
                visit(value, 2)
    return list(found.values())
