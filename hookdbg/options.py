"""What to record: level, module selection, step sampling. Shared by the CLI and the API.

Parsing lives here (not in the CLI) so that ``hookdbg.record(...)`` and
``hookdbg record`` reject the same bad input with the same message.
"""

from __future__ import annotations

import fnmatch
import math
import numbers
import re
from dataclasses import dataclass, field
from enum import IntEnum

from hookdbg.store.schema import MAX_HISTOGRAM_BINS, NAME_BYTES


class OptionError(ValueError):
    """An option value that cannot be used; the message says what is wrong and what works,
    naming options as ``hookdbg record`` spells them (``as_keywords`` for the Python API)."""

    def as_keywords(self) -> OptionError:
        """The same error naming the keyword arguments of ``hookdbg.record``."""
        return OptionError(_FLAG.sub(_keyword, str(self)))


_FLAG = re.compile(r"--(no-)?([a-z][a-z-]*)")
_KEYWORDS = {
    "capture-budget": "capture_budget_mb",
    "flight-recorder": "flight_recorder_mb",
    "max-backlog": "max_backlog_mb",
}


def _keyword(match: re.Match[str]) -> str:
    negated, flag = match.groups()
    name = _KEYWORDS.get(flag, flag.replace("-", "_"))
    if flag == "nan-check":
        return f"{name}={not negated}"
    return name


class Level(IntEnum):
    """How much to record per module call; each level includes the ones before it."""

    TIMING = 0  # forward/backward times only
    SHAPES = 1  # + shape, dtype, device of every tensor
    STATS = 2  # + min/max/mean/std/norm/NaN/inf/zero fraction, NaN/inf alerts

    @classmethod
    def parse(cls, text: str | Level) -> Level:
        if isinstance(text, Level):
            return text
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise OptionError(
                f"unknown level {text!r}; use one of: timing, shapes, stats"
            ) from None


@dataclass(frozen=True)
class StepRange:
    """Steps ``start <= step < stop`` (``stop`` None: to the end), written ``A:B``."""

    start: int = 0
    stop: int | None = None

    @classmethod
    def parse(cls, text: str | StepRange | None) -> StepRange:
        if text is None:
            return cls()
        if isinstance(text, StepRange):
            return text
        m = re.fullmatch(r"\s*(\d*)\s*(:?)\s*(\d*)\s*", text)
        if not m or (not m.group(2) and not m.group(1)):
            raise OptionError(f"bad step range {text!r}; write A:B (steps A to B-1), A: , :B or N")
        start = int(m.group(1)) if m.group(1) else 0
        if not m.group(2):  # a single step N
            return cls(start, start + 1)
        stop = int(m.group(3)) if m.group(3) else None
        if stop is not None and stop <= start:
            raise OptionError(f"empty step range {text!r}: B must be greater than A in A:B")
        return cls(start, stop)

    def __contains__(self, step: int) -> bool:
        return step >= self.start and (self.stop is None or step < self.stop)

    def __str__(self) -> str:
        return f"{self.start}:{'' if self.stop is None else self.stop}"


MAX_GLOBS = 64  # module globs one option may give: each is matched against every module


@dataclass(frozen=True)
class ModuleFilter:
    """Glob selection of modules; ``!GLOB`` excludes. A glob matches a module's full
    name (``model.layer3.0.conv1``) or its path inside its model (``layer3.0.conv1``)."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @classmethod
    def parse(cls, globs: str | tuple[str, ...] | list[str] | None) -> ModuleFilter:
        """From globs (a single one may come as a plain string)."""
        include: list[str] = []
        exclude: list[str] = []
        if isinstance(globs, str):
            globs = [globs]
        elif globs is not None and not isinstance(globs, (list, tuple)):
            raise OptionError(f"module globs must be strings like 'layer3.*', not {globs!r}")
        if globs is not None and len(globs) > MAX_GLOBS:
            raise OptionError(f"{len(globs):,} module globs: at most {MAX_GLOBS} may be given")
        for glob in globs or ():
            if not isinstance(glob, str):
                raise OptionError(f"module globs must be strings like 'layer3.*', not {glob!r}")
            if len(glob) > NAME_BYTES:  # longer than any name it could match
                raise OptionError(
                    f"a module glob of {len(glob):,} characters: at most {NAME_BYTES}, as names"
                )
            pattern = glob.strip()
            negate = pattern.startswith("!")
            pattern = pattern[1:].strip() if negate else pattern
            if not pattern:
                raise OptionError(f"empty module glob {glob!r}; write e.g. 'layer3.*' or '!*.bn*'")
            (exclude if negate else include).append(pattern)
        return cls(tuple(include), tuple(exclude))

    def selects(self, name: str, path: str) -> bool:
        def hit(patterns: tuple[str, ...]) -> bool:
            return any(
                fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(path, p) for p in patterns
            )

        if self.include and not hit(self.include):
            return False
        return not hit(self.exclude)

    def unmatched(self, names: list[tuple[str, str]]) -> list[str]:
        """Include globs that matched none of ``(name, path)``: almost always a typo."""
        return [
            p
            for p in self.include
            if not any(fnmatch.fnmatchcase(n, p) or fnmatch.fnmatchcase(q, p) for n, q in names)
        ]

    def __str__(self) -> str:
        return " ".join([*self.include, *(f"!{p}" for p in self.exclude)]) or "*"


ON_NAN_ACTIONS = ("record", "warn", "break", "raise", "stop")
ON_HEADROOM_ACTIONS = ("warn", "break", "raise", "stop")
ZOOM_STEPS = 5  # the steps ``--on-nan record`` records at stats after an unchecked NaN
MAX_ZOOM = 100_000


def on_nan_action(text: str) -> tuple[str, int]:
    """``--on-nan``'s action and, for ``record[=N]``, the steps it records."""
    action, equals, steps = text.partition("=")
    if action not in ON_NAN_ACTIONS or (equals and action != "record"):
        raise OptionError(
            f"unknown --on-nan action {text!r}; use one of: record[=N], "
            f"{', '.join(ON_NAN_ACTIONS[1:])}"
        )
    if not equals:
        return action, ZOOM_STEPS
    if not steps.isdigit() or not 1 <= int(steps) <= MAX_ZOOM:
        raise OptionError(
            f"--on-nan record=N takes the steps to record, 1 to {MAX_ZOOM:,}, not {steps!r}"
        )
    return action, int(steps)


