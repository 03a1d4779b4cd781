"""Where one training iteration ends and the next begins, and which forwards are not
training at all.

hookdbg sees module calls, backward passes and optimizer steps, and cuts the run into
*segments*: each is either a **training step** (one iteration: forwards, backwards and
optimizer steps) or an **eval batch** (forwards that train nothing: a batch of a
validation or test loop, one inference). Training steps are numbered from 0 in the
order they ran; an eval batch carries the number of training steps completed before it
(TensorBoard's global step) and is counted apart. Whether a segment was training is
settled when it ends: it is a training step if a backward ran or an optimizer stepped
in it.

A *root* call is a module call with no other module call around it (a parametrized
weight read outside any call, through ``torch.nn.utils.parametrize``, is none: the
module hooks leave it out, recorder/hooks/modulehooks.py). Each root call is one of:

* **aux**: the module (with its submodules) has no parameters: a data transform such as
  torchvision's ``Normalize`` applied per sample, a loss module, an activation. It
  belongs to the segment it happens in (the loss of an eval batch), or starts the next
  one (rules 1 and 5: the transforms of the next batch).
* **sample**: gradients are off, the module is in training mode, and the current
  segment is a training iteration that is not complete: a DQN target network, a GAN's
  sample between its optimizers' steps. It belongs to that iteration. Gradients off in
  training mode anywhere else is **eval**: a test loop under ``no_grad`` without
  ``eval()``, a prediction after the optimizer step, a GAN's progress sample, a model
  run for inference before any training.
* **eval**: gradients are off and the module is in ``eval()`` mode.
* **train**: gradients are on (whatever the mode).

A segment is *complete*, for a root call of a module, when an optimizer has stepped in
it and every optimizer of the *cycle* has (a GAN's two; gradient accumulation's many
forwards and backwards before one step), or, when no optimizer is known, when a backward
ran in it and the same module already ran in it (weights updated by hand: each
forward+backward of the model is a step). A root call starts a new segment when

1. none has started yet, or the current one is complete; or
2. it is eval, and the current segment is an eval batch in which
   a. the same module already ran (the next batch of a test loop), unless both calls
      come from one call of a method of that module itself (``self(idx)`` in
      ``generate()``: a whole generation is one eval batch); or
   b. every model of the previous eval batch already ran, and this one ran in none of
      them (another model's first batch: a copy made by ``torch.load``,
      ``copy.deepcopy`` or ``load_state_dict`` tested after the original's validation
      loop; ``model.decode(z)`` after a test loop); or
3. it is eval, and the same module already ran with gradients on in the current
   training segment (validation that interrupts gradient accumulation); or
4. it is train, the current segment holds only eval forwards, and either the same
   module ran in it, or an eval batch ran before it since the last training step, or
   none of its models has run an eval forward inside a training step (training resumes
   after a validation loop or a sample, also inside ``optimizer.step`` as Lightning
   runs it; a distillation teacher or a frozen backbone in ``eval()`` mode, or a GAN's
   generator under ``no_grad``, run just before the trained model in every step and in
   the first one, is part of the step); or
5. it is aux, the current segment is an eval batch, and the module has only ever run
   before the models of its segment (a per-sample transform opens the next batch; a
   loss, which runs after a model, never starts one); or
6. it is train, no optimizer is known, no backward has run in the whole recording, and
   the same module already ran in the current segment (a forward-only script with
   gradients on: each forward is a batch of its own).

Otherwise it joins the current segment: an eval forward inside a training iteration that
is not complete (a target network) or a second model's eval forward in the same batch
(an ensemble, a metric model) stays where it happened.

A loop that trains plain tensors (``w = torch.randn(..., requires_grad=True)``, an
optimizer, a loss) calls no module, so a backward pass may begin a segment too:

7. a backward pass the script starts outside any module call begins one when none has
   begun, or when the current one is complete: every optimizer of the cycle stepped in
   it and none found is awaited, or, with no optimizer known, a backward ran in it and
   no model did (tensors updated by hand: each backward is a step). A segment no model
   ran in is a training step once a pass began in it.

The *cycle* is the optimizers that step once per iteration: every optimizer that steps
is in it. One that steps first in an iteration and is not in the cycle starts a new
cycle of its own (an optimizer made to replace the one before, the next layer's own
optimizer when layers are trained in turn); one that steps after another joins it, and
optimizers garbage-collected leave it. At the first root forward and the first
optimizer step hookdbg also looks for optimizers in the training loop's variables
(``opt``, ``opt_d``, ``opt_g``, ``self.optimizers``; a framework's optimizer wrapper
stands for the optimizer inside it), so that the first iteration of a GAN or of
gradient accumulation is not cut in two: until it steps, an optimizer found there is
awaited too, unless the same model runs again and the optimizer holds none of the
parameters of the models that ran in the segment (the next layer's optimizer; an
actor's optimizer is awaited while the actor has not run yet). An optimizer that steps
twice within one segment shows that one awaited does not step every iteration (a spare
one, a WGAN's generator stepping every 5th): from then on only those seen stepping in
that segment count, and none found is awaited. A forward run by an optimizer itself
(LBFGS's closure) starts a segment only by rules 1 and 4.

A training step interrupted before its optimizer step (validation in the middle of
gradient accumulation, as Lightning's ``val_check_interval`` does) is cut into two
training segments with the same step number, around the eval batches; readers see one
step.

An iteration whose optimizer step AMP's GradScaler skipped (its scaled gradients
overflowed) ends at ``scaler.step`` all the same (recorder/hooks/gradscaler.py).

Cost: the rule runs at root calls only, with set lookups. Rule 2a asks which Python
frame made the call (the nearest one outside torch and hookdbg) once per model at the
start of each eval batch, and for the next calls of the model whose own method made
it, does one ``sys._getframe`` at the same depth; that frame is held until the eval
batch ends. The parameters of models and optimizers are compared only while an
optimizer found is awaited (the first iterations).

Known limits: an eval loop run with gradients on is one eval batch per loop rather than
per batch (nothing tells its batches apart); a script whose modules have no parameters
at all is one segment. A generation loop written as a function outside the model
(``sample(model, x, steps)``) is one eval batch per forward, and a test loop inside a
method of the model itself (``self(x)`` for each batch in ``model.evaluate(loader)``) is
one eval batch. A model copy tested in the same loop as the original, or after a single
eval batch of it, joins the original's last batch (rule 2b learns from the batch
before). When an optimizer found in the variables does not step every iteration, the
first step absorbs one iteration before the cycle corrects itself; an optimizer that
steps every few iterations in a phase of its own (TD3's delayed actor update) may make
that phase a step of its own.
"""

