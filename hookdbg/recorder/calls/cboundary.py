"""The names hookdbg/recorder/_hot.c looks up on Python objects, declared in one place.

The C path hands what is rare (a module seen for the first time, the start of a segment,
a NaN/inf check, a capture) to Python methods it calls by name, and reads hookdbg's
``__slots__`` classes and torch's tensors by attribute name. Nothing in Python would
say so: renaming ``ModuleHooks._root`` would break only the C path, and only at the
first root call. So every such name is listed here (``BOUNDARY``: name, owner, why),
the Python methods among them carry ``@called_from_c`` where they are defined,
``missing()`` is asked before a recording takes the C path (accelerated.py: it
records with the Python path instead, and says why), and tests/recorder/test_cboundary.py
holds this list to the names _hot.c interns and looks up, both ways.

Owners are written ``module:Qualname``; ``AUTOGRAD_NODE`` stands for the class of the
node autograd makes for a tensor (``grad_fn``), which no module names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

AUTOGRAD_NODE = "autograd node"


@dataclass(frozen=True)
class Name:
    """One name _hot.c uses on an object of ``owner``: a method it calls, or an
    attribute it reads or sets. ``required``: without it the C path cannot run (else
    C has a way around it)."""

    name: str
    owner: str
    why: str
    required: bool = True


_MODULEHOOKS = "hookdbg.recorder.hooks.modulehooks:ModuleHooks"
_OBSERVER = "hookdbg.recorder.hooks.observe:TensorObserver"
_FAST_OBSERVER = "hookdbg.recorder.accelerated:FastTensorObserver"
_GRADIENTS = "hookdbg.recorder.hooks.gradients:GradientObserver"
_INFO = "hookdbg.recorder.calls.naming:ModuleInfo"
_STATE = "hookdbg.recorder.calls.calls:StepState"
_HANDOFF = "hookdbg.recorder.calls.handoff:Handoff"
_FLIGHT = "hookdbg.recorder.alerts.capture:FlightRecorder"
_TENSOR = "torch:Tensor"

BOUNDARY: tuple[Name, ...] = (
    # Python methods the C path leaves the rare cases to
    Name("_root", _MODULEHOOKS, "a call with no module call around it: new segment?"),
    Name("_leave_other", _MODULEHOOKS, "the end of a call not recorded (muted, run again)"),
    Name("_root_ended", _MODULEHOOKS, "a top-level call's end: the sentinel's outputs"),
    Name("_recompute_inner", _MODULEHOOKS, "a call inside a forward run again in backward"),
    Name("_elsewhere", _MODULEHOOKS, "a module call on a thread that does not record"),
    Name("lookup", "hookdbg.recorder.calls.naming:ModuleRegistry", "a module seen the first time"),
    Name("_py_summarise", _FAST_OBSERVER, "statistics that wait for a device"),
    Name("_check_input", _OBSERVER, "a NaN/inf input, or checks that wait for the device"),
    Name("_check_output", _OBSERVER, "a NaN/inf output, or checks that wait for the device"),
    Name("check", _OBSERVER, "a check queued to replay with the step's device statistics"),
    Name("taint_parent", _OBSERVER, "the queued check that taints a call's parent"),
    Name("shard", _OBSERVER, "a tensor of a subclass: where a DTensor's shard lies"),
    Name("capture", _OBSERVER, "--capture copies a tensor"),
    Name("keep", _FLIGHT, "the flight recorder holds a tensor"),
    Name("backward_ran", "hookdbg.recorder.steps.steps:StepTracker", "a gradient: backward ran"),
    Name("_check_grad", _GRADIENTS, "a NaN/inf tensor gradient, or deferred checks"),
    Name("_check_param_grad", _GRADIENTS, "a NaN/inf parameter gradient, or deferred"),
    Name("_enclosing_calls", _GRADIENTS, "a parameter whose module was not called"),
    Name("broken", "hookdbg.recorder._hot:Guard", "an exception in a hook stops the recording"),
    # hookdbg's attributes, read by offset in __slots__ (SlotRef) or by getattr
    Name("ref", _INFO, "the module, to tell a recycled id(module) apart"),
    Name("transparent", _INFO, "a container whose calls are not recorded"),
    Name("selected", _INFO, "--modules chose it"),
    Name("id", _INFO, "the module's id in rows"),
    Name("capture", _INFO, "--capture chose it"),
    Name("memo", _STATE, "the segment's tensors seen, by id"),
    Name("seg", _STATE, "the segment (Segment)"),
    Name("grad_finite", _STATE, "parameter gradients found finite"),
    Name("step", _STATE, "the step number rows carry"),
    Name("id", _STATE, "the segment number rows carry"),
    Name("recording", _STATE, "--every/--steps chose the segment"),
    Name("batch", _STATE, "the step's device statistics (StepBatch), or None"),
    Name("calls", _STATE, "the segment's calls, in order"),
    Name("module_calls", _STATE, "each module's calls in the segment"),
    Name(
        "rows",
        "hookdbg.recorder.summaries.deferred:StepBatch",
        "rows waiting for device statistics",
    ),
    Name("calls", "hookdbg.store.rows:Rows", "the calls table's RowBuffer"),
    Name("tensors", "hookdbg.store.rows:Rows", "the tensors table's RowBuffer"),
    Name("last", _HANDOFF, "when rows last went to the writer"),
    Name("every", _HANDOFF, "how often rows go to the writer"),
    Name("held", _FLIGHT, "bytes held"),
    Name("budget", _FLIGHT, "bytes it may hold"),
    Name("_entries", _FLIGHT, "this step's entries"),
    Name("_sizes", _FLIGHT, "this step's tensors' bytes, by id"),
    # torch's
    Name("is_inference", _TENSOR, "an inference tensor has no version"),
    Name("_version", _TENSOR, "a tensor changed in place is seen again"),
    Name("_base", _TENSOR, "a view of a tensor seen shares its statistics"),
    Name("requires_grad", _TENSOR, "its gradient is hooked"),
    Name("numel", _TENSOR, "a view's element count, against its base's"),
    Name("dtype", _TENSOR, "statistics by dtype"),
    Name("grad_fn", _TENSOR, "the node its gradient hook goes on"),
    Name("output_nr", _TENSOR, "which of its node's outputs it is"),
    Name("register_hook", _TENSOR, "a leaf's gradient hook"),
    Name("shape", _TENSOR, "its shape, in rows"),
    Name("is_cpu", _TENSOR, "summarised now (CPU) or with the step's device batch"),
    Name("is_contiguous", _TENSOR, "one C pass over its memory"),
    Name("data_ptr", _TENSOR, "that memory"),
    Name("layout", _TENSOR, "sparse and nested tensors are not summarised or held"),
    Name("nbytes", _TENSOR, "the flight recorder's budget"),
    Name("grad", _TENSOR, "a parameter's gradient after accumulation"),
    Name("_backward_hooks", _TENSOR, "its gradient hook, where autograd calls it in C"),
    Name("_register_hook_dict", AUTOGRAD_NODE, "those hooks, told to the node"),
    Name("register_prehook", AUTOGRAD_NODE, "a gradient hook on the node"),
    Name("Parameter", "torch.nn.parameter", "a parameter's hook is told apart"),
    Name(
        "ParametrizationList",
        "torch.nn.utils.parametrize",
        "a parametrized weight read outside any call is no call of the model's",
    ),
    Name("__dict__", "torch.compiler", "where _is_compiling_flag is read"),
    Name("is_compiling", "torch.compiler", "whether torch compiles (hooks then do nothing)"),
    Name("_is_compiling_flag", "torch.compiler", "the same, read without a call", False),
    # the standard library's, for an internal error's message
    Name("write", "sys:stderr", "the message that the recording stopped"),
    Name("print_exc", "traceback", "and its traceback"),
)

# "module:Qualname" of each function marked @called_from_c
MARKED: set[str] = set()


def called_from_c(fn: F) -> F:
    """Mark a method that _hot.c calls by name (see ``BOUNDARY``): renaming it, or
    changing what it takes, changes the C path too. Returns ``fn`` itself."""
    # compiled by mypyc, a method is a descriptor without the names: it is marked by none
    MARKED.add(f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', '?')}")
    return fn


def resolve(owner: str) -> object:
    """The object an owner names: a module, or ``module:Qualname`` inside one."""
    if owner == AUTOGRAD_NODE:
        import torch

        with torch.inference_mode(False), torch.enable_grad():
            node = (torch.ones(1, requires_grad=True) * 1).grad_fn
        return type(node)
    module, _, qualname = owner.partition(":")
    found: object = importlib.import_module(module)
    for part in qualname.split(".") if qualname else ():
        found = getattr(found, part)
    return found


def has(obj: object, name: str) -> bool:
    """Whether ``obj`` has ``name``: as an attribute, or, for a class, as one its
    ``__init__`` sets (``self.name = ...``) where it has no ``__slots__``."""
    if hasattr(obj, name):
        return True
    init = getattr(obj, "__init__", None) if isinstance(obj, type) else None
    code = getattr(init, "__code__", None)
    return code is not None and name in code.co_names


def missing() -> list[str]:
    """The required names no owner has (``Owner.name``), empty when the C path can run."""
    gone = []
    for entry in BOUNDARY:
        if not entry.required:
            continue
        try:
            owner = resolve(entry.owner)
        except (ImportError, AttributeError):
            gone.append(f"{entry.owner} (for .{entry.name})")
            continue
        if not has(owner, entry.name):
            gone.append(f"{entry.owner}.{entry.name}")
    return gone
