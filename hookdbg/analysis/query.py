"""The search language of ``hookdbg search`` and the TUI's search bar.

A query is terms separated by spaces; a row matches when every term does. A term may
be negated with ``!``; ``|`` separates alternatives within a field.

======================  =============================================================
``layer3.*``            module name (or path inside its model) matching a glob
``name:*.conv1``        the same, explicitly
``type:Conv2d|Linear``  module class
``phase:bwd``           fwd, bwd or opt
``slot:output``         input, output, grad_output, grad_input, param_grad, param;
                        ``slot:grad`` means any gradient
``step:5``, ``step:3:7``  one step, or steps 3 to 6
``dtype:float16``       tensor dtype; ``path:mask`` the tensor's place in its slot
``nan``, ``inf``        the tensor has NaN / +-inf values; ``nonfinite`` either
``max>1e4``             a statistic compared with a number (``STATS``: min max mean
                        std norm absmax, the max of abs min/max, numel, the NaN/inf
                        counts, the fractions...), with < <= > >= = !=
======================  =============================================================

Examples: ``nan``, ``type:BatchNorm2d std<1e-6``, ``layer4.* phase:bwd norm>10``,
``slot:grad absmax>65504 !type:Embedding``.

Terms about tensors (slot, statistics, dtype, path, nan/inf) search the tensor
summaries; a query with none of them searches module calls, so it also works on a
``--level timing`` recording.
"""

from __future__ import annotations

import fnmatch
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hookdbg.options import OptionError, StepRange
from hookdbg.read.modules import Module, ModuleTable
from hookdbg.store import summary as layout
from hookdbg.store.schema import Phase, Slot


class QueryError(ValueError):
    """A query that cannot be parsed; the message points at the term."""


# what a comparison may name: the searched fields of a summary (hookdbg/store/summary.py),
# the numbers first, with ``absmax`` after them
STATS = (
    *(n for n in layout.SEARCHED if layout.field(n).kind == layout.STAT),
    "absmax",
    *(n for n in layout.SEARCHED if layout.field(n).kind != layout.STAT),
)
_OPS: dict[str, Callable[[np.ndarray, float], np.ndarray]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "!=": operator.ne,
    "==": operator.eq,
    "<": operator.lt,
    ">": operator.gt,
    "=": operator.eq,
}
_COMPARISON = re.compile(r"^([a-z_]+)\s*(<=|>=|!=|==|<|>|=)\s*(.+)$")
_INCOMPLETE = re.compile(r"^([a-z_]*)\s*(<=|>=|!=|==|<|>|=)\s*$")  # max> : no number
_PHASES = {p.label: int(p) for p in Phase}
_SLOTS = {s.label: [int(s)] for s in Slot} | {
    "grad": [int(Slot.GRAD_OUTPUT), int(Slot.GRAD_INPUT), int(Slot.PARAM_GRAD)],
    "in": [int(Slot.INPUT)],
    "out": [int(Slot.OUTPUT)],
}
_FLAGS = {"nan", "inf", "nonfinite", "finite"}


@dataclass
class Term:
    text: str
    negate: bool
    columns: set[str]
    tensor_only: bool
    evaluate: Callable[[np.ndarray, ModuleTable], np.ndarray]
    # the statistic a comparison is about (``norm`` in norm>10): a report of the matches
    # shows it
    stat: str | None = None


@dataclass
class Query:
    """A parsed query: ``mask(rows, modules)`` says which rows match."""

    text: str
    terms: list[Term] = field(default_factory=list)

    @property
    def on_tensors(self) -> bool:
        """Whether the query needs tensor summaries (else module calls will do)."""
        return any(t.tensor_only for t in self.terms)

    @property
    def columns(self) -> set[str]:
        return set().union(*(t.columns for t in self.terms)) if self.terms else set()

    @property
    def steps(self) -> tuple[int | None, int | None]:
        """The widest step bounds the query allows (to read only those rows)."""
        lo: int | None = None
        hi: int | None = None
        for term in self.terms:
            bounds = getattr(term.evaluate, "steps", None)
            if bounds and not term.negate:
                lo = bounds[0] if lo is None else max(lo, bounds[0])
                hi = bounds[1] if hi is None else min(hi, bounds[1])
        return lo, hi

    def mask(self, rows: np.ndarray, modules: ModuleTable) -> np.ndarray:
        out = np.ones(len(rows), dtype=bool)
        for term in self.terms:
            hit = term.evaluate(rows, modules)
            out &= ~hit if term.negate else hit
        return out


def parse(text: str) -> Query:
    """Parse a query; raises QueryError saying which term is wrong and why."""
    query = Query(text.strip())
    if not query.text:
        raise QueryError("the query is empty; try e.g. nan, type:Linear or std<1e-6")
    for raw in text.split():
        negate = raw.startswith("!")
        body = raw[1:] if negate else raw
        if not body:
            raise QueryError("'!' must be followed by a term, as in !type:Dropout")
        query.terms.append(_term(body, negate))
    return query


