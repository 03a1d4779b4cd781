"""A recording at a glance: the run, its steps, and a torchinfo-like module table."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hookdbg.analysis.losses import LossSeries, loss_series
from hookdbg.cells import shape_text
from hookdbg.read.modules import Module
from hookdbg.read.recording import Recording
from hookdbg.store.schema import Phase, Slot


@dataclass(frozen=True)
class ModuleLine:
    """One module in one step: the torchinfo view plus what hookdbg measured."""

    module: Module
    calls: int
    output_shape: str
    params: int  # including submodules'
    fwd: float  # seconds, all calls in the step
    bwd: float


@dataclass(frozen=True)
class Overview:
    steps: int  # training steps
    recorded_steps: int
    eval_batches: int  # forward-only batches (validation, test, inference), kept apart
    module_calls: int
    step_median: float
    modules: int
    params: int
    optimizers: list[str]  # each with the parameters no module holds, where it has some
    compiled: list[str]  # modules run by torch.compile, recorded as one call each
    step: int | None  # the step the module table describes
    lines: list[ModuleLine]
    scaler: ScalerView | None = None  # AMP's GradScaler, when the script used one
    losses: list[LossSeries] = field(default_factory=list)  # one per loss site
    # work that ran and was not recorded: other threads', forked children's
    unrecorded: list[str] = field(default_factory=list)
    after_training: float | None = None  # seconds the script ran after its last step


@dataclass(frozen=True)
class ScalerView:
    """What AMP's GradScaler did in the recorded steps: steps it skipped because their
    scaled gradients overflowed (no alert: that is how it finds its scale)."""

    skipped: int
    first_scale: float
    last_scale: float

    def text(self) -> str:
        scales = f"loss scale {self.first_scale:g}"
        if self.last_scale != self.first_scale:
            scales += f" at first, {self.last_scale:g} at the end"
        return (
            f"GradScaler skipped {self.skipped} optimizer "
            f"{'step' if self.skipped == 1 else 'steps'} whose scaled gradients "
            f"overflowed (mixed precision at work, not alerts); {scales}"
        )


def ending(recording: Recording) -> str:
    """How the run ended, in a few words: 'exit status 0', 'stopped at a NaN/inf
    (exit status 3)', 'RuntimeError: ... (exit status 1)'; '' while it is still live
    or when it was cut short (the status says so)."""
    end = recording.end
    if end is None:
        return ""
    status = end["status"].decode(errors="replace")
    code = int(end["exit_code"])
    message = end["message"].decode(errors="replace")
    if status == "exception":
        return f"{message} (exit status {code})"
    if status == "stopped":  # at its alert: an origin, a value another rank sent, or
        # a headroom warning
        if message.startswith("headroom:"):
            where = "at a headroom warning, before the overflow"
        elif "came from another rank" in message:
            where = "where a NaN/inf came from another rank"
        else:
            where = "at the first NaN/inf origin"
        return f"stopped {where} (exit status {code})"
    if status == "detached":  # hookdbg ctl stop: the script went on, its end unknown
        return f"{message}; training went on unrecorded"
    if status in ("interrupted", "terminated"):
        return f"{status}{f' by {message}' if message else ''} (exit status {code})"
    return f"exit status {code}"


def overview(recording: Recording, step: int | None = None) -> Overview:
    """Run-level counts and the module table of ``step`` (default: first recorded)."""
    recorded = recording.recorded_steps
    steps = recording.steps
    durations = (steps["end"] - steps["start"])[steps["recorded"] == 1]
    calls_table = recording.calls_table
    phases = calls_table.column("phase")
    modules = [m for m in recording.modules if m.is_model_part]
    if step is None and len(recorded):
        step = int(recorded[0])
    lines = _module_lines(recording, step, modules) if step is not None else []
    totals = _param_totals(recording, modules)
    return Overview(
        steps=len(steps),
        recorded_steps=len(recorded),
        eval_batches=len(recording.evals),
        module_calls=int(np.count_nonzero(phases == Phase.FWD)),
        step_median=float(np.median(durations)) if len(durations) else 0.0,
        modules=len(modules),
        params=sum(totals[m.id] for m in recording.modules.roots()),
        optimizers=[
            f"{m.name} ({m.type}{f', {m.params:,} parameters of its own' if m.params else ''})"
            for m in recording.modules
            if m.is_optimizer
        ],
        compiled=recording.compiled,
        step=step,
        lines=lines,
        scaler=scaler_view(recording),
        losses=loss_series(recording),
        unrecorded=[
            text
            for key in ("other_threads", "child_processes")
            if (text := recording.facts.get(key))
        ],
        after_training=after_training(recording),
    )


def after_training(recording: Recording) -> float | None:
    """Seconds the script went on after its last training step ended (a final eval,
    saving a checkpoint, a checksum): in no step, so no step's time holds them. None:
    none (under a millisecond), or the recording does not say."""
    text = recording.facts.get("after_training")
    try:
        seconds = float(text) if text is not None else math.nan
    except ValueError:
        return None
    # under a millisecond is the close itself, not work the script did
    return seconds if math.isfinite(seconds) and seconds >= 1e-3 else None


def after_training_text(seconds: float) -> str:
    """The words for ``after_training``, the same in every report."""
    return (
        f"{seconds:.3g} s after the last step ended (the script's work after training: "
        "saving, evaluating), in no step's time"
    )


def scaler_view(recording: Recording) -> ScalerView | None:
    steps = recording.steps
    scaled = steps[~np.isnan(steps["scale"])]
    if not len(scaled):
        return None
    return ScalerView(
        skipped=int(scaled["skipped"].sum()),
        first_scale=float(scaled["scale"][0]),
        last_scale=float(scaled["scale"][-1]),
    )


def _param_totals(recording: Recording, modules: list[Module]) -> dict[int, int]:
    totals = {m.id: m.params for m in modules}
    for m in sorted(modules, key=lambda m: -m.depth):
        if m.parent in totals:
            totals[m.parent] += totals[m.id]
    return totals


def _module_lines(recording: Recording, step: int, modules: list[Module]) -> list[ModuleLine]:
    calls = recording.calls(step, step, ["module", "phase", "index", "total"])
    tensors = recording.tensors(step, step, ["module", "phase", "slot", "path", "shape", "call"])
    outputs = tensors[(tensors["phase"] == Phase.FWD) & (tensors["slot"] == Slot.OUTPUT)]
    totals = _param_totals(recording, modules)
    # the step's rows by module, found once: a model may have 100,000 modules
    fwd_calls: dict[int, list[float]] = {}
    bwd_time: dict[int, float] = {}
    for module, phase, total in zip(
        calls["module"].tolist(), calls["phase"].tolist(), calls["total"].tolist(), strict=True
    ):
        if phase == Phase.FWD:
            fwd_calls.setdefault(module, []).append(total)
        elif phase == Phase.BWD:
            bwd_time[module] = bwd_time.get(module, 0.0) + total
    shapes: dict[int, list[str]] = {}
    first_call: dict[int, int] = {}
    for module, call, raw in zip(
        outputs["module"].tolist(), outputs["call"].tolist(), outputs["shape"], strict=True
    ):
        if first_call.setdefault(module, call) == call:
            shapes.setdefault(module, []).append(shape_text(raw))
    lines = []
    for m in _tree_order(recording, modules):
        mine = shapes.get(m.id)
        if not mine:
            shape = "-"
        elif len(mine) == 1:
            shape = mine[0]
        else:
            shape = "[" + ", ".join(mine[:3]) + (", ...]" if len(mine) > 3 else "]")
        fwd = fwd_calls.get(m.id, [])
        lines.append(
            ModuleLine(
                module=m,
                calls=len(fwd),
                output_shape=shape,
                params=totals[m.id],
                fwd=float(sum(fwd)),
                bwd=float(bwd_time.get(m.id, 0.0)),
            )
        )
    return lines


def _tree_order(recording: Recording, modules: list[Module]) -> list[Module]:
    """``modules`` from each root down, each before its children, in the order they
    were named. A loop, not recursion: a model nests as deep as its script's recursion
    limit let it run, far deeper than a reader's own limit."""
    ids = {m.id for m in modules}
    out: list[Module] = []
    todo = list(reversed(recording.modules.roots()))
    while todo:
        m = todo.pop()
        out.append(m)
        todo.extend(
            c for c in reversed(recording.modules.children(m.id)) if c.id in ids and c.id != m.id
        )
    return out
