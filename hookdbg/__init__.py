"""hookdbg: a debugger and profiler for PyTorch training, built on PyTorch's own hooks.

Record from Python::

    import hookdbg
    with hookdbg.record("run.h5"):
        train()

or run a script unchanged: ``hookdbg record -o run.h5 train.py``.
"""

from __future__ import annotations

from hookdbg.version import __version__

__all__ = [
    "HeadroomError",
    "NonFiniteError",
    "NonFiniteStop",
    "RecordError",
    "Recorder",
    "RecordingError",
    "__version__",
    "open_recording",
    "open_run",
    "record",
]

_RECORDER_NAMES = {
    "record",
    "Recorder",
    "RecordError",
    "NonFiniteError",
    "NonFiniteStop",
    "HeadroomError",
}


def __getattr__(name: str) -> object:
    # torch is imported only when the recorder is used, so that the reader, the CLI
    # reports and the TUI start fast and work without it.
    if name in _RECORDER_NAMES:
        from hookdbg import recorder

        return getattr(recorder, name)
    if name in ("open_recording", "open_run", "RecordingError"):
        from hookdbg import read

        return getattr(read, name)
    raise AttributeError(f"module 'hookdbg' has no attribute {name!r}")
