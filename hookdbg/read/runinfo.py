"""The run's metadata (the file's attributes), each checked for type and range before
use: an attribute is input like any other (``schema_version`` can hold ``'abc'`` or an
array; ``options`` a JSON list; ``pid`` a number no process has).

Each is also bounded: a file can hold a 50 MB ``argv`` or ``host``, which a report would
take minutes to lay out. A text attribute keeps its first ``TEXT_LIMIT`` characters, and
the strings of a JSON one (``argv``, ``options``) as many together; an attribute stored
at a fixed size of more than ``READ_LIMIT`` bytes is not read at all (HDF5 reads an
attribute whole). ``RunInfo.cut`` names each attribute cut, with its length, so that
reports say so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from hookdbg.read.checks import H5_ERRORS, RecordingError, read_or_fail, reason
from hookdbg.store import schema
from hookdbg.text import human_bytes, plural

_MAX_WORLD = 1 << 20  # ranks: more than any cluster runs
TEXT_LIMIT = 4096  # characters kept of a text attribute, or of a JSON one's strings
READ_LIMIT = 1 << 20  # bytes of a fixed-size attribute read at most


@dataclass(frozen=True)
class RunInfo:
    """What ran, where, with which software and options (the file's attributes)."""

    argv: list[str]
    created: str
    host: str
    pid: int
    cwd: str
    hookdbg_version: str
    torch_version: str
    python_version: str
    options: dict[str, object]
    rank: int
    world_size: int
    local_rank: int
    backend: str
    schema_version: int
    per_call_path: str = ""  # C or Python ("" before it was recorded)
    # the attributes cut to TEXT_LIMIT, or not read: name -> what was left out
    # ("50,000,004 characters, shown to 4,096")
    cut: dict[str, str] = field(default_factory=dict)

    @property
    def command(self) -> str:
        return " ".join(self.argv)


def run_info(f: h5py.File, path: Path) -> RunInfo:
    """The file's attributes as a RunInfo; RecordingError for anything off."""
    attrs = _Attributes(f, path)
    fmt = attrs.get("format")
    if not isinstance(fmt, str) or fmt != schema.FORMAT:
        raise RecordingError(f"{path} is an HDF5 file but not a hookdbg recording")
    version = attrs.integer("schema_version", 1, 1 << 31)
    if version > schema.SCHEMA_VERSION:
        raise RecordingError(
            f"{path} was written by a newer hookdbg (schema version {version}; this one reads "
            f"up to {schema.SCHEMA_VERSION}): upgrade with `pip install -U hookdbg`"
        )
    argv = attrs.json_list("argv")
    if not all(isinstance(a, str) for a in argv):
        raise attrs.bad("argv", "a JSON list of strings", argv)
    world_size = attrs.integer("world_size", 1, _MAX_WORLD)
    return RunInfo(
        argv=[str(a) for a in argv],
        created=attrs.text("created"),
        host=attrs.text("host"),
        pid=attrs.integer("pid", 1, (1 << 31) - 1),
        cwd=attrs.text("cwd"),
        hookdbg_version=attrs.text("hookdbg_version"),
        torch_version=attrs.text("torch_version"),
        python_version=attrs.text("python_version"),
        options=attrs.json_object("options"),
        rank=attrs.integer("rank", 0, world_size - 1),
        world_size=world_size,
        local_rank=attrs.integer("local_rank", 0, _MAX_WORLD),
        backend=attrs.text("backend"),
        schema_version=version,
        per_call_path=taken if isinstance(taken := attrs.get("per_call_path"), str) else "",
        cut=attrs.cut,
    )


class _Attributes:
    """Typed access to a file's attributes; every failure is one line."""

    def __init__(self, f: h5py.File, path: Path) -> None:
        self._attrs = read_or_fail(path, "the file's attributes", lambda: f.attrs)
        self._path = path
        self.cut: dict[str, str] = {}

    def get(self, name: str) -> object:
        """The attribute's value, with strings as str; None when it is absent; "" for
        one stored at a fixed size beyond ``READ_LIMIT`` (not read: cut)."""
        try:
            if name not in self._attrs:
                return None
            stored = self._attrs.get_id(name)
            size = stored.get_storage_size()  # a variable-length string's: its pointer
            if size > READ_LIMIT:
                self.cut[name] = f"{human_bytes(size)} stored at a fixed size, not read"
                return ""
            value = self._attrs.get(name)
        except H5_ERRORS as exc:
            raise RecordingError(
                f"{self._path} is damaged: attribute {name!r} cannot be read ({reason(exc)})"
            ) from None
        if isinstance(value, (bytes, np.bytes_)):
            return bytes(value).decode("utf-8", "replace")
        return str(value) if isinstance(value, np.str_) else value

    def bad(self, name: str, expected: str, value: object) -> RecordingError:
        if value is None:
            return RecordingError(f"{self._path} is damaged: attribute {name!r} is missing")
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        kind = type(value).__name__
        return RecordingError(
            f"{self._path} is damaged: attribute {name!r} should be {expected}, not {kind} {shown}"
        )

    def text(self, name: str) -> str:
        """A text attribute, its first ``TEXT_LIMIT`` characters."""
        value = self._whole_text(name)
        if len(value) > TEXT_LIMIT:
            self._cut(name, len(value))
            return value[:TEXT_LIMIT] + _CUT
        return value

    def _whole_text(self, name: str) -> str:
        value = self.get(name)
        if not isinstance(value, str):
            raise self.bad(name, "a string", value)
        return value

    def integer(self, name: str, low: int, high: int) -> int:
        value = self.get(name)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise self.bad(name, "an integer", value)
        if not low <= int(value) <= high:
            raise self.bad(name, f"an integer from {low:,} to {high:,}", int(value))
        return int(value)

    def json_list(self, name: str) -> list[object]:
        value = self._json(name, "a list")
        if not isinstance(value, list):
            raise self.bad(name, "a JSON list", value)
        return value

    def json_object(self, name: str) -> dict[str, object]:
        value = self._json(name, "an object")
        if not isinstance(value, dict):
            raise self.bad(name, "a JSON object", value)
        return value

    def _json(self, name: str, kind: str) -> object:
        """A JSON attribute, parsed whole (a cut JSON text would not parse), then its
        strings bounded together (``_bounded``)."""
        text = self._whole_text(name)
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            raise self.bad(name, f"JSON text ({kind})", text) from None
        if len(text) <= TEXT_LIMIT:
            return value
        room = [TEXT_LIMIT]
        bounded = _bounded(value, room)
        if room[0] < 0:
            self._cut(name, len(text))
        return bounded

    def _cut(self, name: str, length: int) -> None:
        self.cut.setdefault(name, f"{plural(length, 'character')}, shown to {TEXT_LIMIT:,}")


_CUT = "…"  # ends what was cut


def _bounded(value: object, room: list[int]) -> object:
    """``value`` (parsed JSON) with its strings, keys among them, cut to ``room[0]``
    characters together, and the items of lists and objects past that point left out;
    ``room[0]`` ends below 0 where anything was cut."""
    if isinstance(value, str):
        left = room[0]
        room[0] -= len(value)
        return value if room[0] >= 0 else value[: max(left, 0)] + _CUT
    if isinstance(value, list):
        kept = []
        for item in value:
            if room[0] <= 0:
                room[0] = -1
                break
            kept.append(_bounded(item, room))
        return kept
    if isinstance(value, dict):
        entries = {}
        for key, item in value.items():
            if room[0] <= 0:
                room[0] = -1
                break
            room[0] -= len(key)
            entries[key] = _bounded(item, room)
        return entries
    return value