from __future__ import annotations

import os
import sys
import types
import weakref
from collections.abc import Callable
from enum import IntEnum

import torch

from hookdbg.recorder.calls.cboundary import called_from_c

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_HOOKDBG_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class RootKind(IntEnum):
    """What a root call is, for the rule above."""

    AUX = 0
    SAMPLE = 1
    EVAL = 2
    TRAIN = 3


def root_kind(module: torch.nn.Module, has_params: bool) -> RootKind:
    """Classify a root call of ``module`` made now (reads the grad mode). A sample may
    still count as eval: ``StepTracker.starts_segment`` decides."""
    if not has_params:
        return RootKind.AUX
    if torch.is_grad_enabled():
        return RootKind.TRAIN
    return RootKind.SAMPLE if module.training else RootKind.EVAL


class StepTracker:
    """Applies the rule above. ``segment`` numbers segments from 0 in order; ``step`` is
    the number of training steps completed before the current segment began; ``kind``
    is what the latest root call counted as."""

    def __init__(self) -> None:
        self.segment = -1  # no segment has begun
        self.step = 0
        self.evals = 0  # eval batches ended so far
        self.kind = RootKind.AUX
        self._roots: set[int] = set()  # train/eval root modules of the current segment
        self._train_roots: set[int] = set()  # those of them that ran with gradients on
        self._eval_roots: set[int] = set()  # those that ran an eval forward
        self._trained = False  # a train root, a backward or an optimizer step in it
        self._eval_since_training = 0  # eval segments since the last training step
        self._last_eval: frozenset[int] = frozenset()  # the roots of the last eval batch
        self._step_evals: set[int] = set()  # models that ran an eval forward in a step
        # aux modules that ran before any model of a segment, and after one (rule 5)
        self._openers: set[int] = set()
        self._closers: set[int] = set()
        # the call of a model's own method that the eval batch runs in (rule 2a): that
        # frame, its depth (see ``_caller``), the model's id
        self._frame: types.FrameType | None = None
        self._frame_depth = 0
        self._frame_module = -1
        self._walked: tuple[types.FrameType | None, int] | None = None
        self._stepped: set[int] = set()
        # optimizers by id, as weak references: those that step in every iteration, and
        # those found in the script's variables that have not stepped yet
        self._cycle: dict[int, Callable[[], object]] = {}
        self._found: dict[int, Callable[[], object]] = {}
        self._optimized = False  # an optimizer is known (found or seen stepping)
        # while some are found, the models (root modules with parameters) of the current
        # segment, and which found optimizers hold none of their parameters (for how many)
        self._models: dict[int, torch.nn.Module] = {}
        self._excused: set[int] = set()
        self._excused_for = -1
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

    @property
    def training_so_far(self) -> bool | None:
        """What messages call the current segment until it ends (calls.Segment.training):
        a training step, an eval batch, or None where neither is known yet."""
        if self.is_training:
            return True
        return False if self.kind == RootKind.EVAL else None

    def starts_segment(self, module: int, kind: RootKind, obj: torch.nn.Module) -> bool:
        """Whether a root call of ``obj`` (``module``: its id), of ``kind``, starting now
        begins a new segment; sets ``kind`` to what the call counts as."""
        if self.segment < 0:
            self._learn(_find_optimizers())
            self.kind = RootKind.EVAL if kind == RootKind.SAMPLE else kind
            return True
        if kind == RootKind.SAMPLE and not self._open_step(module):
            kind = RootKind.EVAL
        self.kind = kind
        if kind == RootKind.SAMPLE:
            return False
        if self._complete(module):  # also inside an optimizer: LBFGS's closure
            return True
        eval_batch = not self.is_training and bool(self._roots)
        if kind == RootKind.AUX:  # the next batch's transforms (rule 5)
            return eval_batch and module in self._openers and module not in self._closers
        if kind == RootKind.EVAL:
            if module in self._roots:
                if eval_batch:  # the next batch of a test loop, not the next token
                    return not self._same_call(module, obj)
                # validation interrupts gradient accumulation (the model being trained)
                return module in self._train_roots
            last = self._last_eval  # another model's first batch (rule 2b)
            return eval_batch and bool(last) and last <= self._roots and module not in last
        if eval_batch:  # training resumes (inside optimizer.step too: Lightning's closure)
            return (
                module in self._roots
                or self._eval_since_training > 0
                or (self.step > 0 and not self._roots & self._step_evals)
            )
        if self._in_optimizer:  # LBFGS evaluates its closure several times in one step
            return False
        return not self._optimized and not self._any_backward and module in self._roots

    def starts_at_pass(self) -> bool:
        """Whether a backward pass the script starts now, outside any module call,
        begins a new segment (rule 7); sets ``kind`` to what it counts as. Inside an
        optimizer step (LBFGS's closure) only the first pass can: the segment it begins
        is not complete until the step ends."""
        if self.segment < 0:
            self._learn(_find_optimizers())
            self.kind = RootKind.TRAIN
            return True
        if self._stepped:
            complete = self._cycle.keys() <= self._stepped and not self._found
        else:
            complete = not self._optimized and self.saw_backward and not self._roots
        if complete:
            self.kind = RootKind.TRAIN
        return complete

    def pass_ran(self) -> None:
        """A backward pass began: in a segment no model ran in, nothing else would say
        so (the gradient hooks that do see no module's tensors there)."""
        if not self._roots:
            self.backward_ran()

    def awaited(self) -> list[torch.optim.Optimizer]:
        """The optimizers found in the script's variables that have not stepped yet."""
        alive = (ref() for ref in self._found.values())
        return [opt for opt in alive if isinstance(opt, torch.optim.Optimizer)]

    def _open_step(self, module: int) -> bool:
        """Whether a sample of ``module`` now belongs to the current segment: it is a
        training iteration, not complete, of a run that trains."""
        return (
            (self._optimized or self._any_backward)
            and self.is_training
            and not self._complete(module)
        )

    def _complete(self, module: int) -> bool:
        if self._stepped:
            if not self._cycle.keys() <= self._stepped:
                return False
            # an optimizer found but not seen stepping yet is awaited, unless the same
            # model runs again and it holds none of the parameters of this segment's
            # models (the next layer's, when layers are trained in turn)
            return not self._found or (
                module in self._models and self._found.keys() <= self._unconcerned()
            )
        # weights updated by hand: a backward ran and the same model runs again
        return not self._optimized and self.saw_backward and module in self._roots

    def _unconcerned(self) -> set[int]:
        """The found optimizers that hold no parameter of this segment's models (worked
        out again when a model joins the segment)."""
        if self._excused_for != len(self._models):
            self._excused_for = len(self._models)
            models = list(self._models.values())
            self._excused = {k for k, r in self._found.items() if not _holds(r(), models)}
        return self._excused

    def _same_call(self, module: int, obj: torch.nn.Module) -> bool:
        """Whether this call of ``obj`` comes from the call of its own method that the
        current eval batch runs in (``generate()``): a ``sys._getframe`` at the depth
        where that frame was, and a walk only if the depth changed."""
        frame = self._frame
        if frame is None or module != self._frame_module:
            return False
        if _frame_at(self._frame_depth) is frame:
            return True
        found = _caller(obj)
        if found[0] is frame:
            self._frame_depth = found[1]
            return True
        self._walked = found  # for ``_note_call`` in the segment this call begins
        return False

    def _note_call(self, module: int, obj: torch.nn.Module) -> None:
        """The first eval call of ``obj`` in this segment: if a method of ``obj`` itself
        made it, later calls from the same method call join this eval batch."""
        found, self._walked = self._walked or _caller(obj), None
        if found[0] is not None:
            self._frame, self._frame_depth = found
            self._frame_module = module

    def begin(self) -> None:
        """Start the next segment (after the recorder has ended the previous one)."""
        self.segment += 1
        self._roots.clear()
        self._train_roots.clear()
        self._eval_roots.clear()
        self._stepped.clear()
        self._models.clear()
        self._excused_for = -1
        self.saw_backward = False
        self._trained = False
        self.optimizer_steps = 0

    def root_ran(self, module: int, obj: torch.nn.Module) -> None:
        """A root call of ``obj`` (``module``: its id) that counts as ``kind`` runs in the
        current segment."""
        kind = self.kind
        if kind == RootKind.AUX:
            (self._closers if self._roots else self._openers).add(module)
            return
        if self._found:
            self._models[module] = obj
        if kind == RootKind.SAMPLE:
            return
        if kind == RootKind.TRAIN:
            self._trained = True
            self._train_roots.add(module)
        else:
            if self._frame is None and module not in self._roots and not self.is_training:
                self._note_call(module, obj)
            self._eval_roots.add(module)
        self._roots.add(module)

    def end(self, cut: bool = False, interrupted: bool = False) -> bool:
        """End the current segment; True if it was a training step. ``cut``: the run
        stopped in the middle of it (an exception, --on-nan stop): a training forward
        made it a training step even though its backward never came. ``interrupted``:
        hookdbg raised into the script there (--on-nan raise or stop), which may go on:
        likewise, once the run is known to train (an optimizer, or a backward so far;
        before that a forward with gradients on is an inference batch, rule 6)."""
        self._frame = None  # it may hold a generation's tensors
        self._frame_module = -1
        trains = self._optimized or self._any_backward
        training = (
            self.saw_backward
            or bool(self._stepped)
            or ((cut or (interrupted and trains)) and self._trained)
        )
        if training:
            self._eval_since_training = 0
            self._step_evals |= self._eval_roots
            # a backward without the optimizer step its iteration waits for is part of a
            # step that goes on after an interruption (validation during accumulation):
            # the next segment keeps its number
            if self._stepped or not self._optimized or cut:
                self.step += 1
            if self._stepped and self._found:  # found, not part of the iteration
                for key in self._unconcerned():
                    self._found.pop(key, None)
        elif self._roots:
            self.evals += 1
            self._eval_since_training += 1
            self._last_eval = frozenset(self._roots)
        return training

    def iteration_done(self) -> bool:
        """Whether the current segment did what an iteration does: every optimizer of
        the cycle stepped (with none known, a backward ran)."""
        if self._stepped:
            return self._cycle.keys() <= self._stepped
        return not self._optimized and self.saw_backward

    @called_from_c
    def backward_ran(self) -> None:
        self.saw_backward = self._any_backward = True

    def optimizer_begin(self) -> None:
        self._in_optimizer += 1

    def optimizer_end(
        self, opt: torch.optim.Optimizer, inner: list[torch.optim.Optimizer] | None = None
    ) -> None:
        """``opt`` stepped, stepping the ``inner`` ones inside (a container of
        optimizers): those found in the script's variables are awaited no more."""
        self._in_optimizer = max(0, self._in_optimizer - 1)
        self.optimizer_calls += 1
        self._stepped_once(opt)
        for stepped in inner or ():
            self._found.pop(id(stepped), None)
        self.optimizer_steps += 1

    def optimizer_skipped(self, opt: torch.optim.Optimizer) -> None:
        """AMP's GradScaler skipped ``opt``'s step (its gradients overflowed): the
        iteration still ends there."""
        self._stepped_once(opt)

    def _learn(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """Optimizers found in the script's variables: awaited until seen stepping."""
        for opt in optimizers:
            if id(opt) not in self._cycle:
                self._found.setdefault(id(opt), _ref(opt))
        self._optimized = self._optimized or bool(optimizers)
        self._excused_for = -1

    def _stepped_once(self, opt: torch.optim.Optimizer) -> None:
        if not self._searched:  # it may have been created after the first forward
            self._searched = True
            self._learn(_find_optimizers())
        key = id(opt)
        cycle = self._cycle
        self._found.pop(key, None)
        if key in self._stepped:
            if self._found or not cycle.keys() <= self._stepped:
                # it stepped twice in one step: an optimizer awaited does not step every
                # iteration (or not at all); only those seen stepping count now
                self._cycle = {k: r for k, r in cycle.items() if k in self._stepped}
                self._found.clear()
        elif key not in cycle:
            if self._stepped:  # a second optimizer of the iteration
                self._cycle = {k: r for k, r in cycle.items() if r() is not None}
            else:  # it takes over: a replacement, the next layer's own optimizer
                self._cycle = {}
            self._cycle[key] = _ref(opt)
        self._optimized = True
        self._stepped.add(key)


def _ref(opt: torch.optim.Optimizer) -> Callable[[], object]:
    """A weak reference to ``opt`` where it allows one (a dead optimizer leaves the cycle)."""
    try:
        return weakref.ref(opt)
    except TypeError:
        return lambda: opt


def _holds(opt: object, models: list[torch.nn.Module]) -> bool:
    """Whether optimizer ``opt`` (None: garbage) holds a parameter of one of ``models``."""
    if not isinstance(opt, torch.optim.Optimizer):
        return False
    held = {id(p) for group in opt.param_groups for p in group["params"]}
    return any(id(p) in held for model in models for p in model.parameters())


_INTERNAL: dict[types.CodeType, bool] = {}  # code: whether it is torch's or hookdbg's


def _caller(obj: torch.nn.Module) -> tuple[types.FrameType | None, int]:
    """The frame that called a root module, if it runs a method of ``obj`` itself, and
    its depth counted from the frame that called ``_caller``: ``_frame_at`` called from
    a frame at the same depth (``StepTracker._same_call`` and ``_note_call``, both called
    from segments.py's ``root_call``) finds it there again."""
    frame: types.FrameType | None = sys._getframe(1)
    depth = 0
    while frame is not None:
        code = frame.f_code
        internal = _INTERNAL.get(code)
        if internal is None:
            path = os.path.abspath(code.co_filename)
            internal = _INTERNAL[code] = path.startswith((_TORCH_DIR, _HOOKDBG_DIR))
        if not internal:
            break
        frame = frame.f_back
        depth += 1
    if frame is None:
        return None, 0
    code = frame.f_code
    if code.co_argcount and code.co_varnames[0] == "self" and frame.f_locals.get("self") is obj:
        return frame, depth
    return None, 0


def _frame_at(depth: int) -> types.FrameType | None:
    """The frame ``depth`` above the frame that called ``_frame_at``."""
    try:
        return sys._getframe(depth + 1)
    except ValueError:
        return None


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
