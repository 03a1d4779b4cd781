"""Running a user's script or module the way ``python`` would, with a recorder on.

``sys.argv``, ``sys.path[0]``, ``__name__ == "__main__"`` and ``-m`` behave as under
python; the script's output is untouched, and its exit status comes back: 0, its
``sys.exit`` code, 1 after an uncaught exception (printed as python prints it, without
hookdbg's frames), 130 after Ctrl-C, 3 when ``--on-nan stop`` stopped it.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from hookdbg.recorder.actions import NonFiniteStop
from hookdbg.recorder.core import Recorder, RecordError, status_prefix

STOPPED = 3  # exit status after --on-nan stop

_HOOKDBG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Target:
    """What to run: a script path, or a module name (``-m``)."""

    name: str
    as_module: bool = False

    def check(self) -> None:
        """Fail early, before any file is created, if the target cannot be found."""
        if self.as_module:
            with _sys_path_first(os.getcwd()):
                try:
                    spec = importlib.util.find_spec(self.name)
                except (ImportError, ValueError) as exc:
                    raise RecordError(f"cannot find module {self.name!r}: {exc}") from None
            if spec is None:
                raise RecordError(f"no module named {self.name!r} (from {os.getcwd()})")
        elif not Path(self.name).is_file():
            what = "is a directory, not a script" if Path(self.name).is_dir() else "not found"
            raise RecordError(f"script {self.name!r} {what}")

    @property
    def stem(self) -> str:
        return self.name.rpartition(".")[2] if self.as_module else Path(self.name).stem


def run(target: Target, args: list[str], recorder: Recorder) -> int:
    """Run ``target`` (already ``check()``-ed) with ``args`` under ``recorder`` (already
    started), close the recorder, and return the exit status."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    status, code, message = "complete", 0, ""
    try:
        if target.as_module:
            sys.argv = [target.name, *args]  # runpy puts the module's file in argv[0]
            sys.path[0] = os.getcwd()
            runpy.run_module(target.name, run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(target.name)
            sys.argv = [target.name, *args]
            sys.path[0] = os.path.dirname(script)
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc)
    except NonFiniteStop as exc:
        status, code, message = "stopped", STOPPED, str(exc)
        prefix = status_prefix()
        print(
            f"{prefix}stopped at the first NaN/inf origin (--on-nan stop): {exc}\n"
            f"{prefix}the recording is complete; see `hookdbg alerts {recorder.path}`",
            file=sys.stderr,
        )
    except KeyboardInterrupt as exc:
        _print_user_traceback(exc)
        status, code, message = "interrupted", 130, "KeyboardInterrupt"
    except BaseException as exc:
        _print_user_traceback(exc)
        status, code, message = "exception", 1, f"{type(exc).__name__}: {exc}"
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        recorder.close(status, code, message)
    return code


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)  # python prints a non-int exit value and exits 1
    return 1


def _print_user_traceback(exc: BaseException) -> None:
    """The traceback python would print: hookdbg's and runpy's frames left out."""
    tb = exc.__traceback__
    while tb is not None and _internal(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    sys.stdout.flush()
    traceback.print_exception(type(exc), exc, tb, file=sys.stderr)


def _internal(filename: str) -> bool:
    if filename == "<frozen runpy>" or os.path.basename(filename) == "runpy.py":
        return True
    return os.path.abspath(filename).startswith(_HOOKDBG_DIR)


class _sys_path_first:
    def __init__(self, entry: str) -> None:
        self.entry = entry

    def __enter__(self) -> None:
        sys.path.insert(0, self.entry)

    def __exit__(self, *exc: object) -> None:
        sys.path.remove(self.entry)
