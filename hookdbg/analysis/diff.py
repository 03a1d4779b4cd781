"""Where two recordings part ways: the first divergent module, and the largest gaps.

Rows are aligned by (step, module, nth call of the module in the step, phase, slot,
path) with ``by="name"``, or with the module replaced by the call's position in the
step with ``by="order"`` (for renamed modules). Two aligned rows agree when shape,
dtype and NaN/inf counts are equal and the statistics both recordings hold are close
(min, max, mean, std, norm, absmean: one made by an older hookdbg lacks the later
ones): ``|a - b| <= atol + rtol * |b|`` (NaN equals NaN). The fractions (of zeros, of
values at the ends) are not compared: the zero fraction may be a sampled estimate.
Rows are compared step by step, so memory stays bounded by one step's rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from hookdbg.read.recording import Recording
from hookdbg.store import summary as layout
from hookdbg.store.schema import Phase, slot_label
from hookdbg.text import utf8

STATS = layout.STATS  # min max mean std norm (hookdbg/store/summary.py)
EXACT = ("shape", "dtype", "nan", "posinf", "neginf")
COLUMNS = ["call", "step", "module", "phase", "slot", "path", *EXACT, *STATS]


@dataclass(frozen=True)
class Divergence:
    step: int
    module: str
    type: str
    index: int  # nth call of the module in the step
    phase: int
    slot: int
    path: str
    stat: str  # the statistic that differs most
    a: float | str  # str for shape and dtype
    b: float | str
    rel_diff: float  # inf for shape/dtype/count mismatches


@dataclass
class DiffResult:
    rtol: float
    atol: float
    by: str
    steps_a: int
    steps_b: int
    compared_steps: list[int] = field(default_factory=list)
    compared_rows: int = 0
    only_a: list[str] = field(default_factory=list)  # modules (or rows) not in b
    only_b: list[str] = field(default_factory=list)
    unmatched_rows: int = 0
    unmatched: list[str] = field(default_factory=list)  # the first few, described
    divergences: list[Divergence] = field(default_factory=list)
    # the recording made below --level stats (no values to compare), if one was
    values_from: str | None = None
    # what is compared: the exact columns, and the statistics both recordings hold
    # (``not_compared``: those one holds and the other, made by an older hookdbg,
    # lacks); shapes and dtypes alone where one has no values (``values_from``)
    exact: tuple[str, ...] = EXACT
    stats: tuple[str, ...] = STATS
    not_compared: tuple[str, ...] = ()

    @property
    def equal(self) -> bool:
        return not self.divergences and not self.unmatched_rows and self.compared_rows > 0

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    def ranked(self, top: int = 20) -> list[tuple[str, str, int, Divergence]]:
        """(module, type, rows, worst divergence) per module, largest first."""
        worst: dict[str, tuple[int, Divergence]] = {}
        for d in self.divergences:
            n, w = worst.get(d.module, (0, d))
            worst[d.module] = (n + 1, d if d.rel_diff > w.rel_diff else w)
        ranked = sorted(worst.items(), key=lambda kv: -kv[1][1].rel_diff)
        return [(name, d.type, n, d) for name, (n, d) in ranked[:top]]


def diff(
    a: Recording,
    b: Recording,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-8,
    by: str = "name",
    first: int | None = None,
    last: int | None = None,
) -> DiffResult:
    """Compare two recordings' tensor summaries, step by step."""
    result = DiffResult(rtol, atol, by, len(a.recorded_steps), len(b.recorded_steps))
    older, newer = sorted((a.info.schema_version, b.info.schema_version))
    result.stats = tuple(s for s in STATS if layout.field(s).since <= older)
    # (what neither holds needs no word)
    result.not_compared = tuple(s for s in STATS if older < layout.field(s).since <= newer)
    names_a = {m.name for m in a.modules if m.is_model_part}
    names_b = {m.name for m in b.modules if m.is_model_part}
    if by == "name":
        result.only_a = sorted(names_a - names_b)
        result.only_b = sorted(names_b - names_a)
    common = sorted(set(a.recorded_steps.tolist()) & set(b.recorded_steps.tolist()))
    common = [s for s in common if (first is None or s >= first) and (last is None or s <= last)]
    result.compared_steps = common
    for rec in (a, b):
        if rec.info.options.get("level") != "stats":
            result.values_from = str(rec.path)
            result.exact, result.stats = ("shape", "dtype"), ()
    for step in common:
        _compare_step(a, b, step, result)
    return result


