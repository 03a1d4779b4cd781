"""``hookdbg tensor``: the full values of a tensor stored by --capture or the flight recorder."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import numpy as np
from rich.text import Text

from hookdbg.cli.common import BadInput, human_bytes, plural
from hookdbg.cli.output import (
    console,
    emit_json,
    json_option,
    literal,
    note,
    open_or_fail,
    rank_option,
    table,
)
from hookdbg.read import Capture
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
    help="Save the tensor to FILE (numpy .npy format) instead of printing it.",
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
    try:
        target = rec.modules.resolve(module)
    except LookupError as exc:
        raise BadInput(f"{exc} (`hookdbg summary {recording}` lists them)") from None
    stored = rec.captured(target.id, step)
    where = f"{target.name}" + (f" at step {step}" if step is not None else "")
    if not stored:
        held = sorted({rec.modules.name(int(m)) for m in rec.captures["module"]})
        hint = (
            f"; it has tensors of {', '.join(held[:4])}{' ...' if len(held) > 4 else ''}"
            if held
            else "; record with --capture GLOB to store some"
        )
        raise BadInput(f"{recording} holds no full tensors of {where}{hint}")
    if slot is None:
        _list(stored, where, as_json)
        return
    try:
        wanted_slot, wanted_path = parse_slot_label(slot)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    matches = [c for c in stored if c.slot == wanted_slot and c.path == wanted_path]
    calls = sorted({(c.step, c.call) for c in matches})
    if not matches:
        have = ", ".join(sorted({c.label for c in stored}))
        raise BadInput(f"no stored {slot} of {where}; stored: {have}")
    if call_index >= len(calls):
        raise BadInput(f"--call {call_index}: only {plural(len(calls), 'stored call')} of {where}")
    chosen = next(c for c in matches if (c.step, c.call) == calls[call_index])
    values = rec.tensor(chosen)
    if npy:
        _save(values, Path(npy))
        note(
            f"saved {chosen.module.name} {chosen.label} of step {chosen.step} "
            f"{values.shape} {values.dtype} to {npy}"
        )
        return
    if as_json:
        emit_json(
            {
                "module": chosen.module.name,
                "step": chosen.step,
                "slot": chosen.label,
                "phase": chosen.phase.label,
                "dtype": chosen.dtype,
                "shape": list(chosen.shape),
                "values": values.tolist(),
            }
        )
        return
    out = console()
    out.print(
        literal(
            f"{chosen.module.name} {chosen.label}, step {chosen.step} "
            f"({chosen.phase.label}, from the {chosen.source}): {values.dtype} "
            f"{values.shape}"
        )
    )
    if np.issubdtype(values.dtype, np.floating) and values.size:
        bad = ~np.isfinite(values)
        out.print(
            f"  NaN {int(np.isnan(values).sum()):,}, inf {int(np.isinf(values).sum()):,}"
            + (
                f"; first non-finite at index {tuple(int(i) for i in np.argwhere(bad)[0])}"
                if bad.any()
                else ""
            )
        )
    with np.printoptions(threshold=sys.maxsize if full else 200, linewidth=120, precision=5):
        out.print(Text(np.array2string(values)))


def _save(values: np.ndarray, path: Path) -> None:
    """np.save to exactly ``path`` (np.save given a name would add .npy to it)."""
    if not path.parent.is_dir():
        raise BadInput(f"cannot write {path}: no directory {path.parent}")
    try:
        with open(path, "wb") as f:
            np.save(f, values, allow_pickle=False)
    except OSError as exc:
        raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None


def _list(stored: list[Capture], where: str, as_json: bool) -> None:
    if as_json:
        emit_json(
            {
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
        )
        return
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
    console().print(t)
