"""What the user's code calls a model: the variables of the calling frames.

A root module is labelled with the variable that holds it where the script called it
(``model``, ``netD``, ``criterion``) and a submodule called on its own is named from the
model that holds it (recorder/calls/naming.py). Both answers come from here: the locals of the
user's frames (not torch's, not hookdbg's; the script's own before installed
libraries'), one attribute down (``self.model``), and ``__main__``'s globals.

This runs once per module or optimizer, when it is first seen, never per call.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types

import torch

# the frames of hookdbg's code and of torch's, by their files' start
HOOKDBG_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def find_label(*objs: object) -> str | None:
    """The variable that holds one of ``objs`` in the code that called it, if one is
    easy to see (with several, the first one a namespace binds wins).

    Looks through the user's frames (not torch's, not hookdbg's; the script's own before
    installed libraries') for a local bound to it, or an attribute of a local
    (``self.model``), and ``__main__``'s globals.
    """
    for space in _user_namespaces():
        found = _label_in(space, objs)
        if found:
            return found
    return None


_NOT_HOLDERS = (torch.nn.Module, type, types.ModuleType, types.FunctionType)


def _user_namespaces() -> list[dict[str, object]]:
    """Locals of the user's frames (not torch's, not hookdbg's), innermost first, then
    ``__main__``'s globals. The script's own code comes before installed libraries'
    (a Lightning or Hugging Face trainer loop calls the model ``pl_module`` or
    ``model``; the script calls it what the user does)."""
    own: list[dict[str, object]] = []
    libraries: list[dict[str, object]] = []
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and len(own) + len(libraries) < 16:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith((HOOKDBG_DIR, TORCH_DIR)) and "<frozen" not in filename:
            installed = any(part in filename for part in _INSTALLED)
            (libraries if installed else own).append(frame.f_locals)
        frame = frame.f_back
    main = sys.modules.get("__main__")
    globals_ = [vars(main)] if main is not None else []
    return [*own[:8], *globals_, *libraries[:8]]


_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


def user_modules() -> list[torch.nn.Module]:
    """The modules held by variables of the calling user code and ``__main__``."""
    found: dict[int, torch.nn.Module] = {}
    for space in _user_namespaces():
        for value in list(space.values()):
            if isinstance(value, torch.nn.Module):
                found[id(value)] = value
    return list(found.values())


def find_owner(module: torch.nn.Module) -> torch.nn.Module | None:
    """The largest model in the user's variables (or one attribute down: ``self.model``)
    that holds ``module`` as a submodule, if any."""
    best, best_size = None, 0
    for space in _user_namespaces():
        for value in list(space.values()):
            candidates = [value]
            if not isinstance(value, _NOT_HOLDERS) and hasattr(value, "__dict__"):
                with contextlib.suppress(TypeError):
                    candidates.extend(vars(value).values())
            for candidate in candidates:
                if not isinstance(candidate, torch.nn.Module) or candidate is module:
                    continue
                subs = list(candidate.modules())
                if len(subs) > best_size and any(m is module for m in subs):
                    best, best_size = candidate, len(subs)
    return best


def _label_in(namespace: dict[str, object], targets: tuple[object, ...]) -> str | None:
    """A name bound to one of ``targets`` in ``namespace`` (earlier targets first), else
    an attribute of a value there: ``model`` before ``trainer.model_wrapped``."""
    holders = []
    bound: dict[int, str] = {}
    for name, value in list(namespace.items()):
        if name.isidentifier() and name not in ("self", "_"):
            bound.setdefault(id(value), name)
        if not isinstance(value, _NOT_HOLDERS) and hasattr(value, "__dict__"):
            holders.append(value)
    for target in targets:
        if id(target) in bound:
            return bound[id(target)]
    for target in targets:
        for holder in holders:
            try:
                attrs = vars(holder)
            except TypeError:
                continue
            for name, attr in attrs.items():
                if attr is target and name.isidentifier() and not name.startswith("_"):
                    return name
    return None