def gaps(
    x: np.ndarray,
    y: np.ndarray,
    rtol: float,
    atol: float,
    exact: tuple[str, ...] = EXACT,
    stats: tuple[str, ...] = STATS,
) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(column, where the aligned rows ``x`` and ``y`` differ, relative difference) per
    compared column: the one rule of when two summaries agree, for ``diff`` and for
    the TUI, which highlights the cells that differ."""
    for stat in exact:
        yield stat, x[stat] != y[stat], np.full(len(x), np.inf)
    for stat in stats:
        u, v = x[stat], y[stat]
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            same = (u == v) | (np.isnan(u) & np.isnan(v))  # inf == inf: no gap
            gap = np.abs(u - v)
            bad = ~same & ~(gap <= atol + rtol * np.abs(v))
            rel = np.where(np.isnan(gap), np.inf, gap / np.maximum(np.abs(v), 1e-300))
        yield stat, bad, rel


def _keys(rec: Recording, rows: np.ndarray, step: int, by: str) -> list[tuple]:
    calls = rec.calls(step, step, ["call", "phase", "index"])
    calls = calls[calls["phase"] != 1]  # a backward row shares its forward row's call id
    index = dict(zip(calls["call"].tolist(), calls["index"].tolist(), strict=True))
    position = {c: i for i, c in enumerate(sorted(index))}
    names = rec.modules
    keys = []
    seen: dict[tuple, int] = {}  # a key can repeat (gradient accumulation): number repeats
    for call, module, phase, slot, path in zip(
        rows["call"].tolist(),
        rows["module"].tolist(),
        rows["phase"].tolist(),
        rows["slot"].tolist(),
        rows["path"].tolist(),
        strict=True,
    ):
        if by == "name":
            key: tuple = (names.name(module), index.get(call, -1), phase, slot, path)
        else:
            key = (position.get(call, -1), phase, slot, path)
        repeat = seen.get(key, 0)
        seen[key] = repeat + 1
        keys.append((*key, repeat))
    return keys


def _compare_step(a: Recording, b: Recording, step: int, result: DiffResult) -> None:
    rows_a, rows_b = a.tensors(step, step, COLUMNS), b.tensors(step, step, COLUMNS)
    exact, stats = result.exact, result.stats
    if result.values_from is not None:
        # without values on one side, compare what both have: no weights after the
        # optimizer step (recorded only with statistics), shapes and dtypes
        rows_a, rows_b = rows_a[rows_a["phase"] != Phase.OPT], rows_b[rows_b["phase"] != Phase.OPT]
    keys_a, keys_b = _keys(a, rows_a, step, result.by), _keys(b, rows_b, step, result.by)
    where_b = {k: i for i, k in enumerate(keys_b)}
    ia, ib = [], []
    for i, key in enumerate(keys_a):
        j = where_b.pop(key, None)
        if j is not None:
            ia.append(i)
            ib.append(j)
    result.unmatched_rows += (len(keys_a) - len(ia)) + len(where_b)
    if len(result.unmatched) < 5:
        matched = set(ia)
        lonely = [("a", rows_a, i) for i in range(len(keys_a)) if i not in matched]
        lonely += [("b", rows_b, j) for j in where_b.values()]
        for side, rows, i in lonely[: 5 - len(result.unmatched)]:
            r = rows[i]
            owner = (a if side == "a" else b).modules.name(int(r["module"]))
            where = slot_label(int(r["slot"]), utf8(r["path"]))
            phase = Phase(int(r["phase"])).label
            result.unmatched.append(f"step {step} {owner} {phase} {where} (only in {side})")
    if not ia:
        return
    x, y = rows_a[np.array(ia)], rows_b[np.array(ib)]
    result.compared_rows += len(x)
    worst = np.zeros(len(x))
    worst_stat = np.full(len(x), "", dtype=object)
    for stat, bad, rel in gaps(x, y, result.rtol, result.atol, exact, stats):
        update = bad & (rel > worst)  # an exact column's mismatch (inf) is kept
        worst[update], worst_stat[update] = rel[update], stat
    for i in np.flatnonzero(worst_stat != "").tolist():
        stat = worst_stat[i]
        va, vb = x[stat][i], y[stat][i]
        module = a.modules[int(x["module"][i])]
        key = keys_a[ia[i]]
        result.divergences.append(
            Divergence(
                step=step,
                module=module.name,
                type=module.type,
                index=key[1] if result.by == "name" else key[0],
                phase=int(x["phase"][i]),
                slot=int(x["slot"][i]),
                path=utf8(x["path"][i]),
                stat=stat,
                a=utf8(va) if isinstance(va, bytes) else float(va),
                b=utf8(vb) if isinstance(vb, bytes) else float(vb),
                rel_diff=float(worst[i]),
            )
        )


def not_compared(result: DiffResult) -> str:
    """'absmean not compared: a recording made by an older hookdbg lacks it'."""
    names = ", ".join(result.not_compared)
    lacks = "it" if len(result.not_compared) == 1 else "them"
    return f"{names} not compared: a recording made by an older hookdbg lacks {lacks}"
