"""Where the time goes: per-module forward/backward/optimizer times over a range of steps."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hookdbg.read.modules import Module
from hookdbg.read.recording import Recording
from hookdbg.store.schema import Phase

SORT_KEYS = ("self", "total", "calls", "name")


@dataclass(frozen=True)
class ProfileRow:
    module: Module
    phase: int
    steps: int  # steps in which the module ran in this phase
    calls_per_step: float
    self_mean: float  # seconds per step (over the steps it ran in)
    self_median: float
    total_mean: float
    total_median: float
    share: float  # of all step time in the range, by self time
    # the same on the device (CUDA events: recorder/hooks/devicetime.py); NaN where the calls
    # were not timed there (a model on the CPU, an older recording)
    device_self_mean: float = float("nan")
    device_total_mean: float = float("nan")


@dataclass(frozen=True)
class StepTime:
    """Where a recorded step's time went, in seconds per step (mean over the profile's
    steps), by recorder/hooks/timing.py's time model: ``parts`` add up to ``step``, the wall
    time without hookdbg; ``hookdbg`` is its own time, left out of all of them (NaN in
    recordings made before it was kept)."""

    step: float
    forward: float  # modules' forward self time
    backward: float  # modules' backward self time
    # backward passes outside recorded modules: the loss computation's backward, tensor
    # code between modules, a DDP all-reduce waited for at the end (loss sites' self time)
    loss: float
    optimizer: float
    outside: float  # the rest: data loading, tensor code between modules, the script
    hookdbg: float

    @property
    def parts(self) -> dict[str, float]:
        return {
            "forward": self.forward,
            "backward": self.backward,
            "backward outside modules": self.loss,
            "optimizer": self.optimizer,
            "outside modules": self.outside,
        }


@dataclass(frozen=True)
class Profile:
    first: int
    last: int
    steps: int
    step_mean: float
    step_median: float
    rows: list[ProfileRow]
    time: StepTime
    on_device: bool = False  # its calls have device times: they sort and lead

    def sorted(self, key: str = "self", top: int | None = None) -> list[ProfileRow]:
        device = self.on_device

        def mean(host: float, on_device: float) -> float:
            return (0.0 if on_device != on_device else on_device) if device else host

        order = {
            "self": lambda r: -mean(r.self_mean, r.device_self_mean) * r.steps,
            "total": lambda r: -mean(r.total_mean, r.device_total_mean) * r.steps,
            "calls": lambda r: -r.calls_per_step,
            "name": lambda r: (r.module.name, r.phase),
        }[key]
        rows = sorted(self.rows, key=order)
        return rows if top is None else rows[:top]


def profile(
    recording: Recording,
    first: int | None = None,
    last: int | None = None,
    phases: tuple[int, ...] | None = None,
) -> Profile:
    """Per (module, phase): time per step (mean and median over the steps it ran in),
    calls per step, and its share of the total step time of the range."""
    first, last = recording.step_range(first, last)
    calls = recording.calls(first, last, ["call", "step", "module", "phase", "total", "self"])
    device = _device_times(recording, calls, first, last)
    steps = recording.steps
    in_range = steps[(steps["step"] >= first) & (steps["step"] <= last) & (steps["recorded"] == 1)]
    durations = in_range["end"] - in_range["start"]
    all_step_time = float(durations.sum()) or 1.0

    rows = []
    if len(calls):
        # per (module, phase, step) sums, then statistics over steps
        keys = np.stack([calls["module"], calls["phase"], calls["step"]], axis=1)
        uniq, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
        inverse = inverse.ravel()
        self_sum = np.bincount(inverse, weights=calls["self"])
        total_sum = np.bincount(inverse, weights=calls["total"])
        if device is not None:  # a call not timed on the device leaves its sums NaN
            device_self = np.bincount(inverse, weights=device[0])
            device_total = np.bincount(inverse, weights=device[1])
        groups: dict[tuple[int, int], list[int]] = {}
        for i, (module, phase, _) in enumerate(uniq):
            groups.setdefault((int(module), int(phase)), []).append(i)
        for (module, phase), idx in groups.items():
            info = recording.modules.get(module)
            if info is None:
                continue
            s, t = self_sum[idx], total_sum[idx]
            rows.append(
                ProfileRow(
                    module=info,
                    phase=phase,
                    steps=len(idx),
                    calls_per_step=float(counts[idx].mean()),
                    self_mean=float(s.mean()),
                    self_median=float(np.median(s)),
                    total_mean=float(t.mean()),
                    total_median=float(np.median(t)),
                    share=float(s.sum()) / all_step_time,
                    **(
                        {}
                        if device is None
                        else {
                            "device_self_mean": float(device_self[idx].mean()),
                            "device_total_mean": float(device_total[idx].mean()),
                        }
                    ),
                )
            )
    return Profile(
        first=first,
        last=last,
        steps=len(in_range),
        step_mean=float(durations.mean()) if len(durations) else 0.0,
        step_median=float(np.median(durations)) if len(durations) else 0.0,
        rows=rows if phases is None else [r for r in rows if r.phase in phases],
        time=_step_time(rows, in_range),
        on_device=device is not None,
    )


def _device_times(
    recording: Recording, calls: np.ndarray, first: int, last: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """Each call row's device self and total time (NaN where it has none), or None
    where no call in the range was timed on a device."""
    timed = recording.device_times(first, last)
    if not len(timed) or not len(calls):
        return None
    key = calls["call"].astype(np.int64) * 4 + calls["phase"]
    timed_key = timed["call"].astype(np.int64) * 4 + timed["phase"]
    order = np.argsort(timed_key, kind="stable")
    at = np.searchsorted(timed_key[order], key).clip(0, len(timed) - 1)
    found = timed_key[order][at] == key
    rows = order[at]
    nan = np.full(len(calls), np.nan)
    return (
        np.where(found, timed["self"][rows], nan),
        np.where(found, timed["total"][rows], nan),
    )


def _step_time(rows: list[ProfileRow], steps: np.ndarray) -> StepTime:
    """The time model's parts per step, from the self times of every row."""
    n = max(len(steps), 1)
    sums = {"forward": 0.0, "backward": 0.0, "loss": 0.0, "optimizer": 0.0}
    for r in rows:
        total = r.self_mean * r.steps / n
        if r.module.is_loss:
            sums["loss"] += total
        elif r.module.is_optimizer:
            sums["optimizer"] += total
        elif r.phase == Phase.BWD:
            sums["backward"] += total
        else:
            sums["forward"] += total
    step = float((steps["end"] - steps["start"]).sum()) / n
    return StepTime(
        step=step,
        outside=max(step - sum(sums.values()), 0.0),
        hookdbg=float(steps["overhead"].sum()) / n,
        **sums,
    )
