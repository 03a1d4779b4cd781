"""The tables and numbers of text reports: plain rich tables whose cells are data, and
a tensor summary row as a table row or as JSON."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from hookdbg.cells import CHANGED_NOTE, FRACTIONS, STATS, label, shape_text, tensor_text
from hookdbg.cli.terminal import printable_lines
from hookdbg.read import Recording
from hookdbg.store.schema import CHANGED_IN_PLACE, SUMMARY_COLUMNS, Phase, Slot
from hookdbg.text import printable, utf8


class DataTable(Table):
    """A table whose title and string cells are shown as they are: module names, slots
    (``param_grad[weight]``) and queries are data, not rich markup, and their control
    characters print escaped."""

    def add_row(self, *cells: Any, **kwargs: Any) -> None:  # type: ignore[override]
        super().add_row(*(Text(printable(c)) if isinstance(c, str) else c for c in cells), **kwargs)


def table(title: str | None, columns: Sequence[str | tuple[str, str]]) -> Table:
    """A plain table; a column given as (name, "right") is right-aligned."""
    t = DataTable(
        title=Text(printable_lines(title)) if title is not None else None,
        box=box.SIMPLE_HEAD,
        title_justify="left",
        pad_edge=False,
    )
    for col in columns:
        name, justify = (col, "left") if isinstance(col, str) else col
        t.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    return t


def ms(seconds: float) -> str:
    """Seconds as milliseconds, to the microsecond: how every report writes a time."""
    return f"{seconds * 1e3:.3f}"


def step_text(rec: Recording, row: Any) -> str:
    """The step column of a row: its step number, or 'eval N' for an eval batch."""
    if "segment" in row.dtype.names:
        label = rec.segment_label(int(row["segment"]))
        if label.startswith("eval batch "):
            return "eval " + label.removeprefix("eval batch ")
    return str(int(row["step"]))


def tensor_table(
    title: str | None,
    rows: Any,
    rec: Recording,
    *,
    module_column: bool = True,
    call_index: dict[int, int] | None = None,
) -> Table:
    """Tensor summary rows as a table: where (step, module, phase, slot) and statistics;
    with ``call_index`` (call id -> nth call of its module in the step), which call."""
    cols: list[str | tuple[str, str]] = [("step", "right")]
    if call_index is not None:
        cols.append(("call", "right"))
    if module_column:
        cols.append("module")
    cols += [
        "phase",
        "slot",
        "shape",
        "dtype",
        *((label(name), "right") for name in STATS),
        ("nan/inf", "right"),
        *((label(name), "right") for name in FRACTIONS),
    ]
    t = table(title, cols)
    for r in rows:
        text = tensor_text(r)
        cells: list[str | Text] = [step_text(rec, r)]
        if call_index is not None:
            index = call_index.get(int(r["call"]))
            cells.append("-" if index is None else str(index))
        if module_column:
            cells.append(rec.modules.name(int(r["module"])))
        cells += [
            text.phase,
            text.slot,
            text.shape,
            text.dtype,
            *(text.stat(name) for name in STATS),
            Text(text.count, style="bold red") if text.nonfinite > 0 else text.count,
            *(text.fractions[name] for name in FRACTIONS),
        ]
        if text.nonfinite == CHANGED_IN_PLACE:
            t.caption = CHANGED_NOTE
        t.add_row(*cells)
    return t


def tensor_json(row: Any, rec: Recording) -> dict[str, object]:
    """A tensor summary row as JSON: where it was taken, and its statistics."""
    label = rec.segment_label(int(row["segment"])) if "segment" in row.dtype.names else ""
    out: dict[str, object] = {
        "step": int(row["step"]),
        "eval_batch": int(label.removeprefix("eval batch ")) if label.startswith("eval") else None,
        "module": rec.modules.name(int(row["module"])),
        "phase": Phase(int(row["phase"])).label,
        "slot": Slot(int(row["slot"])).label,
        "path": utf8(row["path"]),
    }
    for name in SUMMARY_COLUMNS:
        if name in row.dtype.names and name != "device":
            value = row[name]
            out[name] = shape_text(value) if name == "shape" else value
    if "nan" in row.dtype.names:
        out["changed_in_place"] = bool(row["nan"] == CHANGED_IN_PLACE)
    return out
