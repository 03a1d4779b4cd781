"""The operation and the source line where a NaN/inf was born, inside the origin module.

The module-level checks (nonfinite.py) name the module; naming the op costs a Python call
per torch operation, so hookdbg pays it only once an origin is known, in one of two ways:

* **re-run**: a forward origin is run again at once, inside its forward hook, on copies
  of the inputs it was given and of its buffers, under the op-level check below; the
  random generators and what the run changed of its modules' attributes are put back
  afterwards: the script computes what it would have. Only
  where that is safe: the module's inputs at hand (not when checks wait for the device),
  plain tensors and values among them (a cache object would be changed twice), no hook
  of the script's own in it (it would run twice) and one process (a collective run on
  one rank alone would hang).
* **watch**: otherwise (a backward origin, a loss, a forward one that could not run again
  or did not go non-finite when it did), the check stays on for the next ``WATCH_STEPS``
  steps, forward and backward, with torch's anomaly mode keeping each autograd node's
  forward line, and names the op when the alert's place goes non-finite again.

The check (``OpCheck``) is a ``TorchDispatchMode`` that runs every op as it is, so each
result is the op's own, and follows non-finite values: an op whose output holds NaN
while no input did gave birth to a NaN; one whose output holds an inf while its inputs
were finite gave birth to an inf; any other passes on the birth its inputs carried (a
NaN made from an inf remembers that inf: "aten::div (inf) ..., then NaN by aten::mul").
The alert's own tensor then says which birth it holds. Ops hookdbg runs inside its hooks
(its statistics) are left out: the guard's lock is held then.
"""

from __future__ import annotations

import contextlib
import json
import linecache
import os
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from hookdbg.ranks import initialized_process_group
from hookdbg.recorder.alerts.alert import Alert
from hookdbg.recorder.calls.labels import HOOKDBG_DIR, TORCH_DIR
from hookdbg.recorder.calls.tensors import iter_args, iter_tensors
from hookdbg.recorder.summaries.stats import local
from hookdbg.store.schema import MESSAGE_BYTES, Phase, Slot

WATCH_STEPS = 3  # the steps a watch stays on for, after the step it was armed in
_CAME_IN = object()  # a non-finite value from before the check began (the data, a weight)


@dataclass(frozen=True)
class Birth:
    """One op that made a non-finite value from finite ones."""

    op: str  # "aten::div"
    kind: str  # "NaN" or "inf"
    node: str | None  # the autograd node it ran in, in a backward pass ("SqrtBackward0")
    where: str | None  # the source line it ran from ("model.py:95"); for a backward op,
    code: str | None  # the forward line that made its node; ``code``: that line's text
    cause: Birth | None = None  # the inf a NaN was made from

    def text(self) -> str:
        """'aten::div in SqrtBackward0 (inf) from model.py:95 `y = ...`, then NaN by
        aten::mul'."""
        if self.cause is None:
            return self._part()
        then = f"then NaN by {self.op}"
        if self.node and self.node != self.cause.node:
            then += f" in {self.node}"
        if self.where is not None and self.where != self.cause.where:
            then += f" from {self.where}"
        return f"{self.cause._part()}, {then}"

    def _part(self) -> str:
        node = f" in {self.node}" if self.node else ""
        line = f" from {self.where}" if self.where else ""
        code = f" `{self.code}`" if self.code else ""
        return f"{self.op}{node} ({self.kind}){line}{code}"

    def fields(self) -> dict[str, object]:
        """As ``hookdbg alerts --json`` and the recording's info row give it."""
        out: dict[str, object] = {
            "op": self.op,
            "kind": self.kind,
            "node": self.node,
            "where": self.where,
            "code": self.code,
        }
        if self.cause is not None:
            out["from"] = self.cause.fields()
        return out


