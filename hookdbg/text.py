"""Small text helpers shared by the recorder's messages and the reports (the text of
a table cell is hookdbg/cells.py)."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """'512 B', '1.5 kB', '11.2 MB' (powers of 1000, like ls -h --si)."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 step', '3 steps', '2 matches' (with ``many`` for irregular plurals)."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def utf8(raw: bytes | str) -> str:
    """Text of a fixed-width string column. The recorder writes valid UTF-8, but a file
    is input like any other: bytes that are not UTF-8 become U+FFFD, not an error."""
    return raw if isinstance(raw, str) else bytes(raw).decode("utf-8", "replace")


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: bytes | str) -> str:
    """``text`` made safe to show on a terminal: control characters (ESC, CR, BEL, C1),
    line breaks and invisible format characters (bidi overrides, zero-width) are
    written as escapes (``\\x1b``, ``\\u202e``). Module names, paths and messages come
    from recordings and from users' models; printed raw, an ESC sequence in them would
    reach the terminal (retitle it, hide text, fake output). JSON output does not need
    this: JSON escapes control characters itself."""
    text = utf8(text)
    if text.isprintable():  # the common case, checked in C
        return text
    return "".join(c if c.isprintable() else _escaped(c) for c in text)


def printable_lines(text: str) -> str:
    """``printable`` line by line: a message's own line breaks stay line breaks."""
    return "\n".join(printable(line) for line in text.split("\n"))
