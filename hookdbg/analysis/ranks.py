"""Across the ranks of a distributed run: stragglers, who saw a NaN first, and whether
the replicas that must agree do.

Under DDP every rank holds the same weights after each step, and the same (all-reduced)
gradients at the step, while activations and local gradients legitimately differ (each
rank has its own data). So ranks are compared on parameter norms after the step
(slot ``param``) and on gradient norms as the step used them (slot ``step_grad``);
the first place they part is a desync: an update outside the optimizer, a
rank-dependent branch, a non-deterministic op.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hookdbg.analysis.losses import LossSeries, loss_series
from hookdbg.read.ranks import RankSet
from hookdbg.read.recording import Status
from hookdbg.read.shards import Shard
from hookdbg.store.schema import Phase, Slot
from hookdbg.text import utf8


@dataclass(frozen=True)
class RankRow:
    rank: int
    status: Status
    steps: int
    step_median: float
    alerts: int
    dropped: int
    loss: LossSeries | None  # its first loss site's (each rank computes its own loss)
    ended: str = ""  # how its end row says it ended ('complete', 'exception', ...; '': none)


def rank_rows(ranks: RankSet) -> list[RankRow]:
    rows = []
    for rank, rec in ranks.recordings.items():
        steps = rec.steps[rec.steps["recorded"] == 1]
        durations = steps["end"] - steps["start"]
        rows.append(
            RankRow(
                rank,
                rec.status,
                len(steps),
                float(np.median(durations)) if len(durations) else 0.0,
                len(rec.alerts),
                rec.dropped_rows,
                next(iter(loss_series(rec)), None),
                "" if rec.end is None else utf8(rec.end["status"]),
            )
        )
    return rows


@dataclass(frozen=True)
class StepSpread:
    """One step's time on every rank; the slowest rank makes the others wait."""

    step: int
    seconds: dict[int, float]

    @property
    def slowest(self) -> int:
        return max(self.seconds, key=lambda r: self.seconds[r])

    @property
    def lag(self) -> float:
        """How much longer the slowest rank took than the fastest."""
        return max(self.seconds.values()) - min(self.seconds.values())

    @property
    def lag_share(self) -> float:
        """The lag as a share of the fastest rank's time (0 if that took no time)."""
        fastest = min(self.seconds.values())
        return self.lag / fastest if fastest > 0 else 0.0


def step_spreads(ranks: RankSet) -> list[StepSpread]:
    """Per step recorded on every rank, each rank's step time."""
    per_rank = {}
    for rank, rec in ranks.recordings.items():
        s = rec.steps[rec.steps["recorded"] == 1]
        per_rank[rank] = dict(
            zip(s["step"].tolist(), (s["end"] - s["start"]).tolist(), strict=True)
        )
    common = set.intersection(*(set(d) for d in per_rank.values())) if per_rank else set()
    return [StepSpread(step, {r: per_rank[r][step] for r in per_rank}) for step in sorted(common)]


RECEIVED = b"came from another rank"  # the words of an alert that was not born there


def alert_order(row: np.void) -> tuple[int, bool, float]:
    """Where an alert row goes among every rank's: by step, then wall-clock time;
    within a step, a value that came from another rank after the origins (it cannot
    have come before the origin it came from, whatever the ranks' times say)."""
    return int(row["step"]), RECEIVED in bytes(row["message"]), float(row["time"])


def merged_alerts(ranks: RankSet) -> list[tuple[int, np.void]]:
    """Every rank's alerts, in the order they happened (``alert_order``)."""
    merged = [(rank, row) for rank, rec in ranks.recordings.items() for row in rec.alerts]
    return sorted(merged, key=lambda ra: alert_order(ra[1]))


@dataclass(frozen=True)
class RanksOverview:
    """A distributed run at a glance: each rank, the stragglers, the first NaN/inf."""

    rows: list[RankRow]
    spreads: list[StepSpread]
    slowest: dict[int, int]  # rank -> in how many steps it was the slowest
    worst: StepSpread | None  # the step with the largest lag
    first_alert: tuple[int, np.void] | None  # (rank, alert row) of the first NaN/inf


def ranks_overview(ranks: RankSet) -> RanksOverview:
    """What `hookdbg summary` says about a distributed run."""
    spreads = step_spreads(ranks)
    alerts = merged_alerts(ranks)
    slowest: dict[int, int] = {}
    for spread in spreads:
        slowest[spread.slowest] = slowest.get(spread.slowest, 0) + 1
    return RanksOverview(
        rows=rank_rows(ranks),
        spreads=spreads,
        slowest=slowest,
        worst=max(spreads, key=lambda s: s.lag, default=None),
        first_alert=alerts[0] if alerts else None,
    )


@dataclass(frozen=True)
class Desync:
    step: int
    module: str
    slot: Slot
    path: str
    norms: dict[int, float]  # by rank

    @property
    def odd_ranks(self) -> list[int]:
        """The ranks that disagree with the majority (all of them if there is none)."""
        values = list(self.norms.values())
        common = max(set(values), key=values.count)
        if values.count(common) * 2 <= len(values):
            return list(self.norms)
        return [r for r, v in self.norms.items() if v != common]