class OpCheck(TorchDispatchMode):
    """Runs every op unchanged and notes where non-finite values are born (module doc).
    ``ours``: whether hookdbg's own code is running (its ops are not the model's);
    ``stop``: the code of the frame a re-run started in (the source line is looked for
    below it, not in the script that called the module)."""

    def __init__(self, ours: Callable[[], bool], stop: types.CodeType | None = None) -> None:
        super().__init__()
        self.ours = ours
        self.stop = stop
        self.carried: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor -> Birth | _CAME_IN
        self.births: list[Birth] = []  # the first few, in the order they happened
        self.failure: str | None = None  # why it stopped looking (a bug in hookdbg)

    def __torch_dispatch__(
        self, func: object, types: object, args: tuple = (), kwargs: dict | None = None
    ) -> object:
        out = func(*args, **(kwargs or {}))  # type: ignore[operator]
        if self.ours():
            return out
        try:
            bad = [t for t in _floating(out) if _finite(t) is False]
            if bad:
                self._follow(func, args, kwargs or {}, bad)
        except Exception as exc:  # a bug in hookdbg: the op's result goes on untouched
            self.failure = f"{type(exc).__name__}: {exc}"
            self.ours = _always  # and the check looks at nothing more
        return out

    def _follow(self, func: object, args: tuple, kwargs: dict, bad: list[torch.Tensor]) -> None:
        nan_out = any(_has_nan(t) for t in bad)
        nan_in: object = None  # the birth an input's NaN carries (or _CAME_IN)
        inf_in: object = None
        for t in _floating((args, kwargs)):
            finite = _finite(t)
            if finite:
                continue
            if finite is None:  # not read: what it holds may have come from anywhere
                nan_in = nan_in or _CAME_IN
                continue
            carried = self._carried(t)
            if _has_nan(t):
                nan_in = nan_in or carried
            else:
                inf_in = inf_in or carried
        if nan_out and nan_in is None:
            cause = inf_in if isinstance(inf_in, Birth) else None
            birth: object = self._birth(func, "NaN", cause)
        elif nan_out:
            birth = nan_in
        elif nan_in is None and inf_in is None:
            birth = self._birth(func, "inf", None)
        else:
            birth = inf_in or nan_in
        for t in bad:
            self.carried[t] = birth

    def _birth(self, func: object, kind: str, cause: Birth | None) -> Birth:
        node = torch._C._current_autograd_node()
        if node is not None:
            where, code = _forward_line(node)
            name: str | None = node.name()
        else:
            where, code = self._line()
            name = None
        schema = getattr(func, "_schema", None)
        op = schema.name if schema is not None else str(func)
        birth = Birth(op, kind, name, where, code, cause)
        if len(self.births) < 64:
            self.births.append(birth)
        return birth

    def _line(self) -> tuple[str | None, str | None]:
        """The innermost frame of the model's code that ran the op: the first outside
        torch and hookdbg, unless a module call lies between (the op ran in the forward
        of a torch module, an ``nn.Linear``: then that forward's line); looked for up to
        the frame a re-run started in."""
        frame: types.FrameType | None = sys._getframe(4)
        nn_frame = None
        while frame is not None and frame.f_code is not self.stop:
            code = frame.f_code
            if code is _CALL_IMPL:
                break
            filename = code.co_filename
            if not filename.startswith((TORCH_DIR, HOOKDBG_DIR)) and "<frozen" not in filename:
                return _place(filename, frame.f_lineno)
            if nn_frame is None and filename.startswith(_NN_DIR):
                nn_frame = frame
            frame = frame.f_back
        if nn_frame is None:
            return None, None
        return _place(nn_frame.f_code.co_filename, nn_frame.f_lineno)

    def _carried(self, t: torch.Tensor) -> object:
        """The birth ``t``'s values carry (a DTensor's, or its shard's), else _CAME_IN."""
        found = self.carried.get(t)
        if found is None and type(t) not in _PLAIN:
            found = self.carried.get(local(t))
        return _CAME_IN if found is None else found

    def birth_of(self, t: torch.Tensor) -> Birth | None:
        """The birth the non-finite values of ``t`` carry, if it was made while checking."""
        carried = self._carried(t)
        return carried if isinstance(carried, Birth) else None


_NN_DIR = os.path.join(TORCH_DIR, "nn") + os.sep
_CALL_IMPL = torch.nn.Module._call_impl.__code__


def _finite(t: torch.Tensor) -> bool | None:
    """Whether ``t`` holds only finite values, on this rank: a DTensor's own shard (read
    whole, it would run a collective on this rank alone, which would hang); None for a
    tensor of another subclass (a collective's result not waited for, a fake tensor),
    which is not read."""
    v = local(t)
    if type(v) not in _PLAIN:
        return None
    return bool(torch.isfinite(v).all())


