"""Messages between the replay screen, its widgets and its workers.

Widgets say what the user asked for (``Goto``); workers hand back what they read, tagged
with the state they read it for (``key``), so the screen can drop a late result of a
request that is no longer current instead of showing it over a newer one.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from hookdbg.read import RankSet, Recording

from .model import Curve, Detail, DiffView, Gap, ModuleStep, PlotStat, RowPair


@dataclass
class Goto(Message):
    """Go to a step and/or module (a click on the timeline or a plot, the module finder)."""

    step: int | None = None
    module: int | None = None


@dataclass
class StepLoaded(Message):
    """Tree badges of one step: ``key`` is (rank, step, evals, compared)."""

    key: tuple[int, int, bool, bool]
    table: dict[int, ModuleStep]
    divergence: dict[str, Gap] | None


@dataclass
class DetailLoaded(Message):
    """The detail of one module in one step: ``key`` is (rank, step, evals, module,
    compared, merged)."""

    key: tuple[int, int, bool, int, bool, bool]
    detail: Detail
    other: Detail | None
    pairs: list[RowPair] | None  # both runs' rows paired, compared once the diff is ready
    run: str = ""  # "b": the detail is of a module only run b has


@dataclass
class SeriesLoaded(Message):
    """One statistic of one module over all steps: ``key`` is (rank, module, evals, stat,
    loss site)."""

    key: tuple[int, int, bool, int, int]
    stat: PlotStat
    module: str
    curve: Curve
    other: Curve | None
    tensor: str = ""  # which tensor, where a module returns several: "output[logits]"


@dataclass
class DiffReady(Message):
    """Two recordings compared."""

    diff: DiffView


@dataclass
class NewData(Message):
    """A followed recording grew, or ended."""

    rank: int


@dataclass
class Opened(Message):
    """A recording that was waited for can be read now."""

    recording: Recording | RankSet