@dataclass
class RankDiff:
    rtol: float
    atol: float
    compared_steps: list[int] = field(default_factory=list)
    compared: int = 0  # (step, parameter, slot) triples compared
    desyncs: list[Desync] = field(default_factory=list)
    # (step, parameter, slot) triples not compared: shards (FSDP2, tensor parallel), which
    # are not replicas, by placement; norms NaN/inf on every rank, which nothing can compare
    sharded: dict[str, int] = field(default_factory=dict)
    nonfinite: list[tuple[int, str, Slot, str]] = field(default_factory=list)
    # an optimizer stepped in a compared step on some rank (norms are taken after it)
    optimizer_stepped: bool = False

    @property
    def in_sync(self) -> bool:
        """Every rank agreed on all that was compared, and something was, or every
        parameter is sharded (FSDP2 keeps one copy of each weight: no replica can drift).
        A run recorded without norms checked nothing and is not in sync."""
        found = bool(self.compared) or self.all_sharded
        return found and not self.desyncs and not self.nonfinite

    @property
    def all_sharded(self) -> bool:
        """Nothing compared because each rank holds another piece of every tensor."""
        return not self.compared and bool(self.sharded)

    @property
    def first(self) -> Desync | None:
        return self.desyncs[0] if self.desyncs else None

    @property
    def last_agreed(self) -> int | None:
        """The last compared step before the first desync: the replicas agreed there
        (None without a desync, or when it came at the first compared step)."""
        first = self.first
        if first is None:
            return None
        return max((s for s in self.compared_steps if s < first.step), default=None)


def replica_groups(shards: dict[int, Shard]) -> list[list[int]]:
    """The ranks that hold the same piece of a sharded tensor, in groups of two or more:
    they differ only along the mesh dimensions it is replicated on, or they lie on
    sub-meshes alike with the same coordinates (FSDP2 over tensor parallel shards a
    norm it does not split over each tensor-parallel rank's data-parallel sub-mesh, and
    each tensor-parallel rank keeps a replica of it); none for a partial sum, which no
    two ranks hold alike."""
    groups: dict[tuple, list[int]] = {}
    for rank, shard in shards.items():
        if shard.partial:
            return []
        piece = tuple(
            c for p, c in zip(shard.placements, shard.coordinate, strict=True) if p != "R"
        )
        groups.setdefault((shard.mesh.shape, shard.text, shard.shape, piece), []).append(rank)
    return [g for g in groups.values() if len(g) > 1]


def rank_diff(
    ranks: RankSet,
    rtol: float = 0.0,
    atol: float = 0.0,
    first: int | None = None,
    last: int | None = None,
) -> RankDiff:
    """Compare parameter and step-gradient norms across ranks, step by step. Replicas
    are computed identically, so the default tolerance is none at all. A sharded tensor
    is compared only between the ranks that hold the same piece of it."""
    result = RankDiff(rtol, atol)
    recs = ranks.recordings
    if len(recs) < 2:
        return result
    steps = set.intersection(*(set(r.recorded_steps.tolist()) for r in recs.values()))
    result.compared_steps = sorted(
        s for s in steps if (first is None or s >= first) and (last is None or s <= last)
    )
    result.optimizer_stepped = any(
        bool(r.steps["optimizer_steps"][np.isin(r.steps["step"], result.compared_steps)].any())
        for r in recs.values()
    )
    for step in result.compared_steps:
        values: dict[tuple[str, int, str], dict[int, float]] = {}
        placed: dict[tuple[str, int, str], dict[int, Shard]] = {}
        for rank, rec in recs.items():
            rows = rec.tensors(step, step, ["module", "phase", "slot", "path", "norm"])
            rows = rows[
                (rows["phase"] == Phase.OPT) & np.isin(rows["slot"], [Slot.PARAM, Slot.STEP_GRAD])
            ]
            places = rec.shards
            for r in rows:
                path = utf8(r["path"])
                key = (rec.modules.name(int(r["module"])), int(r["slot"]), path)
                values.setdefault(key, {})[rank] = float(r["norm"])
                shard = places.get((int(r["module"]), Phase.OPT, int(r["slot"]), path))
                if shard is not None and (shard.sharded or shard.partial):
                    placed.setdefault(key, {})[rank] = shard
        for (module, slot, path), norms in values.items():
            if len(norms) < len(recs):
                continue
            shards = placed.get((module, slot, path))
            groups = [list(norms)] if shards is None else replica_groups(shards)
            if not groups:  # each rank holds another piece: no replicas to compare
                text = next(iter(shards.values())).text if shards else "?"
                result.sharded[text] = result.sharded.get(text, 0) + 1
                continue
            for group in groups:
                mine = {r: norms[r] for r in group}
                v = np.array(list(mine.values()))
                if not np.isfinite(v).any():
                    result.nonfinite.append((step, module, Slot(slot), path))
                    continue
                result.compared += 1
                same = np.all(np.abs(v - v[0]) <= atol + rtol * np.abs(v[0]))
                if not same:
                    result.desyncs.append(Desync(step, module, Slot(slot), path, mine))
    order = {Slot.STEP_GRAD: 0, Slot.PARAM: 1}  # within a step, the gradient comes first
    result.desyncs.sort(key=lambda d: (d.step, order[d.slot]))
    return result