def _has_nan(t: torch.Tensor) -> bool:
    v = local(t)
    return type(v) in _PLAIN and bool(torch.isnan(v).any())


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _floating(value: object) -> Iterator[torch.Tensor]:
    """The floating tensors in an op's output or arguments (nested in lists, dicts)."""
    for _, t in iter_tensors(value):
        if (
            t.is_floating_point()
            and t.layout == torch.strided
            and t.device.type != "meta"
            and t.numel()
        ):
            yield t


def _place(filename: str, line: int) -> tuple[str, str | None]:
    """'model.py:95' (relative to the working directory where under it; torch's own
    files from ``torch/``) and the line's text."""
    if filename.startswith(TORCH_DIR):
        shown = os.path.join("torch", filename[len(TORCH_DIR) :])
    else:
        try:
            rel = os.path.relpath(filename)
        except ValueError:
            rel = filename
        shown = filename if rel.startswith("..") else rel
    code = linecache.getline(filename, line).strip() or None
    return f"{shown}:{line}", code


def _forward_line(node: object) -> tuple[str | None, str | None]:
    """The forward line that made a backward op's autograd node, from the stack anomaly
    mode kept in its metadata (the innermost frame outside torch and hookdbg)."""
    try:
        stack = node.metadata.get("traceback_")  # type: ignore[attr-defined]
    except Exception:
        stack = None
    if not stack:
        return None, None
    for entry in reversed(stack):
        head = entry.strip().split("\n", 1)[0]  # File "/x/model.py", line 95, in forward
        if not head.startswith('File "'):
            continue
        filename, _, rest = head[6:].partition('", line ')
        if filename.startswith((TORCH_DIR, HOOKDBG_DIR)) or "<frozen" in filename:
            continue
        number = rest.split(",", 1)[0]
        if number.isdigit():
            return _place(filename, int(number))
    return None, None


# -- re-run at once -------------------------------------------------------------------------

_VALUES = (bool, int, float, str, torch.dtype, torch.device, type(None))


def _copies(value: object) -> object:
    """Copies of the tensors in ``value`` (a re-run must not change the script's own, by
    an in-place op); None where something in it is neither a tensor nor a plain value (a
    cache object, which a re-run would change)."""
    if isinstance(value, torch.Tensor):
        if type(value) not in _PLAIN:
            return None  # a subclass (a DTensor) may run collectives
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, _VALUES):
        return value
    if isinstance(value, (tuple, list)) and type(value) in (tuple, list):
        items = [_copies(v) for v in value]
        if any(c is None and v is not None for c, v in zip(items, value, strict=True)):
            return None
        return type(value)(items)
    if type(value) is dict:
        out = {k: _copies(v) for k, v in value.items()}
        if any(out[k] is None and v is not None for k, v in value.items()):
            return None
        return out
    return None


def _own_hooks(module: torch.nn.Module) -> bool:
    """Whether a submodule of ``module`` has hooks of its own (the script's, a
    library's): a re-run would run them again."""
    for sub in module.modules():
        if sub is module:
            continue
        if (
            sub._forward_hooks
            or sub._forward_pre_hooks
            or sub._backward_hooks
            or sub._backward_pre_hooks
        ):
            return True
    return False


