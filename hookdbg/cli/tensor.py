"""``hookdbg tensor``: the full values of a tensor stored by --capture or the flight recorder."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np
from rich.text import Text

from hookdbg.analysis.captures import modules_stored, nonfinite, stored_calls
from hookdbg.cli.common import BadInput, human_bytes, plural
from hookdbg.cli.inputs import open_or_fail, rank_option, resolve_or_fail
from hookdbg.cli.report import Report, emit, json_option
from hookdbg.cli.tables import table
from hookdbg.cli.terminal import Output, literal, note
from hookdbg.read import Capture, Recording
from hookdbg.store.schema import parse_slot_label


@click.command(
    epilog="""\b
Examples:
  hookdbg tensor run.h5 model.standardize                  # what is stored for it
  hookdbg tensor run.h5 standardize --step 3 --slot output
  hookdbg tensor run.h5 standardize --step 3 --slot 'input[0]' --npy x.npy"""
)
@click.argument("recording")
@rank_option
@click.argument("module")
@click.option("--step", type=int, metavar="N", help="Only tensors of step N.")
@click.option(
    "--slot",
    metavar="SLOT",
    help="Which tensor: input[0], output, grad_output, grad_input[0], "
    "param_grad[weight]... (as `hookdbg show` writes them).",
)
@click.option(
    "--call",
    "call_index",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    metavar="K",
    help="The Kth stored call of the module in the step, for modules called twice.",
)
@click.option(
    "--npy",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Save the tensor to FILE (numpy .npy format) instead of printing it; without "
    "--slot, the one tensor stored (several: it says which there are).",
)
@click.option("--full", is_flag=True, help="Print every value, not an abbreviation.")
@json_option
def tensor(
    recording: str,
    rank: int | None,
    module: str,
    step: int | None,
    slot: str | None,
    call_index: int,
    npy: str | None,
    full: bool,
    as_json: bool,
) -> None:
    """List the full tensors RECORDING holds for MODULE, or print one (--slot).

    Tensors are stored by `hookdbg record --capture GLOB`, and by the flight recorder
    around a NaN/inf origin."""
    rec = open_or_fail(recording, quiet=as_json, rank=rank)
    target = resolve_or_fail(rec, module, recording)
    stored = rec.captured(target.id, step)
    where = f"{target.name}" + (f" at step {step}" if step is not None else "")
    if not stored:
        raise BadInput(f"{recording} holds no full tensors of {where}{_stored_hint(rec)}")
    if slot is None and not npy:
        emit(StoredTensors(stored, where), as_json=as_json)
        return
    chosen = _choose(stored, slot, call_index, where) if slot is not None else _only(stored, where)
    values = rec.tensor(chosen)
    if npy:
        _save(values, Path(npy))
        note(
            f"saved {chosen.module.name} {chosen.label} of step {chosen.step} "
            f"{values.shape} {values.dtype} to {npy}"
        )
    else:
        emit(TensorValues(chosen, values, full), as_json=as_json)


def _stored_hint(rec: Recording) -> str:
    """What to try instead when a module holds no stored tensors."""
    held = modules_stored(rec)
    if not held:
        return "; record with --capture GLOB to store some"
    return f"; it has tensors of {', '.join(held[:4])}{' ...' if len(held) > 4 else ''}"


def _choose(stored: list[Capture], slot: str, call_index: int, where: str) -> Capture:
    """The stored tensor --slot and --call ask for, or exit 2 saying what is stored."""
    try:
        wanted_slot, wanted_path = parse_slot_label(slot)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    calls = stored_calls(stored, wanted_slot, wanted_path)
    if not calls:
        have = ", ".join(sorted({c.label for c in stored}))
        raise BadInput(f"no stored {slot} of {where}; stored: {have}")
    if call_index >= len(calls):
        raise BadInput(f"--call {call_index}: only {plural(len(calls), 'stored call')} of {where}")
    return calls[call_index]


def _only(stored: list[Capture], where: str) -> Capture:
    """The one tensor --npy saves without --slot: the only one stored, or exit 2 saying
    what to choose from."""
    if len(stored) == 1:
        return stored[0]
    labels = sorted({c.label for c in stored})
    steps = sorted({c.step for c in stored})
    pick = "--slot" if len(steps) == 1 else "--slot and --step"
    shown = ", ".join(labels[:6]) + (" ..." if len(labels) > 6 else "")
    raise BadInput(
        f"--npy saves one tensor, and {where} has {plural(len(stored), 'stored tensor')} "
        f"({shown}{'' if len(steps) == 1 else f'; steps {steps[0]}-{steps[-1]}'}): "
        f"choose one with {pick}"
    )


def _save(values: np.ndarray, path: Path) -> None:
    """np.save to exactly ``path`` (np.save given a name would add .npy to it)."""
    if not path.parent.is_dir():
        raise BadInput(f"cannot write {path}: no directory {path.parent}")
    try:
        with open(path, "wb") as f:
            np.save(f, values, allow_pickle=False)
    except OSError as exc:
        raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None


@dataclass
class TensorValues(Report):
    """One stored tensor's values (abbreviated unless ``full``)."""

    chosen: Capture
    values: np.ndarray
    full: bool

    def to_json(self) -> dict[str, object]:
        chosen, values = self.chosen, self.values
        return {
            "module": chosen.module.name,
            "step": chosen.step,
            "slot": chosen.label,
            "phase": chosen.phase.label,
            "dtype": chosen.dtype,
            "shape": list(chosen.shape),
            "values": values.tolist(),
        }

    def render(self, out: Output) -> None:
        chosen, values = self.chosen, self.values
        out.print(
            literal(
                f"{chosen.module.name} {chosen.label}, step {chosen.step} "
                f"({chosen.phase.label}, from the {chosen.source}): {values.dtype} "
                f"{values.shape}"
            )
        )
        bad = nonfinite(values)
        if bad is not None:
            out.print(
                f"  NaN {bad.nan:,}, inf {bad.inf:,}"
                + ("" if bad.first is None else f"; first non-finite at index {bad.first}")
            )
        with np.printoptions(
            threshold=sys.maxsize if self.full else 200, linewidth=120, precision=5
        ):
            out.print(Text(np.array2string(values)))


@dataclass
class StoredTensors(Report):
    """What full tensors a recording holds for a module (``where``: it, at a step)."""

    stored: list[Capture]
    where: str

    def to_json(self) -> dict[str, object]:
        stored = self.stored
        return {
            "tensors": [
                {
                    "step": c.step,
                    "phase": c.phase.label,
                    "slot": c.label,
                    "dtype": c.dtype,
                    "shape": list(c.shape),
                    "bytes": c.nbytes,
                    "source": c.source,
                }
                for c in stored
            ]
        }

    def render(self, out: Output) -> None:
        stored, where = self.stored, self.where
        t = table(
            f"full tensors of {where}",
            [("step", "right"), "phase", "slot", "shape", "dtype", ("size", "right"), "from"],
        )
        for c in stored:
            t.add_row(
                str(c.step),
                c.phase.label,
                c.label,
                str(c.shape),
                c.dtype,
                human_bytes(c.nbytes),
                c.source,
            )
        out.print(t)
