"""Helpers shared by the tests: running hookdbg for real and reading files with h5py alone."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np

from hookdbg.store import schema

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"


def hookdbg(
    *args: str | os.PathLike[str],
    cwd: str | os.PathLike[str] | None = None,
    timeout: float = 180,
    env: dict[str, str] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the real ``hookdbg`` command line in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "hookdbg", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
        env={**os.environ, **(env or {})},
    )


def hookdbg_in_terminal(
    *args: str | os.PathLike[str],
    keys: tuple[bytes, ...] = (),
    ready: bytes | None = None,
    timeout: float = 60,
    size: tuple[int, int] = (50, 200),
    script: str | None = None,
) -> tuple[int, bytes]:
    """Run the real ``hookdbg`` on a pseudo-terminal, as a user's shell would: returns
    its exit status and every byte it sent to the terminal. ``keys`` are typed one by
    one, after ``ready`` has appeared in the output (when given). With ``script``,
    python runs that instead, with ``args`` as its arguments."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
    run = ["-c", script] if script is not None else ["-m", "hookdbg"]
    proc = subprocess.Popen(
        [sys.executable, *run, *map(str, args)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        # the terminal's size, also where a parent process (pytest-xdist) set COLUMNS
        env={
            **os.environ,
            "TERM": "xterm-256color",
            "LINES": str(size[0]),
            "COLUMNS": str(size[1]),
        },
    )
    os.close(slave)
    out = bytearray()

    def read_for(seconds: float, until: bytes | None = None) -> None:
        deadline = time.time() + seconds
        while time.time() < deadline and (until is None or until not in out):
            if select.select([master], [], [], 0.05)[0]:
                try:
                    chunk = os.read(master, 1 << 16)
                except OSError:  # the other side closed: the process is done
                    return
                if not chunk:
                    return
                out.extend(chunk)

    try:
        if ready is not None:
            read_for(timeout, ready)
        for key in keys:
            os.write(master, key)
            read_for(1.0)
        read_for(timeout)  # until the process closes the terminal
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return proc.returncode, bytes(out)


def free_port() -> int:
    """A port no process listens on now: for torchrun's rendezvous, as tests may run
    side by side (its default port would be shared)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(
    *args: str | os.PathLike[str],
    ranks: int = 2,
    timeout: float = 240,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc-per-node RANKS ARGS`` on a port of its own, one thread a rank
    (these machines have two cores), its output captured."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(ranks),
            f"--master-port={free_port()}",
            *map(str, args),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def with_older_summaries(source: Path, target: Path, version: int) -> Path:
    """A copy of ``source`` as a recorder of schema ``version`` wrote its tensor
    summaries: without the fields declared since (hookdbg/store/summary.py), and
    without the copy of the small tables, which those recorders did not keep."""
    from hookdbg.store import summary

    target.write_bytes(source.read_bytes())
    with h5py.File(target, "r+") as f:
        f.attrs["schema_version"] = version
        for name in summary.missing_since(version):
            del f[f"tensors/{name}"]
        if schema.SMALL in f:
            del f[schema.SMALL]
    return target


def tables(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every table of a recording as a structured array, read with h5py alone (as any
    user could, docs/format.md): each table is a group of equal-length columns. A live
    file whose writer rewrote a tail as it was read is read again."""
    for attempt in range(20):  # a loaded machine reads slower than the writer rewrites
        try:
            return _tables_once(path)
        except (zlib.error, ValueError):
            if attempt == 19:
                raise
            time.sleep(0.01 * attempt)
    raise AssertionError("unreachable")


def _tables_once(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    out = {}
    with h5py.File(path, "r", swmr=True) as f:
        for name, group in f.items():
            if not isinstance(group, h5py.Group):
                continue
            tail = _tail(f, name, group)  # first: the slot may be rewritten at any moment
            names = [c for c in group if c not in schema.TAIL_SLOTS]
            columns = {c: group[c][()] for c in names}
            n = min(len(c) for c in columns.values())
            rows = np.rec.fromarrays([c[:n] for c in columns.values()], names=names)
            if tail is not None:
                sealed, data = tail  # sealed rows are never written again
                rows = np.rec.fromarrays(
                    [np.concatenate([rows[c][:sealed], data[c]]) for c in names], names=names
                )
            out[name] = rows
    return out


def _tail(f: h5py.File, name: str, group: h5py.Group) -> tuple[int, np.ndarray] | None:
    """A live table's sealed row count and its tail rows, read as of one moment."""
    if name not in schema.TABLES or "committed" not in f:
        return None
    f["committed"].refresh()
    committed = f["committed"][()]
    if committed.ndim != 2:
        return None
    sealed, generation, nbytes = committed[:, list(schema.TABLES).index(name)]
    order = [str(c) for c in group.attrs["columns"]]
    dtype = np.dtype([(c, group[c].dtype, group[c].shape[1:]) for c in order])
    if not nbytes:
        return int(sealed), np.zeros(0, dtype)
    slot = schema.TAIL_SLOTS[generation % len(schema.TAIL_SLOTS)]
    data = group[slot][:nbytes].tobytes()
    f["committed"].refresh()  # the slot is whole if not written since
    now = f["committed"][schema.GENERATION, list(schema.TABLES).index(name)]
    if now - generation > 1:
        raise ValueError("the writer rewrote the tail as it was read")
    return int(sealed), np.frombuffer(zlib.decompress(data), dtype)


def module_names(t: dict[str, np.ndarray]) -> dict[int, str]:
    return {int(r["id"]): r["name"].decode() for r in t["modules"]}


def module_id(t: dict[str, np.ndarray], name: str) -> int:
    ids = [i for i, n in module_names(t).items() if n == name]
    assert ids, f"no module {name!r} in {sorted(module_names(t).values())}"
    return ids[0]


LIVE_WRITER = """
import time, torch, hookdbg
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with hookdbg.record({path!r}, flush_interval=0.1, quiet=True):
    while True:
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        time.sleep({pause})
"""


@contextlib.contextmanager
def live_recording(path: Path, pause: float = 0.0, calls: int = 10) -> Iterator[subprocess.Popen]:
    """A real recorder writing ``path`` in another process, forever, until the block
    ends with a ``kill -9``. Enters once ``calls`` module calls are readable."""
    proc = subprocess.Popen([sys.executable, "-c", LIVE_WRITER.format(path=str(path), pause=pause)])
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            time.sleep(0.2)
            with contextlib.suppress(OSError, KeyError, ValueError, zlib.error):  # mid-write
                if path.exists() and len(tables(path).get("calls", ())) >= calls:
                    break
        else:
            raise AssertionError(f"the recorder never wrote {calls} calls to {path}")
        yield proc
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
