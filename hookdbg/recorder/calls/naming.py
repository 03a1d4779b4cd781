"""Module names: what a user calls each module, found once per model, looked up per call.

A module called with no other module around it is a *root* (the model, the loss
module, each of a GAN's two networks). A root is labelled with the variable that holds
it in the calling code (``model``, ``netD``, ``criterion``), else its class name, and
every module inside it is named ``label.path`` with ``path`` from ``named_modules()``:
``model.layer3.0.conv1``. A submodule called on its own (``model.head(x)``,
``model.decode(z)`` calling ``self.fc3``) is named from the variable of the model that
holds it, whatever is called first (recorder/calls/labels.py finds those variables).
Wrappers are transparent: the wrapped model takes the wrapper's label, so
single-process, per-rank and compiled runs name modules alike (DDP, DataParallel, and
``torch.compile``'s OptimizedModule).

Parameters shared by two modules (tied embeddings: ``lm_head.weight is wte.weight``)
are counted once, for the module that was named first.

Lookup runs on every module call, so it is a dict hit on ``id(module)`` checked
against a weak reference (ids are reused after garbage collection); everything else
happens once, when a module is first seen.
"""

from __future__ import annotations

import inspect
import linecache
import os
import weakref
from collections.abc import Callable

import torch
from torch.nn.parameter import UninitializedParameter

from hookdbg.recorder.calls.cboundary import called_from_c
from hookdbg.recorder.calls.labels import find_label, find_owner
from hookdbg.store.schema import SOURCE_BYTES, ModuleKind

_SKIP_SEGMENTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})


class ModuleInfo:
    """One module (or optimizer) as hookdbg knows it."""

    __slots__ = (
        "capture",
        "depth",
        "file",
        "has_params",
        "id",
        "kind",
        "line",
        "n_params",
        "name",
        "parent",
        "path",
        "ref",
        "root",
        "selected",
        "transparent",
        "type",
    )

    def __init__(
        self,
        id: int,
        obj: object,
        name: str,
        path: str,
        parent: int,
        root: int,
        depth: int,
        kind: ModuleKind = ModuleKind.MODULE,
        n_params: int = 0,
    ) -> None:
        self.id = id
        self.name = name
        self.path = path
        self.type = type(compiled_model(obj) or obj).__name__
        self.file, self.line = source_of(compiled_model(obj) or obj)
        self.ref = weakref.ref(obj)
        self.parent = parent
        self.root = root
        self.depth = depth
        self.kind = kind
        self.selected = True
        self.transparent = False
        self.capture = False  # --capture stores its full tensors
        self.n_params = n_params  # own parameters' elements, shared ones counted once
        # with its submodules, it has parameters (hookdbg/recorder/steps/steps.py's "aux")
        self.has_params = (
            isinstance(obj, torch.nn.Module) and next(obj.parameters(), None) is not None
        )

    def row(self) -> tuple:
        return (
            self.id,
            self.name,
            self.type,
            self.parent,
            self.root,
            self.depth,
            int(self.kind),
            self.n_params,
            self.file,
            self.line,
        )

    def __repr__(self) -> str:
        return f"<ModuleInfo {self.id} {self.name} ({self.type})>"


_SOURCES: dict[type, tuple[str, int]] = {}  # class -> where its forward is


def source_of(obj: object) -> tuple[str, int]:
    """Where a module's class defines ``forward`` (absolute file name, first line), so
    that a reader can open it; ("", 0) where unknown: not a module, no forward of its
    own, code that has no file. Found once per class, and never raises: a class whose
    source cannot be found must not stop training."""
    cls = type(obj)
    found = _SOURCES.get(cls)
    if found is None:
        try:
            found = _forward_source(cls)
        except Exception:
            found = ("", 0)
        _SOURCES[cls] = found
    return found


def _forward_source(cls: type) -> tuple[str, int]:
    if not issubclass(cls, torch.nn.Module):
        return "", 0
    forward = inspect.unwrap(cls.forward)
    if forward is torch.nn.Module.forward:  # ModuleList, ModuleDict: never called
        return "", 0
    code = getattr(forward, "__code__", None)
    file = inspect.getsourcefile(forward) if code is not None else None
    if code is None or not file or file.startswith("<"):  # <string>: exec'd code
        return "", 0
    return recordable(file, _def_line(file, code.co_firstlineno))


def _def_line(file: str, first: int) -> int:
    """The line of the ``def`` itself: a decorated function's code starts at its first
    decorator (``@deprecate_kwarg(...)`` over a transformers ``forward``)."""
    if not linecache.getline(file, first).lstrip().startswith("@"):
        return first
    for line in range(first + 1, first + 50):
        text = linecache.getline(file, line).lstrip()
        if text.startswith(("def ", "async def ")):
            return line
    return first


def recordable(file: str, line: int) -> tuple[str, int]:
    """A source location as the modules table holds it: the file's absolute name, or
    ("", 0) if that does not fit (cut to fit, it would name another file)."""
    file = os.path.abspath(file)
    if len(file.encode("utf-8", "backslashreplace")) > SOURCE_BYTES:
        return "", 0
    return file, int(line)


