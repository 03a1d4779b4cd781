"""Where one training iteration ends and the next begins, and which forwards are not
training at all.

hookdbg sees module calls, backward passes and optimizer steps, and cuts the run into
*segments*: each is either a **training step** (one iteration: forwards, backwards and
optimizer steps) or an **eval batch** (a forward of a model in ``eval()`` mode with
gradients off, as validation and test loops run it). Training steps are numbered from 0
in the order they ran; an eval batch carries the number of training steps completed
before it (TensorBoard's global step) and is counted apart. Whether a segment was
training is settled when it ends: it is a training step if a backward ran or an
optimizer stepped in it.

A *root* call is a module call with no other module call around it. Each root call is
one of:

* **aux**: the module (with its submodules) has no parameters: a data transform such as
  torchvision's ``Normalize`` applied per sample, a loss module, an activation. It
  belongs to the segment it happens in (the loss of an eval batch, or the transforms of
  the batch after it), or starts the next one if the current one is complete (the
  transforms of the next iteration's batch).
* **sample**: gradients are off but the module is in training mode: a GAN's
  ``netG(fixed_noise)`` under ``no_grad``, a DQN target network. It belongs to the
  segment it happens in. (Before any training, with no optimizer known and no backward
  yet, it counts as eval: a model run for inference without ``eval()``.)
* **eval**: gradients are off and the module is in ``eval()`` mode.
* **train**: gradients are on (whatever the mode).

A segment is *complete*, for a root call of a module, when an optimizer has stepped in
it and every optimizer known so far has (a GAN's two; gradient accumulation's many
forwards and backwards before one step), or, when no optimizer is known, when a backward
ran in it and the same module already ran in it (weights updated by hand: each
forward+backward of the model is a step). A root call starts a new segment when

1. none has started yet, or the current one is complete (for any root call but a
   sample); or
2. it is eval, and the same module already ran in the current eval batch (the next
   batch of a validation loop); or
3. it is train, the current segment holds only eval batches' forwards, and either the
   same module ran in it or several eval batches have run since the last training
   step (training resumes after a validation loop, also inside ``optimizer.step`` as
   Lightning runs it; a single eval forward of another model just before training,
   such as a distillation teacher or a frozen backbone in ``eval()`` mode, is part of
   the step); or
4. it is train, no optimizer is known, no backward has run in the whole recording, and
   the same module already ran in the current segment (a forward-only script with
   gradients on: each forward is a batch of its own).

Otherwise it joins the current segment: an eval forward inside a training iteration that
is not complete (a target network) or a second model's eval forward in the same batch
(``model.decode(z)`` after a test loop) stays where it happened.

Optimizers become known when they step, and at the first root forward and the first
optimizer step hookdbg also looks for them in the training loop's variables (``opt``,
``opt_d``, ``opt_g``, ``self.optimizers``), so that the first iteration of a GAN or of
gradient accumulation is not cut in two; a framework's optimizer wrapper stands for the
optimizer inside it. A forward run by an optimizer itself (LBFGS's
closure) never starts a segment. An optimizer that does not step every iteration (a
spare one, or a WGAN's generator stepping every 5th) is noticed when another steps twice
within one segment; from then on a step is a cycle of the optimizers seen stepping.

A training step interrupted before its optimizer step (validation in the middle of
gradient accumulation, as Lightning's ``val_check_interval`` does) is cut into two
training segments with the same step number, around the eval batches; readers see one
step.

An iteration whose optimizer step AMP's GradScaler skipped (its scaled gradients
overflowed) ends at ``scaler.step`` all the same (recorder/gradscaler.py).

Known limits: an eval loop run with gradients on is one eval batch per
loop rather than per batch (nothing tells its batches apart); a script whose modules
have no parameters at all is one segment.
"""

from __future__ import annotations

import os
import sys
import types
from enum import IntEnum

import torch

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_HOOKDBG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class RootKind(IntEnum):
    """What a root call is, for the rule above."""

    AUX = 0
    SAMPLE = 1
    EVAL = 2
    TRAIN = 3


def root_kind(module: torch.nn.Module, has_params: bool) -> RootKind:
    """Classify a root call of ``module`` made now (reads the grad mode)."""
    if not has_params:
        return RootKind.AUX
    if torch.is_grad_enabled():
        return RootKind.TRAIN
    return RootKind.SAMPLE if module.training else RootKind.EVAL


