"""Every reader command on one file, in one process whose memory is limited:

    python -m tests.read.bounded LIMIT_BYTES FILE OTHER TMP

sets RLIMIT_AS to LIMIT_BYTES before anything is read, runs each command of
``hostile.commands(FILE, OTHER, TMP)`` through click's CliRunner (the command line's own
code), and prints one JSON object per command (its arguments, exit status, the
exception it raised if any, its stderr, its seconds), then one with the process's peak
resident memory in bytes. A command that reaches for more memory than the limit fails
with MemoryError here, where the caller sees it."""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path


def main(limit: int, path: Path, other: Path, tmp: Path) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from click.testing import CliRunner

    from hookdbg.cli import cli
    from tests.read.hostile import commands

    for args in commands(path, other, tmp):
        start = time.perf_counter()
        result = CliRunner().invoke(cli, args)
        seconds = time.perf_counter() - start
        raised = result.exception
        report = {
            "args": args,
            "exit_code": result.exit_code,
            "exception": None if raised is None or isinstance(raised, SystemExit) else repr(raised),
            "stderr": result.stderr,
            "seconds": seconds,
        }
        print(json.dumps(report), flush=True)
    print(json.dumps({"peak_rss": _peak_rss()}), flush=True)


def _peak_rss() -> int:
    """This process's peak resident memory in bytes: VmHWM, which starts anew at exec
    (``ru_maxrss`` keeps the parent's at fork: a pytest process with torch loaded)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


if __name__ == "__main__":
    main(int(sys.argv[1]), *(Path(a) for a in sys.argv[2:5]))
