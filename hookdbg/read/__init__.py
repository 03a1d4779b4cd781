"""Reading recordings: one validated API for the CLI reports, the TUI and users."""

from hookdbg.read.captures import Capture
from hookdbg.read.modules import Module, ModuleTable
from hookdbg.read.ranks import RankSet, open_run, rank_files
from hookdbg.read.recording import Recording, RecordingError, RunInfo, Status, open_recording

__all__ = [
    "Capture",
    "Module",
    "ModuleTable",
    "RankSet",
    "Recording",
    "RecordingError",
    "RunInfo",
    "Status",
    "open_recording",
    "open_run",
    "rank_files",
]