def _is_wrapper(module: torch.nn.Module) -> bool:
    return _wrapped(module) is not None


def _wrapped(module: torch.nn.Module) -> torch.nn.Module | None:
    """The model inside a data-parallel wrapper, or None if ``module`` is not one."""
    if isinstance(module, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
        inner = getattr(module, "module", None)
        return inner if isinstance(inner, torch.nn.Module) else None
    return None


def compiled_model(module: object) -> torch.nn.Module | None:
    """The model inside torch.compile(model)'s OptimizedModule, or None if ``module`` is
    not one (checked by name: importing torch._dynamo to compare classes costs seconds).

    The OptimizedModule is the call hookdbg can see (its model's hooks run inside the
    compiled code), so it is recorded under the model's name and type, and the model
    itself becomes a transparent alias."""
    if type(module).__name__ != "OptimizedModule":
        return None
    inner = getattr(module, "_orig_mod", None)
    return inner if isinstance(inner, torch.nn.Module) else None


def _clean_path(path: str) -> str:
    return ".".join(p for p in path.split(".") if p not in _SKIP_SEGMENTS)


class ModuleRegistry:
    """Names and ids for every module and optimizer seen; ``on_new`` hears of each once."""

    def __init__(
        self, select: Callable[[str, str], bool], on_new: Callable[[ModuleInfo, object], None]
    ) -> None:
        self._select = select
        self._on_new = on_new
        self.by_id: dict[int, ModuleInfo] = {}
        self._labels: set[str] = set()
        self._unnamed: dict[tuple[int, str], int] = {}
        # (parent id or -1, class) -> the stateless modules discovered there, in order
        self._stateless: dict[tuple[int, str], list[ModuleInfo]] = {}
        self._counted: set[int] = set()  # ids of parameters already counted
        self.infos: list[ModuleInfo] = []

    @called_from_c
    def lookup(self, module: torch.nn.Module, parent: ModuleInfo | None) -> ModuleInfo:
        """The info of a module being called inside ``parent`` (None: a root call)."""
        info = self.by_id.get(id(module))
        if info is not None and info.ref() is module:
            return info
        return self._discover(module, parent)

    def optimizer(self, opt: torch.optim.Optimizer) -> ModuleInfo:
        """Optimizers get a row in the module table too, labelled like roots."""
        info = self.by_id.get(id(opt))
        if info is None or info.ref() is not opt:
            label = self._unique(find_label(opt) or type(opt).__name__)
            info = self._add(opt, label, "", -1, None, 0, ModuleKind.OPTIMIZER)
        return info

    def loss_site(
        self, site: object, name: str, where: str, source: tuple[str, int] = ("", 0)
    ) -> ModuleInfo:
        """A place in the script that starts backward passes (recorder/hooks/backward.py): a
        row in the module table named after the loss, its type where it is, its source
        that line (file, line)."""
        label = self._unique(name)
        return self._add(site, label, "", -1, None, 0, ModuleKind.LOSS, where, source)

    def reselect(self, select: Callable[[str, str], bool]) -> None:
        """Select modules anew (steering changed which are recorded): those seen so far
        and those found from now on."""
        self._select = select
        for info in self.infos:
            if info.kind == ModuleKind.MODULE:  # an optimizer's own parameters stay
                info.selected = select(info.name, info.path)

    def module_names(self) -> list[tuple[str, str]]:
        """(name, path) of every module seen so far, what --modules globs match."""
        return [(i.name, i.path) for i in self.infos if i.kind == ModuleKind.MODULE]

    def known(self, obj: object) -> ModuleInfo | None:
        info = self.by_id.get(id(obj))
        return info if info is not None and info.ref() is obj else None

    # -- discovery (rare) ------------------------------------------------------------

    def _discover(self, module: torch.nn.Module, parent: ModuleInfo | None) -> ModuleInfo:
        stateless = _stateless(module)
        place = (parent.id if parent is not None else -1, type(module).__qualname__)
        if stateless:
            for before in self._stateless.get(place, ()):
                if before.ref() is None:
                    # a module made anew for each call (a loss built inside forward, as
                    # Hugging Face models do): the same module as far as anyone can
                    # tell, named once, not once per step
                    before.ref = weakref.ref(module)
                    self.by_id[id(module)] = before
                    return before
        info = self._named(module, parent)
        if stateless:
            self._stateless.setdefault(place, []).append(info)
        return info

    def _named(self, module: torch.nn.Module, parent: ModuleInfo | None) -> ModuleInfo:
        if parent is None:
            self._add_root(module)
        else:
            root = self.infos[parent.root]
            root_module = root.ref()  # a module's root is a module, alive or not
            if isinstance(root_module, torch.nn.Module):  # modules added since we named it
                self._add_tree(root_module, root)
        info = self.known(module)
        if info is None:  # not reachable by named_modules(): e.g. held in a plain list
            assert parent is not None
            kind = type(module).__name__
            k = self._unnamed.get((parent.id, kind), 0)
            self._unnamed[(parent.id, kind)] = k + 1
            suffix = f"<{kind}>" if k == 0 else f"<{kind}#{k + 1}>"
            path = f"{parent.path}.{suffix}" if parent.path else suffix
            info = self._add(
                module,
                f"{parent.name}.{suffix}",
                path,
                parent.id,
                self.infos[parent.root],
                parent.depth + 1,
            )
            self._add_tree(module, info)
        return info

    def _add_root(self, module: torch.nn.Module) -> None:
        owner = find_owner(module)
        if owner is not None:  # name it from the model that holds it
            held_by = self.known(owner)
            if held_by is None:
                self._add_root(owner)
            else:  # added to that model after it was named
                self._add_tree(owner, held_by)
            if self.known(module) is not None:
                return
        wrappers = []
        target = module
        while (inner := _wrapped(target)) is not None:
            wrappers.append(target)
            target = inner
        known = self.known(target)
        # a wrapper made by a framework is held by the framework's variables
        # (Lightning's DDP: ``wrapper_module``), its model by the user's: the user's
        # name wins, for the wrapper or the model, wherever each is held
        found = find_label(module, target) if target is not module else find_label(module)
        label = known.name if known else self._unique(found or type(module).__name__)
        root = known or self._add(target, label, "", -1, None, 0)
        for wrapper in wrappers:
            self._add(wrapper, label, "", -1, root, 0, ModuleKind.WRAPPER).transparent = True
        self._add_tree(target, root)

    def _add_aliases(self, compiled: torch.nn.Module, info: ModuleInfo) -> torch.nn.Module:
        """The models inside a compiled wrapper (and any data-parallel wrapper in it) are
        transparent aliases of its info; returns the innermost model."""
        inner = compiled_model(compiled)
        assert inner is not None
        while True:
            if self.known(inner) is None:
                alias = self._add(
                    inner,
                    info.name,
                    info.path,
                    info.parent,
                    self.infos[info.root],
                    info.depth,
                    ModuleKind.WRAPPER,
                )
                alias.transparent = True
            nested = _wrapped(inner)
            if nested is None:
                return inner
            inner = nested

    def _add_tree(self, module: torch.nn.Module, top: ModuleInfo) -> None:
        """Name every not-yet-known module under ``module`` (whose info is ``top``)."""
        root = self.infos[top.root]
        if compiled_model(module) is not None:
            module = self._add_aliases(module, top)
        for sub_path, sub in module.named_modules():
            if not sub_path or self.known(sub) is not None:
                continue
            sub_path = _clean_path(sub_path)
            path = f"{top.path}.{sub_path}" if top.path else sub_path
            parent_path = path.rpartition(".")[0]
            parent = self._find_path(root, parent_path) or top
            kind = ModuleKind.WRAPPER if _is_wrapper(sub) else ModuleKind.MODULE
            info = self._add(
                sub, f"{root.name}.{path}", path, parent.id, root, path.count(".") + 1, kind
            )
            # a data-parallel wrapper inside a model passes its name to its model
            info.transparent = kind == ModuleKind.WRAPPER
            if compiled_model(sub) is not None:  # a compiled block: recorded as its model
                self._add_aliases(sub, info)

    def _find_path(self, root: ModuleInfo, path: str) -> ModuleInfo | None:
        if not path:
            return root
        for info in reversed(self.infos):
            if info.root == root.id and info.path == path and info.kind == ModuleKind.MODULE:
                return info
        return None

    def _add(
        self,
        obj: object,
        name: str,
        path: str,
        parent: int,
        root: ModuleInfo | None,
        depth: int,
        kind: ModuleKind = ModuleKind.MODULE,
        type_name: str = "",
        source: tuple[str, int] | None = None,
    ) -> ModuleInfo:
        info_id = len(self.infos)
        info = ModuleInfo(
            info_id,
            obj,
            name,
            path,
            parent,
            info_id if root is None else root.id,
            depth,
            kind,
            self._count_params(obj) if kind == ModuleKind.MODULE else 0,
        )
        info.selected = kind == ModuleKind.MODULE and self._select(name, path)
        if type_name:
            info.type = type_name
        if source is not None:
            info.file, info.line = source
        self.by_id[id(obj)] = info
        self.infos.append(info)
        self._on_new(info, obj)
        return info

    def _count_params(self, obj: object) -> int:
        if not isinstance(obj, torch.nn.Module):
            return 0
        total = 0
        for p in obj.parameters(recurse=False):
            if isinstance(p, UninitializedParameter):
                continue  # a lazy module's, before its first call: no size yet
            if id(p) not in self._counted:
                self._counted.add(id(p))
                total += p.numel()
        return total

    def _unique(self, label: str) -> str:
        candidate, k = label, 1
        while candidate in self._labels:
            k += 1
            candidate = f"{label}#{k}"
        self._labels.add(candidate)
        return candidate


def _stateless(module: torch.nn.Module) -> bool:
    """No parameters, buffers or submodules: nothing tells two such modules apart."""
    return not (module._parameters or module._modules) and all(
        b is None for b in module._buffers.values()
    )
