"""The package version, in a module of its own: the recorder writes it into each
recording and the CLI prints it, and neither needs the package facade for that."""

__version__ = "0.1.0"


def per_call_path() -> str:
    """Which per-call path a recording started now takes, said without importing torch:
    C where its extensions are built for this Python (hookdbg/recorder/_hot.c and the
    row buffers of hookdbg/store/_pack.c), else Python, which costs several times more
    per module call."""
    import importlib.machinery
    import os
    from pathlib import Path

    if os.environ.get("HOOKDBG_PURE_PYTHON", "") not in ("", "0"):
        return "Python (HOOKDBG_PURE_PYTHON is set)"
    here = Path(__file__).parent
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    built = all(
        any((here / f"{name}{suffix}").exists() for suffix in suffixes)
        for name in ("recorder/_hot", "store/_pack")
    )
    if built:
        return "C"
    return "Python (the C extensions were not built: install with a C compiler for the C path)"