def call_kwargs(module: object) -> dict | None:
    """The keyword arguments ``module`` was called with, from torch's ``_call_impl``
    frame around the forward hook that is running (None if it cannot be seen)."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_call_impl" and frame.f_locals.get("self") is module:
            kwargs = frame.f_locals.get("kwargs")
            return kwargs if isinstance(kwargs, dict) else None
        frame = frame.f_back
    return None


def why_not_rerun(module: object, own: object, args: object, distributed: bool) -> str | None:
    """Why a forward origin cannot run again at once, or None if it can. ``own``: the
    origin's module; ``module``, ``args``: the call the alert was found in (an inf is
    found where a later module passes it on)."""
    if not isinstance(module, torch.nn.Module) or module is not own:
        return "its inputs are gone: it was found where a later module passed it on"
    if not isinstance(args, tuple):
        return "its inputs were not kept (checks waited for the device)"
    if distributed:
        return "it runs on one of several ranks, and a collective run again on one would hang"
    if _own_hooks(module):
        return "its submodules have hooks of their own, which would run again"
    return None


def rerun(
    module: torch.nn.Module,
    args: tuple,
    kwargs: dict,
    path: str,
    ours: Callable[[], bool],
    paused: Callable[[], object],
) -> Birth | str:
    """Run ``module.forward`` again on copies of ``args``/``kwargs`` under ``OpCheck``,
    with hookdbg's hooks ``paused`` (a context manager) and the module's buffers and the
    random generators put back afterwards; the birth its output ``path`` carries, or why
    none was found."""
    a, kw = _copies(args), _copies(kwargs)
    if a is None or kw is None:
        return "an argument is an object a second run could change"
    for t in _floating((a, kw)):
        if _has_nan(t):  # an origin's inputs held none (infs they may)
            return "its inputs were changed in place since it ran"
    devices = sorted(
        {t.device.index or 0 for t in (*module.parameters(), *module.buffers()) if t.is_cuda}
    )
    check = OpCheck(ours, _RERUN_CODE)
    try:
        rng = torch.random.fork_rng(devices=devices, device_type="cuda")
        with _isolated(module), paused(), rng, check:  # type: ignore[attr-defined]
            out = _forward(module, a, kw)
    except Exception as exc:  # its forward cannot run twice as it stands
        return f"run again, it raised {type(exc).__name__}: {exc}"
    if check.failure is not None:
        return f"the op-level check failed: {check.failure}"
    for p, t in iter_tensors(out):
        if p == path:
            birth = check.birth_of(t)
            if birth is not None:
                return birth
            if not t.is_floating_point() or _finite(t) is not False:
                return "run again, it gave finite values: a random or non-deterministic op"
    if check.births:
        return check.births[0]
    return "run again, the op that made it was not seen"


_CONTAINERS = (list, dict, set)


@contextlib.contextmanager
def _isolated(module: torch.nn.Module) -> Iterator[None]:
    """What a second run of ``module`` may change of its modules' state, put back after
    it: the attributes it binds, the lists, dicts and sets it changes in place (a list
    of kept activations, a counter), in place again; and it runs on copies of their
    tensors that are not parameters, batch norm's running statistics among them (an
    in-place update of the real ones would move their version counters, which the
    first run's backward checks)."""
    kept = []
    for sub in module.modules():
        attrs = vars(sub)
        before = dict(attrs)
        contents = {
            k: v.copy() for k, v in before.items() if type(v) in _CONTAINERS
        }  # the hook and buffer dicts too
        kept.append((attrs, before, contents))
    try:
        for sub in module.modules():
            buffers = sub._buffers
            for name, b in list(buffers.items()):
                if b is not None:
                    buffers[name] = b.detach().clone()
            attrs = vars(sub)
            for k, v in list(attrs.items()):
                if type(v) is torch.Tensor:
                    attrs[k] = v.detach().clone()
        yield
    finally:
        for attrs, before, contents in kept:
            for k in [k for k in attrs if k not in before]:
                del attrs[k]
            for k, v in before.items():
                if attrs.get(k) is not v:
                    attrs[k] = v
            for k, saved in contents.items():
                _put_back(before[k], saved)


def _put_back(container: object, saved: object) -> None:
    """``container`` holds what ``saved`` (its copy) does again, compared by identity."""
    if isinstance(container, list) and isinstance(saved, list):
        if len(container) != len(saved) or any(
            a is not b for a, b in zip(container, saved, strict=True)
        ):
            container[:] = saved
    elif isinstance(container, dict) and isinstance(saved, dict):
        if container.keys() != saved.keys() or any(container[k] is not v for k, v in saved.items()):
            container.clear()
            container.update(saved)
    elif isinstance(container, set) and isinstance(saved, set) and container != saved:
        container.clear()
        container.update(saved)


def _forward(module: torch.nn.Module, args: object, kwargs: object) -> object:
    return module.forward(*args, **kwargs)  # type: ignore[arg-type, misc]


_RERUN_CODE = _forward.__code__


# -- the watch, and what an origin asks of both ---------------------------------------------


@dataclass
class _Sought:
    """An origin whose op the watch looks for: its place and what was said of it."""

    key: tuple
    label: str  # "the NaN at step 3 in model.norm (L2Norm) backward grad_input[0]"
    until: int  # the last step watched