MB = 1 << 20

# Sane ranges for numeric options: beyond them a value is a typo (or inf/nan), and some
# would break the recorder (a flush interval of 1e300 s overflows the writer's timer).
FLUSH_SECONDS = (0.001, 3600.0)
MAX_MB = 1_000_000.0  # 1 TB of memory for captured tensors is already beyond any machine


def number(option: str, value: object, unit: str, low: float, high: float) -> float:
    """``value`` as a finite number in ``[low, high]``, or an OptionError naming the
    option, the range and the unit."""
    if _finite(value) and low <= float(value) <= high:  # type: ignore[arg-type]
        return float(value)  # type: ignore[arg-type]
    raise OptionError(f"{option} must be from {low:,g} to {high:,.0f} {unit}, not {value!r}")


def megabytes(option: str, value: object, *, off: bool) -> int:
    """A memory budget given in MB, as bytes; with ``off``, 0 is allowed (and turns it
    off), else the budget must be more than 0."""
    mb = float(value) if _finite(value) else math.nan  # type: ignore[arg-type]
    if (0 < mb <= MAX_MB) or (off and mb == 0):
        return int(mb * MB)
    allowed = "0 (off) or a number of MB" if off else "a number of MB above 0"
    raise OptionError(f"{option} must be {allowed} up to {MAX_MB:,.0f}, not {value!r}")


def histogram_bins(value: object) -> int:
    """``--histograms N`` as typed (text or a number): a whole number of bins from 1
    to MAX_HISTOGRAM_BINS, or an OptionError saying so."""
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, str) and re.fullmatch(r"[+]?\d{1,7}", text):
        text = int(text)
    if (
        isinstance(text, numbers.Integral)
        and not isinstance(text, bool)
        and 1 <= int(text) <= MAX_HISTOGRAM_BINS
    ):
        return int(text)
    raise OptionError(
        f"--histograms must be a whole number of bins from 1 to {MAX_HISTOGRAM_BINS:,}, "
        f"not {value!r}"
    )


def _finite(value: object) -> bool:
    """A real, finite number (not a bool, not a string, not NaN or infinity)."""
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def _fraction(value: object) -> bool:
    """A number in (0, 1] (``_finite``'s: not a bool, not NaN)."""
    return _finite(value) and 0 < float(value) <= 1  # type: ignore[arg-type]


