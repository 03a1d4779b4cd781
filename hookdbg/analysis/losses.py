"""The loss over the run: one series per loss site (where the script calls backward()).

Each backward pass's loss is a row of the ``losses`` table (recorder/hooks/backward.py). A
step with several passes from one site (gradient accumulation's micro-batches, LBFGS's
closure) counts as their mean; a GAN's two losses are two sites, two series.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hookdbg.read.modules import Module
from hookdbg.read.recording import Recording


@dataclass(frozen=True)
class LossSeries:
    """One loss site's value per training step (``steps`` ascending), and where its loss
    first held NaN/inf."""

    site: Module
    steps: np.ndarray
    values: np.ndarray
    passes: int  # backward passes in all (a step may hold several)
    nonfinite_step: int | None  # the first step whose loss held NaN or inf
    nonfinite_kind: str  # what it held then: 'NaN', 'inf', '-inf' ('' if never)
    scaled: bool  # a GradScaler scaled it (values are unscaled)

    @property
    def label(self) -> str:
        """``loss (train.py:42)``."""
        return f"{self.site.name} ({self.site.type})"

    def _finite(self) -> tuple[np.ndarray, np.ndarray]:
        keep = np.isfinite(self.values)
        return self.steps[keep], self.values[keep]

    def first(self) -> tuple[int, float] | None:
        """(step, value) of the first finite value."""
        steps, values = self._finite()
        return (int(steps[0]), float(values[0])) if len(steps) else None

    def last(self) -> tuple[int, float] | None:
        steps, values = self._finite()
        return (int(steps[-1]), float(values[-1])) if len(steps) else None

    def lowest(self) -> tuple[int, float] | None:
        steps, values = self._finite()
        if not len(steps):
            return None
        i = int(np.argmin(values))
        return int(steps[i]), float(values[i])

    def highest(self) -> tuple[int, float] | None:
        steps, values = self._finite()
        if not len(steps):
            return None
        i = int(np.argmax(values))
        return int(steps[i]), float(values[i])

    def to_json(self) -> dict[str, object]:
        """The series as reports print it with --json: where, its ends and extremes."""
        return {
            "site": self.site.name,
            "where": self.site.type,
            "passes": self.passes,
            "first": self.first(),
            "last": self.last(),
            "min": self.lowest(),
            "max": self.highest(),
            "nonfinite_step": self.nonfinite_step,
            "nonfinite_kind": self.nonfinite_kind or None,
            "scaled": self.scaled,
        }


def loss_series(recording: Recording) -> list[LossSeries]:
    """A series per loss site, in the order the sites first ran; training steps only."""
    rows = recording.losses
    if not len(rows):
        return []
    training = ~recording.is_eval(rows["segment"])
    rows = rows[training]
    out = []
    for site in dict.fromkeys(rows["module"].tolist()):
        mine = rows[rows["module"] == site]
        module = recording.modules[int(site)]
        steps, where = np.unique(mine["step"], return_inverse=True)
        where = where.reshape(-1)
        sums = np.bincount(where, weights=mine["value"], minlength=len(steps))
        counts = np.bincount(where, minlength=len(steps))
        bad = (mine["nan"] > 0) | (mine["posinf"] > 0) | (mine["neginf"] > 0)
        values = sums / np.maximum(counts, 1)
        values[np.bincount(where, weights=bad, minlength=len(steps)) > 0] = np.nan
        first_bad = mine[bad][0] if bad.any() else None
        out.append(
            LossSeries(
                site=module,
                steps=steps,
                values=values,
                passes=len(mine),
                nonfinite_step=None if first_bad is None else int(first_bad["step"]),
                nonfinite_kind=_kind(first_bad),
                scaled=bool(np.isfinite(mine["scale"]).any()),
            )
        )
    return out


def _kind(row: np.void | None) -> str:
    if row is None:
        return ""
    if row["nan"] > 0:
        return "NaN"
    return "inf" if row["posinf"] > 0 else "-inf"


def describe(series: LossSeries) -> str:
    """One line: first and last value, lowest and highest, and where it went non-finite."""
    parts = []
    first, last = series.first(), series.last()
    if first is not None and last is not None:
        parts.append(f"{first[1]:.4g} at step {first[0]} -> {last[1]:.4g} at step {last[0]}")
        (lo_step, lo), (hi_step, hi) = series.lowest() or first, series.highest() or first
        parts.append(f"min {lo:.4g} (step {lo_step}), max {hi:.4g} (step {hi_step})")
    if series.nonfinite_step is not None:
        parts.append(f"{series.nonfinite_kind} first at step {series.nonfinite_step}")
    if series.passes > len(series.steps):  # accumulated micro-batches, LBFGS's closure
        parts.append(
            f"a step's value is the mean of its backward passes ({series.passes} in "
            f"{len(series.steps)} steps)"
        )
    if series.scaled:
        parts.append("unscaled from the GradScaler's scale")
    return "; ".join(parts) or "no values"
