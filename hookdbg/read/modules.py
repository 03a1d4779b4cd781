"""The module table of a recording: names, types and the model hierarchy."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from hookdbg.store.schema import ModuleKind
from hookdbg.text import utf8


@dataclass(frozen=True)
class Module:
    id: int
    name: str
    type: str
    parent: int
    root: int
    depth: int
    kind: int
    params: int
    file: str = ""  # where its class's forward is (a loss site: its backward call)
    line: int = 0

    @property
    def source(self) -> tuple[str, int] | None:
        """(file, line) of its class's forward, to open it in an editor; None where
        unknown (no forward of its own, code without a file, an older recording)."""
        return (self.file, self.line) if self.file and self.line > 0 else None

    @property
    def path(self) -> str:
        """The name inside its model, without the root's label: ``layer3.0.conv1``."""
        return self.name.partition(".")[2] if self.depth else ""

    @property
    def is_optimizer(self) -> bool:
        return self.kind == ModuleKind.OPTIMIZER

    @property
    def is_loss(self) -> bool:
        """A loss site: where the script calls backward() (its type is file:line)."""
        return self.kind == ModuleKind.LOSS

    @property
    def is_model_part(self) -> bool:
        """A module of the model (not an optimizer, not a DDP/DataParallel wrapper)."""
        return self.kind == ModuleKind.MODULE


class ModuleTable:
    def __init__(self, rows: np.ndarray, sources: bool = True) -> None:
        """``sources``: the rows say where each module's code is (schema version 7 on);
        an older recording's modules have none."""
        self.sources = sources
        # column by column: a row of a structured array is slow to take apart, and a
        # large model has 100,000 modules
        self._modules = [
            Module(*row)
            for row in zip(
                rows["id"].tolist(),
                map(utf8, rows["name"].tolist()),
                map(utf8, rows["type"].tolist()),
                rows["parent"].tolist(),
                rows["root"].tolist(),
                rows["depth"].tolist(),
                rows["kind"].tolist(),
                rows["params"].tolist(),
                map(utf8, rows["file"].tolist()),
                rows["line"].tolist(),
                strict=True,
            )
        ]
        self._by_id = {m.id: m for m in self._modules}
        self._by_name: dict[str, Module] = {}
        for m in self._modules:  # a wrapper shares its model's name: keep the model
            if m.is_model_part or m.name not in self._by_name:
                self._by_name[m.name] = m
        self._children: dict[int, list[Module]] = {}
        for m in self._modules:
            self._children.setdefault(m.parent, []).append(m)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules)

    def __getitem__(self, module_id: int) -> Module:
        """The module with this id; one a row names but the table lacks (a damaged
        file, or a live one whose tables are a flush apart) shows as ``<module N>``."""
        found = self._by_id.get(module_id)
        if found is None:
            return Module(module_id, f"<module {module_id}>", "?", -1, -1, 0, -1, 0)
        return found

    def get(self, module_id: int) -> Module | None:
        return self._by_id.get(module_id)

    def by_name(self, name: str) -> Module | None:
        """The module with exactly this name (to line up two recordings)."""
        return self._by_name.get(name)

    def name(self, module_id: int) -> str:
        m = self._by_id.get(module_id)
        return m.name if m else f"<module {module_id}>"

    def children(self, module_id: int) -> list[Module]:
        return self._children.get(module_id, [])

    def roots(self) -> list[Module]:
        return [m for m in self._modules if m.parent == -1 and m.is_model_part]

    def matching(self, pattern: str) -> list[Module]:
        """Modules whose full name or path matches a glob (``layer3.*`` or ``*.conv1``)."""
        return [
            m
            for m in self._modules
            if fnmatch.fnmatchcase(m.name, pattern)
            or (m.depth and fnmatch.fnmatchcase(m.path, pattern))
        ]

    def resolve(self, query: str) -> Module:
        """The one module meant by ``query``: an exact name, a path, or a unique glob.

        Raises LookupError with a message that suggests close names.
        """
        exact = self._by_name.get(query)
        if exact is not None:
            return exact
        found = {m.id: m for m in self.matching(query)}
        if len(found) == 1:
            return next(iter(found.values()))
        if len(found) > 1:
            names = ", ".join(m.name for m in list(found.values())[:4])
            more = f" and {len(found) - 4} more" if len(found) > 4 else ""
            raise LookupError(
                f"{query!r} matches {len(found)} modules ({names}{more}); be more specific"
            )
        close = [n for n in self._by_name if query.lower() in n.lower()][:3]
        if not close:  # compare with paths too: "head2" is close to "head", not "model.head"
            spelled = {m.path or m.name: m.name for m in self._modules} | {
                n: n for n in self._by_name
            }
            close = [spelled[k] for k in difflib.get_close_matches(query, list(spelled), 3, 0.6)]
            close = list(dict.fromkeys(close))
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise LookupError(f"no module {query!r} in this recording{hint}")
