"""The step bar: where we are among the recorded steps, and whether the run goes on."""

from __future__ import annotations

import math

from rich.text import Text
from textual import events
from textual.reactive import reactive
from textual.widget import Widget

from .messages import Goto

SKIPPED = "skipped by the GradScaler (inf/NaN gradients, expected under fp16)"
SKIPPED_SHORT = "skipped by the GradScaler"


class StepBar(Widget):
    """The current step (and whether AMP's GradScaler skipped it), a timeline of all
    recorded steps (◆ marks a step where a NaN/inf was born; a click goes to a step) and
    the state of a followed run."""

    COMPONENT_CLASSES = {
        "step-bar--step",
        "step-bar--dim",
        "step-bar--here",
        "step-bar--alert",
        "step-bar--live",
        "step-bar--ended",
        "step-bar--skipped",
    }

    steps: reactive[tuple[int, ...]] = reactive(())
    current: reactive[int | None] = reactive(None)
    alert_steps: reactive[frozenset[int]] = reactive(frozenset())
    skipped_steps: reactive[frozenset[int]] = reactive(frozenset())  # by AMP's GradScaler
    live: reactive[str] = reactive("")  # "● following", "recording finished (...)", ""
    unit: reactive[str] = reactive("step")  # or "eval batch"
    other_unit: reactive[str] = reactive("")  # "4 eval batches (e)": the other kind, if any

    def __init__(self, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._timeline_at = 0  # where the timeline starts, in cells
        self._per = 1  # steps per timeline cell

    def _style(self, name: str) -> str:
        return str(self.get_component_rich_style(f"step-bar--{name}", partial=True))

    def render(self) -> Text:
        steps = self.steps
        if not steps:
            text = Text(
                f"no recorded {self.unit}es yet"
                if self.unit.endswith("batch")
                else "no recorded steps yet",
                style=self._style("dim"),
            )
            if self.other_unit:
                text.append(f"   {self.other_unit}", style=self._style("dim"))
            if self.live:
                text.append(f"   {self.live}", style=self._style("live"))
            return text
        step = self.current
        pos = steps.index(step) if step in steps else 0
        text = Text(f" {self.unit} {step} ", style=self._style("step"))
        text.append(f"  {pos + 1:,} of {len(steps):,}  ", style=self._style("dim"))
        if self.other_unit:
            text.append(f"{self.other_unit}  ", style=self._style("dim"))
        if step in self.skipped_steps:  # the long words where the timeline keeps room
            room = self.size.width - len(text) - len(self.live) - 20
            said = SKIPPED if len(SKIPPED) <= room else SKIPPED_SHORT
            text.append(f"{said}  ", style=self._style("skipped"))
        live = Text(
            f"  {self.live}", style=self._style("live" if "follow" in self.live else "ended")
        )
        width = max(10, self.size.width - len(text) - (len(live) if self.live else 0) - 1)
        self._timeline_at = len(text)
        self._per = max(1, math.ceil(len(steps) / width))
        text.append_text(self._timeline(pos))
        if self.live:
            text.append_text(live)
        return text

    def _timeline(self, pos: int) -> Text:
        steps, per = self.steps, self._per
        alert_steps = self.alert_steps
        out = Text()
        for start in range(0, len(steps), per):
            chunk = steps[start : start + per]
            if start <= pos < start + per:
                out.append("▲", style=self._style("here"))
            elif alert_steps.intersection(chunk):
                out.append("◆", style=self._style("alert"))
            else:
                out.append("·", style=self._style("dim"))
        return out

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or not self.steps:
            return
        cell = offset.x - self._timeline_at
        if cell >= 0 and cell * self._per < len(self.steps):
            self.post_message(Goto(step=self.steps[cell * self._per]))
