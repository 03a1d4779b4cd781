"""Draw the README's pictures of `hookdbg tui` (SVG, as Textual exports them).

Records two short resnet18 runs that differ only in learning rate, then takes the
replay screen of one and the diff screen of both.

    python docs/screenshots.py
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hookdbg.read import open_recording
from hookdbg.tui.app import HookdbgApp

DOCS = Path(__file__).resolve().parent
SAMPLE = DOCS.parent / "samples" / "resnet_fakedata.py"


def record(path: Path, *args: str) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "hookdbg",
            "record",
            "-q",
            "-f",
            "-o",
            str(path),
            str(SAMPLE),
            "--steps",
            "4",
            "--batch",
            "8",
            "--size",
            "32",
            *args,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )


async def shoot(app: HookdbgApp, keys: list[str], out: Path) -> None:
    async with app.run_test(size=(150, 42)) as pilot:
        for key in ["", *keys]:
            if key:
                await pilot.press(key)
            for _ in range(3):
                await pilot.pause(0.1)
                await app.workers.wait_for_complete()
        app.clear_notifications()
        await pilot.pause(0.1)
        app.save_screenshot(filename=out.name, path=str(out.parent))
    print(f"wrote {out}")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the titles show the recordings' names, not a temporary path
        a, b = Path("lr0.05.h5"), Path("lr0.06.h5")
        record(a, "--lr", "0.05")
        record(b, "--lr", "0.06")
        replay = HookdbgApp(open_recording(a))
        asyncio.run(shoot(replay, ["down", "right", "right"], DOCS / "tui-replay.svg"))
        compare = HookdbgApp(open_recording(a), open_recording(b))
        asyncio.run(shoot(compare, ["f", "right"], DOCS / "tui-diff.svg"))


if __name__ == "__main__":
    main()
