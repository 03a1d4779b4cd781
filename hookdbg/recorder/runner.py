"""Running a user's script or module the way ``python`` would, with a recorder on.

``sys.argv``, ``sys.path[0]``, ``__main__`` and ``-m`` are what python gives the
script; its output is untouched, and how it ended comes back: status 0, its
``sys.exit`` code, 1 after an uncaught exception (printed by ``sys.excepthook`` as
python prints it, without the frames hookdbg adds: ``strip_hookdbg``), 130 after
Ctrl-C (``hookdbg record`` then ends by SIGINT, as python does), 3 when
``--on-nan stop`` stopped it.
"""

from __future__ import annotations

import builtins
import contextlib
import dis
import io
import os
import pkgutil
import runpy
import sys
import types
import zipfile
from importlib.machinery import SourceFileLoader, SourcelessFileLoader
from typing import Any, NamedTuple

from torch.nn import Module
from torch.nn.modules import module as torch_module

from hookdbg.recorder.alerts.actions import NonFiniteStop
from hookdbg.recorder.core import Recorder, status_prefix

STOPPED = 3  # exit status after --on-nan stop
INTERRUPTED = 130  # exit status after Ctrl-C, where dying by SIGINT is not possible

_HOOKDBG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the functions _call_impl defines: ``inner``, which it calls only while hooks are installed
_CALL_IMPL_INNER = tuple(
    c for c in Module._call_impl.__code__.co_consts if type(c) is types.CodeType
)
_GROUP: type[Any] | None = getattr(builtins, "BaseExceptionGroup", None)  # python 3.11+


class Ended(NamedTuple):
    """How the script ended: the recording's status and the exit status."""

    status: str
    code: int


def run(target: str, as_module: bool, args: list[str], recorder: Recorder) -> Ended:
    """Run ``target`` (a script path as typed, or a module name) with ``args`` under
    ``recorder`` (already started), close the recorder, and say how the script ended.
    ``sys.argv``, ``sys.path`` and ``__main__`` stay the script's, as under python,
    for its exit handlers."""
    status, code, message = "complete", 0, ""
    uncaught: BaseException | None = None
    try:
        sys.argv = [target, *args]
        if as_module:
            sys.path[0] = os.getcwd()
            _run_as_main(target, alter_argv=True)  # argv[0] becomes the module's file
        else:
            _run_script(target)
    except SystemExit as exc:
        code = _exit_code(exc)
    except NonFiniteStop as exc:
        status, code, message = "stopped", STOPPED, str(exc)
        prefix = status_prefix()
        print(
            f"{prefix}stopped {exc.where}: {exc}\n"
            f"{prefix}the recording is complete; see `hookdbg alerts {recorder.path}`",
            file=sys.stderr,
        )
    except KeyboardInterrupt as exc:
        uncaught = exc
        status, code, message = "interrupted", INTERRUPTED, "KeyboardInterrupt"
    except BaseException as exc:
        uncaught = exc
        status, code, message = "exception", 1, f"{type(exc).__name__}: {exc}"
    finally:
        recorder.close(status, code, message)
    if uncaught is not None:  # after the close: torch's hook registries are the script's
        _print_uncaught(uncaught)
    return Ended(status, code)


def _run_script(typed: str) -> None:
    """Run a script file as ``python SCRIPT`` does, in a new ``__main__`` module that
    stays ``__main__`` to the end (the script's exit handlers may pickle its classes).
    ``__file__`` and the code's file name are the path made absolute but not
    normalised, ``sys.path[0]`` the real directory of the script. A zip file runs its
    ``__main__.py``, through runpy as python does."""
    path = os.path.join(os.getcwd(), typed)
    if zipfile.is_zipfile(path):
        sys.path[0] = path
        _run_as_main("__main__", alter_argv=False)
        return
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    with io.open_code(path) as f:
        code = pkgutil.read_code(f)  # a .pyc file; None for source
    if code is None:
        with io.open_code(path) as f:
            code = compile(f.read(), path, "exec", dont_inherit=True)  # not our __future__
        loader: object = SourceFileLoader("__main__", path)
    else:
        loader = SourcelessFileLoader("__main__", path)
    main = _new_main()
    main.__dict__.update(__file__=path, __cached__=None, __loader__=loader)
    exec(code, main.__dict__)


def _run_as_main(name: str, *, alter_argv: bool) -> None:
    """Run a module as ``python -m`` runs it (and a zip file's ``__main__``): with
    runpy's own entry point for them, so that argv[0], ``__spec__`` and the frames of
    a traceback are python's."""
    _new_main()
    runpy._run_module_as_main(name, alter_argv=alter_argv)  # type: ignore[attr-defined]