def _term(body: str, negate: bool) -> Term:
    lowered = body.lower()
    if lowered in _FLAGS:
        return Term(body, negate, {"nan", "posinf", "neginf"}, True, _flag(lowered))
    incomplete = _INCOMPLETE.match(body)
    if incomplete and incomplete.group(1):
        raise QueryError(
            f"{body!r} is incomplete: put a number after {incomplete.group(2)!r}, "
            f"as in {incomplete.group(1)}{incomplete.group(2)}1e-6"
        )
    m = _COMPARISON.match(body)
    if m and m.group(1) in STATS:
        return _comparison(body, negate, m.group(1), m.group(2), m.group(3))
    if m and ":" not in body:
        raise QueryError(
            f"unknown statistic {m.group(1)!r} in {body!r}; use one of {', '.join(STATS)}"
        )
    key, sep, value = body.partition(":")
    if not sep:
        _check_bare(body)
        return Term(body, negate, {"module"}, False, _names(body))
    if not value:
        raise QueryError(f"{body!r} needs a value after ':'")
    key = key.lower()
    if key == "name":
        return Term(body, negate, {"module"}, False, _names(value))
    if key == "type":
        return Term(body, negate, {"module"}, False, _types(value))
    if key == "phase":
        return Term(
            body, negate, {"phase"}, False, _choice("phase", value, _PHASES, "fwd, bwd, opt")
        )
    if key == "slot":
        return Term(body, negate, {"slot"}, True, _slots(value))
    if key == "step":
        return Term(body, negate, {"step"}, False, _steps(value))
    if key in ("dtype", "path", "shape"):
        return Term(body, negate, {key}, True, _text(key, value))
    raise QueryError(
        f"unknown field {key!r} in {body!r}; use name, type, phase, slot, step, dtype, path, shape"
    )


def _check_bare(body: str) -> None:
    """A bare term is a module name glob; one holding a comparison or a parenthesis is
    a mistyped comparison (``max>``, ``(std<1``), not a name to match nothing with.
    Names with such characters can still be searched for with ``name:``."""
    if "(" in body or ")" in body:
        raise QueryError(
            f"{body!r}: the query language has no parentheses; terms separated by spaces "
            "must all match, and | gives alternatives within a field (type:Conv2d|Linear)"
        )
    for op in ("<", ">", "="):
        if op in body:
            raise QueryError(
                f"{body!r} is not a comparison: write a statistic, an operator and a "
                f"number, as in max>1e4 (statistics: {', '.join(STATS)}); "
                "name:GLOB matches module names holding such characters"
            )


def _flag(flag: str) -> Callable[[np.ndarray, ModuleTable], np.ndarray]:
    def evaluate(rows: np.ndarray, modules: ModuleTable) -> np.ndarray:
        nan = rows["nan"] > 0
        inf = (rows["posinf"] > 0) | (rows["neginf"] > 0)
        return {"nan": nan, "inf": inf, "nonfinite": nan | inf, "finite": ~(nan | inf)}[flag]

    return evaluate


def _comparison(body: str, negate: bool, stat: str, op: str, value: str) -> Term:
    try:
        number = float(value)
    except ValueError:
        raise QueryError(f"{body!r}: {value!r} is not a number") from None
    compare = _OPS[op]
    columns = {"min", "max"} if stat == "absmax" else {stat}

    def evaluate(rows: np.ndarray, modules: ModuleTable) -> np.ndarray:
        if stat == "absmax":
            data = np.maximum(np.abs(rows["min"]), np.abs(rows["max"]))
        else:
            data = rows[stat]
        with np.errstate(invalid="ignore"):
            return compare(data, number) & ~np.isnan(data.astype(float))

    return Term(body, negate, columns, True, evaluate, stat)


def _module_ids(modules: ModuleTable, hit: Callable[[Module], bool]) -> np.ndarray:
    return np.array([m.id for m in modules if hit(m)], dtype=np.int32)


def _names(pattern: str) -> Callable[[np.ndarray, ModuleTable], np.ndarray]:
    patterns = pattern.split("|")

    def evaluate(rows: np.ndarray, modules: ModuleTable) -> np.ndarray:
        ids = {m.id for p in patterns for m in modules.matching(p)}
        return np.isin(rows["module"], np.fromiter(ids, dtype=np.int32, count=len(ids)))

    return evaluate


def _types(pattern: str) -> Callable[[np.ndarray, ModuleTable], np.ndarray]:
    patterns = pattern.split("|")

    def evaluate(rows: np.ndarray, modules: ModuleTable) -> np.ndarray:
        ids = _module_ids(modules, lambda m: any(fnmatch.fnmatchcase(m.type, p) for p in patterns))
        return np.isin(rows["module"], ids)

    return evaluate


def _choice(
    column: str, value: str, names: dict[str, int], allowed: str
) -> Callable[[np.ndarray, ModuleTable], np.ndarray]:
    codes = []
    for v in value.lower().split("|"):
        if v not in names:
            raise QueryError(f"unknown {column} {v!r}; use {allowed}")
        codes.append(names[v])
    return lambda rows, modules: np.isin(rows[column], codes)


def _slots(value: str) -> Callable[[np.ndarray, ModuleTable], np.ndarray]:
    codes = []
    for v in value.lower().split("|"):
        if v not in _SLOTS:
            raise QueryError(f"unknown slot {v!r}; use {', '.join(_SLOTS)}")
        codes += _SLOTS[v]
    return lambda rows, modules: np.isin(rows["slot"], codes)


def _steps(value: str) -> Callable[[np.ndarray, ModuleTable], np.ndarray]:
    try:
        steps = StepRange.parse(value)
    except OptionError as exc:
        raise QueryError(str(exc).replace("step range", "step")) from None

    def evaluate(rows: np.ndarray, modules: ModuleTable) -> np.ndarray:
        hit = rows["step"] >= steps.start
        return hit if steps.stop is None else hit & (rows["step"] < steps.stop)

    evaluate.steps = (steps.start, None if steps.stop is None else steps.stop - 1)  # type: ignore[attr-defined]
    return evaluate


def _text(column: str, value: str) -> Callable[[np.ndarray, ModuleTable], np.ndarray]:
    patterns = [p.encode() for p in value.split("|")]

    def evaluate(rows: np.ndarray, modules: ModuleTable) -> np.ndarray:
        return np.array(
            [any(fnmatch.fnmatchcase(v, p) for p in patterns) for v in rows[column]], dtype=bool
        )

    return evaluate