class Pinpointer:
    """Finds the op of each new NaN/inf origin (module doc) and says it: in the alert's
    own words when a re-run finds it, else in a line and an info row (``op_origin``) when
    the watch sees it again, or that it did not."""

    INFO_KEY = "op_origin"
    FAILED_KEY = "op_check_failed"  # why the check stopped (a bug in hookdbg)

    def __init__(
        self,
        ours: Callable[[], bool],
        paused: Callable[[], object],
        say: Callable[[str], None],
        status: Callable[[str], None],
        note: Callable[[str, str], None],
    ) -> None:
        self.ours = ours
        self.paused = paused
        self.say = say  # a line on stderr, what was found
        self.status = status  # a status line, which --quiet hides
        self.note = note  # an info row (key, value)
        self.compiled = False  # a compiled model ran: no op-level check (a mode would
        # make torch.compile run its graphs differently)
        self.check: OpCheck | None = None  # the watch, while on
        self._anomaly: tuple[bool, bool] | None = None
        self.sought: list[_Sought] = []

    def origin(self, alert: Alert) -> None:
        """A new origin: run it again at once where it can, else watch for it. Not for
        a value no op of the script made: a weight already non-finite (changed outside
        any op hookdbg sees), one that came from another rank or in the data."""
        if alert.received or self.compiled or alert.slot in (Slot.PARAM, Slot.STEP_GRAD):
            return
        if alert.slot == Slot.INPUT and alert.origin is not None and alert.origin.parent is None:
            return  # the model's input: the data
        if self.check is not None:  # the watch is on: it saw this one born
            birth = self._birth_of(alert)
            if birth is not None:
                alert.note += f"; made by {birth.text()} (the op-level check was on)"
                self._row(alert, birth, "the op-level check was on")
                return
        why = None
        if alert.phase == Phase.FWD and alert.slot == Slot.OUTPUT:
            # the call it was found in, or, for an inf said where a later module passed
            # it on, the one it was born in
            context, alert.born = alert.born or alert.context, None
            module, args = context.get("module"), context.get("inputs")
            why = why_not_rerun(module, alert.module.ref(), args, _several_ranks())
            if why is None:
                assert isinstance(module, torch.nn.Module) and isinstance(args, tuple)
                given = context["kwargs"] if "kwargs" in context else call_kwargs(module)
                kwargs = given if isinstance(given, dict) else None
                if kwargs is None:
                    why = "its keyword arguments could not be seen"
                else:
                    found = rerun(module, args, kwargs, alert.path, self.ours, self.paused)
                    if isinstance(found, Birth):
                        alert.note += f"; made by {found.text()} (run again on its inputs)"
                        self._row(alert, found, "run again on its inputs")
                        return
                    why = found
        if alert.unchecked:  # seen, not born: the steps recorded after it look for that
            return
        self._watch(alert, why)

    def seen(self, alert: Alert) -> None:
        """An alert while the watch is on: does its tensor carry a birth it saw?"""
        if self.check is None or not self.sought:
            return
        birth = self._birth_of(alert)
        if birth is not None:
            self._found(alert, birth)

    @property
    def waiting(self) -> bool:
        """Asked for inside a backward pass, the watch begins at the next module call
        with none around it (what a backward pass sets up, it takes down)."""
        return self.check is None and bool(self.sought)

    def begin(self) -> None:
        if self.waiting and torch._C._current_graph_task_id() == -1:
            self._start()

    def new_segment(self, step: int) -> None:
        """A segment (a step, an eval batch) of step ``step`` begins: the watch ends for
        what it sought long enough."""
        if self.check is None:
            return
        if self.check.failure is not None:  # a bug in hookdbg: said, and the watch ends
            failure = f"op-level check failed, and is off: {self.check.failure}"
            self.say(failure)
            self.note(self.FAILED_KEY, failure)
            self.sought.clear()
            self.stop()
            return
        for sought in [s for s in self.sought if step > s.until]:
            self.sought.remove(sought)
            self._not_found(sought, f"in the {WATCH_STEPS} steps after it")
        if not self.sought:
            self.stop()

    def stop(self) -> None:
        """End the watch (at the recording's end, or once nothing is sought)."""
        for sought in self.sought:
            self._not_found(sought, "before the recording ended")
        self.sought.clear()
        check = self.check
        if check is None:
            return
        stack = torch._C._len_torch_dispatch_stack()
        if stack and torch._C._get_dispatch_stack_at(stack - 1) is not check:
            # the script's own mode is above it: taking it out would take that one;
            # from here on it passes every op on unlooked at
            check.ours = _always
        else:
            check.__exit__(None, None, None)
        self.check = None
        if self._anomaly is not None:
            torch.set_anomaly_enabled(*self._anomaly)
            self._anomaly = None

    def _not_found(self, sought: _Sought, when: str) -> None:
        """Said of an origin that did not come again at its place."""
        text = (
            f"op-level check: {sought.label} did not come again at its place {when}, so "
            "the op that made it is not known"
        )
        self.say(text)
        value = {"alert": list(sought.key), "found": False, "text": text.split(": ", 1)[1]}
        self.note(self.INFO_KEY, _fitted(value))

    def _watch(self, alert: Alert, why: str | None) -> None:
        label = f"the {alert.kind} {alert.segment.when} in {alert.where}"
        self.sought.append(_Sought(_key(alert), label, alert.step + WATCH_STEPS))
        reason = f" ({why})" if why else ""
        self.status(
            f"op-level check: on for the next {WATCH_STEPS} steps, to name the op that "
            f"makes {label} if it comes again{reason}"
        )
        self.begin()

    def _start(self) -> None:
        self._anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
        torch.set_anomaly_enabled(True, False)  # keeps each node's forward line
        self.check = OpCheck(self.ours)
        self.check.__enter__()

    def _birth_of(self, alert: Alert) -> Birth | None:
        """The birth the watch saw that the alert's own tensor carries."""
        check = self.check
        if check is None:
            return None
        for t in _alert_tensors(alert):
            birth = check.birth_of(t)
            if birth is not None:
                return birth
        return None

    def _found(self, alert: Alert, birth: Birth) -> None:
        """An alert at a sought place again, its value's birth seen."""
        place = (alert.module.id, int(alert.phase), int(alert.slot), alert.path)
        sought = next((s for s in self.sought if s.key[1:] == place), None)
        if sought is None:
            return
        self.sought.remove(sought)
        how = (
            f"seen again at step {alert.step}"
            if alert.step != sought.key[0]
            else f"seen again, still in step {alert.step}: no optimizer step came between"
        )
        self.say(f"op-level check: {sought.label} was made by {birth.text()} ({how})")
        self._row(alert, birth, how, sought.key)
        if not self.sought:
            self.stop()

    def _row(self, alert: Alert, birth: Birth, how: str, key: tuple | None = None) -> None:
        said = f"made by {birth.text()} ({how})"
        value = {"alert": list(key or _key(alert)), "found": True, "text": said, **birth.fields()}
        self.note(self.INFO_KEY, _fitted(value))


