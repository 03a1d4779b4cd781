"""A module tree line that fits its pane without cutting a number.

On the left the marks (``◆NaN``, ``⚠3``), the module's name and its type; on the
right the numbers, right-aligned as htop's columns are, its time share last so that
every line's share stands at the pane's edge. Where the pane is too narrow the type
goes first, then a container's ``self`` share, then the name is cut (``encod…``), and
only then whole numbers, the least wanted first: a number is dropped, never cut, so
``Σ18%`` never reads as ``Σ1``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.text import Text

NAME_AT_LEAST = 2  # characters of a cut name, before its "…"


@dataclass(frozen=True)
class Number:
    """A number on the right of a line; of two that do not fit, the lower ``keep``
    goes first."""

    text: Text
    keep: int


@dataclass(frozen=True)
class TreeLine:
    marks: Text  # before the name: never left out
    name: Text
    type: Text  # "Linear", dimmed
    numbers: tuple[Number, ...] = ()  # in the order shown, left to right


def _right(numbers: list[Number]) -> Text:
    return Text(" ").join(n.text for n in numbers)


def _cut(name: Text, width: int) -> Text:
    """The name in ``width`` cells, with "…" where it is cut."""
    if cell_len(name.plain) <= width:
        return name
    cut = name.copy()
    cut.truncate(max(width - 1, 0))
    cut.append("…", style=name.style)
    return cut


def fit(line: TreeLine, room: int) -> Text:
    """The line in ``room`` cells: the left part, spaces, the right part ending at the
    edge. What does not fit is left out as the module docstring says."""
    numbers = list(line.numbers)
    with_type = bool(line.type.plain)
    full = line.name.cell_len

    def others() -> int:
        """Cells of all but the name."""
        typed = 1 + line.type.cell_len if with_type else 0
        return line.marks.cell_len + typed + (1 + _right(numbers).cell_len if numbers else 0)

    def drop_a_number() -> None:
        numbers.remove(min(numbers, key=lambda n: n.keep))

    if full + others() > room:
        with_type = False
    while full + others() > room and any(n.keep <= 1 for n in numbers):
        drop_a_number()
    shortest = min(full, NAME_AT_LEAST + 1)
    while shortest + others() > room and numbers:
        drop_a_number()
    shown = Text.assemble(line.marks, _cut(line.name, max(room - others(), shortest)))
    if with_type:
        shown.append(" ")
        shown.append_text(line.type)
    if numbers:
        right = _right(numbers)
        shown.append(" " * max(room - shown.cell_len - right.cell_len, 1))
        shown.append_text(right)
    return shown


def whole(line: TreeLine) -> Text:
    """All of a line, as the pane had room for it."""
    shown = Text.assemble(line.marks, line.name, " ", line.type)
    for number in line.numbers:
        shown.append(" ")
        shown.append_text(number.text)
    return shown
