"""Finding the tensors in a module's inputs and outputs, with a name for each.

Names ("paths") say where a tensor sits: ``0`` is the first positional argument,
``mask`` a keyword argument, ``1.0`` the first item of the second output (an LSTM's
``h``), ``logits`` a field of a dataclass or namedtuple output. A lone tensor output
has the empty path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch

MAX_DEPTH = 4
_INDEX = tuple(str(i) for i in range(256))


def _key(i: int) -> str:
    return _INDEX[i] if i < 256 else str(i)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def iter_tensors(obj: object, path: str = "", depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a nested structure of tuples, lists, dicts, dataclasses and
    namedtuples, with its path. Stops at ``MAX_DEPTH`` levels of nesting."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
        return
    if depth >= MAX_DEPTH:
        return
    if isinstance(obj, (tuple, list)):
        fields = getattr(obj, "_fields", None)  # namedtuple
        for i, item in enumerate(obj):
            name = fields[i] if fields else _key(i)
            yield from iter_tensors(item, _join(path, name), depth + 1)
    elif isinstance(obj, dict):
        for key, item in obj.items():
            yield from iter_tensors(item, _join(path, str(key)), depth + 1)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from iter_tensors(getattr(obj, f.name, None), _join(path, f.name), depth + 1)


def iter_args(args: tuple) -> Iterator[tuple[str, torch.Tensor]]:
    """Positional arguments, the common all-tensor case without generator nesting."""
    for i, arg in enumerate(args):
        if isinstance(arg, torch.Tensor):
            yield _key(i), arg
        else:
            yield from iter_tensors(arg, _key(i), 1)