def _fitted(value: dict[str, object]) -> str:
    """``value`` as JSON in an info row's bytes: the words said first; where it would
    not fit, the fields that repeat them are dropped (source lines first)."""
    text = json.dumps(value)
    cause = value.get("from")
    for drop in ("code", "from.code", "from", "where"):
        if len(text.encode()) <= MESSAGE_BYTES:
            break
        if drop == "from.code" and isinstance(cause, dict):
            cause.pop("code", None)
        else:
            value.pop(drop, None)
        text = json.dumps(value)
    if len(text.encode()) > MESSAGE_BYTES:
        said = str(value["text"])
        value["text"] = said[: max(0, len(said) - (len(text.encode()) - MESSAGE_BYTES) - 8)] + "..."
        text = json.dumps(value)
    return text


def _always() -> bool:
    return True


def _several_ranks() -> bool:
    """Whether the script set up a process group of more than one rank."""
    group = initialized_process_group()
    return group is not None and group[1] > 1


def _key(alert: Alert) -> tuple:
    """An alert's place, as the ``alerts`` table has it: step, module, phase, slot, path."""
    return (alert.step, alert.module.id, int(alert.phase), int(alert.slot), alert.path)


def _alert_tensors(alert: Alert) -> Iterator[torch.Tensor]:
    """The tensors an alert's context holds of the value it is about."""
    context = alert.context
    grad = context.get("grad")
    if alert.phase == Phase.BWD and grad is not None:
        yield from (t for _, t in iter_tensors(grad))
        return
    if alert.slot == Slot.INPUT:
        args = context.get("inputs")
        places = iter_args(args) if isinstance(args, tuple) else iter(())
    else:
        value = context.get("output")
        if alert.slot == Slot.LOSS or isinstance(value, torch.Tensor):
            yield from (t for _, t in iter_tensors(value))
            return
        places = iter_tensors(value)
    for p, t in places:
        if p == alert.path:
            yield t
