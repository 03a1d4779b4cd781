"""The run metadata stored as file attributes: what ran, where, with what, how recorded."""

from __future__ import annotations

import datetime
import json
import os
import platform
import socket

import torch

from hookdbg.options import RecordOptions
from hookdbg.ranks import placement
from hookdbg.store import schema
from hookdbg.version import __version__


def run_metadata(argv: list[str], options: RecordOptions) -> dict[str, str | int]:
    """Plain str/int attributes (JSON text for lists and dicts): nothing that runs code."""
    where = placement()
    return {
        "format": schema.FORMAT,
        "schema_version": schema.SCHEMA_VERSION,
        "hookdbg_version": __version__,
        "torch_version": str(torch.__version__),
        "python_version": platform.python_version(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "argv": json.dumps(argv),
        "cwd": os.getcwd(),
        "options": json.dumps(options.describe()),
        "rank": where.rank,
        "world_size": where.world_size,
        "local_rank": where.local_rank,
        "backend": _backend(),
    }


def _backend() -> str:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return backend_name()
    return ""


def backend_name() -> str:
    """The default group's backend: ``gloo``, ``nccl``. A group made without naming one
    (``init_device_mesh("cpu", ...)``) has one per device type, which torch calls
    ``undefined``: its backends are named instead (``gloo,nccl``)."""
    dist = torch.distributed
    name = str(dist.get_backend())
    if name != "undefined":
        return name
    try:
        pairs = str(dist.get_backend_config()).split(",")
    except Exception:
        return name
    names = dict.fromkeys(p.rpartition(":")[2] for p in pairs if p)
    return ",".join(names) or name