class StepTracker:
    """Applies the rule above. ``segment`` numbers segments from 0 in order; ``step`` is
    the number of training steps completed before the current segment began."""

    def __init__(self) -> None:
        self.segment = -1  # no segment has begun
        self.step = 0
        self.evals = 0  # eval batches ended so far
        self._roots: set[int] = set()  # train/eval root modules of the current segment
        self._train_roots: set[int] = set()  # those of them that ran with gradients on
        self._trained = False  # a train root, a backward or an optimizer step in it
        self._eval_since_training = 0  # eval segments since the last training step
        self._stepped: set[int] = set()
        self._known: set[int] = set()
        self._ever: set[int] = set()  # optimizers that have stepped at least once
        self.saw_backward = False  # in the current segment
        self._any_backward = False  # in the whole recording
        self._in_optimizer = 0
        self._searched = False
        self.optimizer_steps = 0  # in the current segment
        self.optimizer_calls = 0  # in the whole recording

    @property
    def is_training(self) -> bool:
        """Whether the current segment is a training step (so far; settled at its end)."""
        return self._trained or self.saw_backward or bool(self._stepped)

    def starts_segment(self, module: int, kind: RootKind) -> bool:
        """Whether a root call of ``module`` (its id), of ``kind``, starting now begins a
        new segment."""
        if self.segment < 0:
            self._known.update(id(o) for o in _find_optimizers())
            return True
        kind = self.effective(kind)
        if kind == RootKind.SAMPLE:
            return False
        if self._complete(module):  # also inside an optimizer: LBFGS's closure
            return True
        if kind == RootKind.AUX:
            return False
        eval_batch = not self.is_training and bool(self._roots)
        if kind == RootKind.EVAL:  # the next validation batch, or validation that
            # interrupts gradient accumulation (the model being trained, in eval mode)
            return module in self._roots and (eval_batch or module in self._train_roots)
        if eval_batch:  # training resumes (inside optimizer.step too: Lightning's closure)
            return module in self._roots or self._eval_since_training > 0
        if self._in_optimizer:  # LBFGS evaluates its closure several times in one step
            return False
        return not self._known and not self._any_backward and module in self._roots

    def _complete(self, module: int) -> bool:
        if self._stepped:
            return self._known <= self._stepped
        # weights updated by hand: a backward ran and the same model runs again
        return not self._known and self.saw_backward and module in self._roots

    def begin(self) -> None:
        """Start the next segment (after the recorder has ended the previous one)."""
        self.segment += 1
        self._roots.clear()
        self._train_roots.clear()
        self._stepped.clear()
        self.saw_backward = False
        self._trained = False
        self.optimizer_steps = 0

    def effective(self, kind: RootKind) -> RootKind:
        """A sample before any training (no optimizer, no backward yet) is an inference
        batch of a model left in training mode: count it as eval."""
        if kind == RootKind.SAMPLE and not self._known and not self._any_backward:
            return RootKind.EVAL
        return kind

    def root_ran(self, module: int, kind: RootKind) -> None:
        kind = self.effective(kind)
        if kind >= RootKind.EVAL:
            self._roots.add(module)
        if kind == RootKind.TRAIN:
            self._trained = True
            self._train_roots.add(module)

    def end(self, cut: bool = False, interrupted: bool = False) -> bool:
        """End the current segment; True if it was a training step. ``cut``: the run
        stopped in the middle of it (an exception, --on-nan stop): a training forward
        made it a training step even though its backward never came. ``interrupted``:
        hookdbg raised into the script there (--on-nan raise or stop), which may go on:
        likewise, once the run is known to train (an optimizer, or a backward so far;
        before that a forward with gradients on is an inference batch, rule 4)."""
        trains = self._known or self._any_backward
        training = (
            self.saw_backward
            or bool(self._stepped)
            or ((cut or (interrupted and trains)) and self._trained)
        )
        if training:
            self._eval_since_training = 0
            # a backward without the optimizer step its iteration waits for is part of a
            # step that goes on after an interruption (validation during accumulation):
            # the next segment keeps its number
            if self._stepped or not self._known or cut:
                self.step += 1
        elif self._roots:
            self.evals += 1
            self._eval_since_training += 1
        return training

    def backward_ran(self) -> None:
        self.saw_backward = self._any_backward = True

    def optimizer_begin(self) -> None:
        self._in_optimizer += 1

    def optimizer_end(self, opt: torch.optim.Optimizer) -> None:
        self._in_optimizer = max(0, self._in_optimizer - 1)
        self.optimizer_calls += 1
        self._stepped_once(opt)
        self.optimizer_steps += 1

    def optimizer_skipped(self, opt: torch.optim.Optimizer) -> None:
        """AMP's GradScaler skipped ``opt``'s step (its gradients overflowed): the
        iteration still ends there."""
        self._stepped_once(opt)

    def _stepped_once(self, opt: torch.optim.Optimizer) -> None:
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


_WRAPPED = ("optimizer", "_optimizer", "optim", "base_optimizer")


def unwrapped(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer that really steps inside a wrapper that is one too (accelerate's
    AcceleratedOptimizer, Lightning's LightningOptimizer): the wrapper's own step never
    reaches the optimizer hooks, the inner one's does."""
    for _ in range(4):
        inner = next(
            (w for a in _WRAPPED if isinstance(w := getattr(opt, a, None), torch.optim.Optimizer)),
            None,
        )
        if inner is None or inner is opt:
            break
        opt = inner
    return opt


def _find_optimizers() -> list[torch.optim.Optimizer]:
    """Optimizers held by the user's code: locals of the calling frames, one level of
    their attributes and containers, and ``__main__``'s globals (wrappers unwrapped)."""
    found: dict[int, torch.optim.Optimizer] = {}

    def visit(value: object, depth: int) -> None:
        if isinstance(value, torch.optim.Optimizer):
            value = unwrapped(value)
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

    frame: types.FrameType | None = sys._getframe(1)
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