def _new_main() -> types.ModuleType:
    """A fresh ``__main__`` with what python puts in one, instead of hookdbg's own."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __annotations__={})
    sys.modules["__main__"] = main
    return main


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)  # python prints a non-int exit value and exits 1
    return 1


def _print_uncaught(exc: BaseException) -> None:
    """What python does with an uncaught exception: stdout flushed, ``sys.last_*``
    set, then ``sys.excepthook`` (the script may have set its own), given the
    tracebacks python would have had."""
    strip_hookdbg(exc)
    with contextlib.suppress(Exception):  # a closed or broken stdout is the script's
        sys.stdout.flush()
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
    try:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    except Exception as failed:  # python's words when the script's hook fails
        strip_hookdbg(failed)
        print("Error in sys.excepthook:", file=sys.stderr)
        sys.__excepthook__(type(failed), failed, failed.__traceback__)
        print("\nOriginal exception was:", file=sys.stderr)
        sys.__excepthook__(type(exc), exc, exc.__traceback__)


def strip_hookdbg(exc: BaseException) -> None:
    """Give ``exc``, its causes, contexts and group members the tracebacks python
    would have given them: without hookdbg's frames (runner, wrappers, hooks), and
    without the frame torch's ``Module._call_impl`` adds only while some module hook
    is installed (``inner``) where no hook but hookdbg's was."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = _stripped(e.__traceback__)
        todo.extend(c for c in (e.__cause__, e.__context__) if c is not None)
        if _GROUP is not None and isinstance(e, _GROUP):
            todo.extend(e.exceptions)


def _stripped(tb: types.TracebackType | None) -> types.TracebackType | None:
    entries: list[tuple[types.FrameType, int, int]] = []
    while tb is not None:
        entries.append((tb.tb_frame, tb.tb_lasti, tb.tb_lineno))
        tb = tb.tb_next
    kept: list[tuple[types.FrameType, int, int]] = []
    for i, (frame, lasti, lineno) in enumerate(entries):
        if _internal(frame.f_code.co_filename):
            continue
        callee = entries[i + 1][0] if i + 1 < len(entries) else None
        fast = _fast_path(frame, kept[-1][0] if kept else None, callee)
        if fast is not None:
            kept[-1] = (kept[-1][0], *fast)  # _call_impl, where python would have been
            continue
        kept.append((frame, lasti, lineno))
    result = None
    for frame, lasti, lineno in reversed(kept):
        result = types.TracebackType(result, frame, lasti, lineno)
    return result


def _fast_path(
    frame: types.FrameType, caller: types.FrameType | None, callee: types.FrameType | None
) -> tuple[int, int] | None:
    """Where python would have been in ``caller`` (torch's ``_call_impl``) if
    ``frame`` is the ``inner`` it called only because hookdbg's hooks were installed
    (the module had none of its own and no global one is left) and ``inner`` was
    calling ``forward`` (not a hook): the position of ``_call_impl``'s hookless
    ``return forward_call(...)``, as (lasti, lineno). None otherwise."""
    code = frame.f_code
    if (
        caller is None
        or callee is None
        or _internal(callee.f_code.co_filename)
        or code not in _CALL_IMPL_INNER
        or caller.f_code is not Module._call_impl.__code__
    ):
        return None
    module = caller.f_locals.get("self")
    if not isinstance(module, Module) or _hooks_installed(module):
        return None
    return _forward_call_position(caller.f_code)


def _hooks_installed(module: Module) -> bool:
    """torch's test, in ``_call_impl``, for going through ``inner``."""
    return bool(
        module._backward_hooks
        or module._backward_pre_hooks
        or module._forward_hooks
        or module._forward_pre_hooks
        or torch_module._global_backward_pre_hooks
        or torch_module._global_backward_hooks
        or torch_module._global_forward_hooks
        or torch_module._global_forward_pre_hooks
    )


def _forward_call_position(code: types.CodeType) -> tuple[int, int] | None:
    """The first call of ``forward_call`` in ``_call_impl``: its hookless path."""
    loaded = False
    for ins in dis.get_instructions(code):
        if ins.opname.startswith("LOAD") and ins.argval == "forward_call":
            loaded = True
        elif loaded and ins.opname.startswith("CALL"):
            starts = [line for offset, line in dis.findlinestarts(code) if offset <= ins.offset]
            return (ins.offset, starts[-1]) if starts and starts[-1] is not None else None
    return None


def _internal(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_HOOKDBG_DIR + os.sep)