@dataclass(frozen=True)
class RecordOptions:
    """Everything that shapes a recording, validated on construction."""

    level: Level = Level.STATS
    modules: ModuleFilter = field(default_factory=ModuleFilter)
    every: int = 1
    steps: StepRange = field(default_factory=StepRange)
    on_nan: str = "record"  # what a NaN/inf origin does
    zoom: int = ZOOM_STEPS  # steps "record" records at stats after a NaN seen unchecked
    headroom: float = 0.5  # the share of a reduced-range dtype's range that warns
    on_headroom: str = "warn"  # what a headroom warning does (recorder/alerts/headroom.py)
    # every tensor checked: None: at --level stats (below it, the sentinel's check
    # only); False: no check at all
    nan_check: bool | None = None
    capture: ModuleFilter | None = None  # modules whose full tensors are stored
    capture_steps: StepRange = field(default_factory=StepRange)
    capture_budget: int = 512 * MB
    flight_budget: int = 256 * MB  # 0 turns the flight recorder off
    flush_interval: float = 1.0
    max_backlog_bytes: int = 256 * MB  # rows waiting for the writer, and captured tensors
    quiet: bool = False
    histograms: int = 0  # bins of each tensor's value histogram (0: none)
    idle: bool = False  # no step recorded until steered (hookdbg ctl); the loss watched
    keep_last: int = 0  # recorded steps whose detail the file keeps (0: all)

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, numbers.Integral):
            raise OptionError(f"--every must be a whole number of steps, not {self.every!r}")
        if self.every < 1:
            raise OptionError(f"--every must be at least 1, not {self.every}")
        action, zoom = on_nan_action(self.on_nan)
        if action != self.on_nan:  # "record=N"
            object.__setattr__(self, "on_nan", action)
            object.__setattr__(self, "zoom", zoom)
        if self.on_headroom not in ON_HEADROOM_ACTIONS:
            raise OptionError(
                f"unknown --on-headroom action {self.on_headroom!r}; use one of: "
                f"{', '.join(ON_HEADROOM_ACTIONS)}"
            )
        if not _fraction(self.headroom):
            raise OptionError(
                f"--headroom must be a share of the range above 0 and at most 1, not "
                f"{self.headroom!r}"
            )
        if self.on_headroom != "warn" and not self.checks_nan:
            raise OptionError(
                f"--on-headroom {self.on_headroom} needs the statistics of --level stats"
            )
        number("--flush-interval", self.flush_interval, "seconds", *FLUSH_SECONDS)
        megabytes("--capture-budget", self.capture_budget / MB, off=False)
        megabytes("--flight-recorder", self.flight_budget / MB, off=True)
        megabytes("--max-backlog", self.max_backlog_bytes / MB, off=False)
        if self.on_nan not in ("record", "warn") and not self.sentinel:
            raise OptionError(f"--on-nan {self.on_nan} needs NaN checks: drop --no-nan-check")
        if self.idle and (self.steps != StepRange() or self.every != 1):
            raise OptionError(
                "--idle records no step until `hookdbg ctl` asks: drop --steps and --every"
            )
        if (
            isinstance(self.keep_last, bool)
            or not isinstance(self.keep_last, numbers.Integral)
            or self.keep_last < 0
        ):
            raise OptionError(
                f"--keep-last must be a whole number of steps (0: keep all), not {self.keep_last!r}"
            )
        if self.histograms is not None and self.histograms != 0:
            object.__setattr__(self, "histograms", histogram_bins(self.histograms))
            if self.level != Level.STATS:
                raise OptionError("--histograms needs --level stats (the bins span min to max)")
        else:
            object.__setattr__(self, "histograms", 0)  # None: off, like 0

    @property
    def checks_nan(self) -> bool:
        """Every tensor of a recorded step is checked for NaN/inf."""
        return self.level == Level.STATS if self.nan_check is None else self.nan_check

    @property
    def sentinel(self) -> bool:
        """NaN/inf are checked at all: where not in every tensor, by the sentinel
        (recorder/alerts/sentinel.py)."""
        return self.nan_check is not False

    @classmethod
    def build(
        cls,
        *,
        level: str | Level = Level.STATS,
        modules: str | tuple[str, ...] | list[str] | None = None,
        every: int = 1,
        steps: str | StepRange | None = None,
        capture: str | tuple[str, ...] | list[str] | None = None,
        capture_steps: str | StepRange | None = None,
        capture_budget_mb: float = 512,
        flight_recorder_mb: float = 256,
        max_backlog_mb: float = 256,
        **rest: object,
    ) -> RecordOptions:
        """Options from user-facing values (strings as typed, sizes in MB)."""
        return cls(
            level=Level.parse(level),
            modules=ModuleFilter.parse(modules),
            every=every,
            steps=StepRange.parse(steps),
            capture=ModuleFilter.parse(capture) if capture else None,
            capture_steps=StepRange.parse(capture_steps),
            capture_budget=megabytes("--capture-budget", capture_budget_mb, off=False),
            flight_budget=megabytes("--flight-recorder", flight_recorder_mb, off=True),
            max_backlog_bytes=megabytes("--max-backlog", max_backlog_mb, off=False),
            **rest,  # type: ignore[arg-type]
        )

    def records_step(self, step: int) -> bool:
        if self.idle:
            return False
        return step in self.steps and (step - self.steps.start) % self.every == 0

    def describe(self) -> dict[str, object]:
        """The options as plain values, for the recording's metadata."""
        return {
            "level": self.level.name.lower(),
            "modules": str(self.modules),
            "every": self.every,
            "steps": str(self.steps),
            "on_nan": f"record={self.zoom}" if self.on_nan == "record" else self.on_nan,
            "headroom": self.headroom,
            "on_headroom": self.on_headroom,
            "nan_check": self.checks_nan,
            "sentinel": self.sentinel,
            "capture": str(self.capture) if self.capture else "",
            "capture_steps": str(self.capture_steps),
            "capture_budget_mb": self.capture_budget / MB,
            "flight_recorder_mb": self.flight_budget / MB,
            "max_backlog_mb": self.max_backlog_bytes / MB,
            "flush_interval": self.flush_interval,
            "histograms": self.histograms,
            "idle": self.idle,
            "keep_last": self.keep_last,
        }
