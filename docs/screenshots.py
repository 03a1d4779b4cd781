"""Draw the README's pictures of `hookdbg tui` (SVG, as Textual exports them).

Records two short resnet18 runs that differ only in learning rate, then takes the
replay screen of one and the diff screen of both.

    python docs/screenshots.py

With --small DIR, the tree, the profile and the diff's plot at 100x30, an everyday
terminal's size, as DIR/NAME-tree.svg, DIR/NAME-profile.svg and DIR/NAME-diff-plot.svg
(docs/tui/after-*.svg; docs/tui/before-*.svg are of commit 6eb41c2's TUI, to compare):

    python docs/screenshots.py --small docs/tui --name after
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from textual.worker import WorkerCancelled

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


async def shoot(
    app: HookdbgApp, keys: list[str], out: Path, size: tuple[int, int] = (150, 42)
) -> None:
    async with app.run_test(size=size) as pilot:
        for key in ["", *keys]:
            if key:
                await pilot.press(key)
            for _ in range(3):
                await pilot.pause(0.1)
                with contextlib.suppress(WorkerCancelled):  # a newer one took its place
                    await app.workers.wait_for_complete()
        app.clear_notifications()
        await pilot.pause(0.1)
        app.save_screenshot(filename=out.name, path=str(out.parent))
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=Path, help="draw the 100x30 pictures into this folder")
    parser.add_argument("--name", default="now", help="the --small pictures' names start so")
    args = parser.parse_args()
    small = args.small.resolve() if args.small else None
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the titles show the recordings' names, not a temporary path
        a, b = Path("lr0.05.h5"), Path("lr0.06.h5")
        record(a, "--lr", "0.05")
        record(b, "--lr", "0.06")
        if small is not None:
            small.mkdir(parents=True, exist_ok=True)
            at = (100, 30)
            for keys, what in (([], "tree"), (["p"], "profile")):
                out = small / f"{args.name}-{what}.svg"
                asyncio.run(shoot(HookdbgApp(open_recording(a)), keys, out, at))
            compare = HookdbgApp(open_recording(a), open_recording(b))
            asyncio.run(shoot(compare, ["f", "right"], small / f"{args.name}-diff-plot.svg", at))
            return
        replay = HookdbgApp(open_recording(a))
        asyncio.run(shoot(replay, ["down", "right", "right"], DOCS / "tui-replay.svg"))
        compare = HookdbgApp(open_recording(a), open_recording(b))
        asyncio.run(shoot(compare, ["f", "right"], DOCS / "tui-diff.svg"))


if __name__ == "__main__":
    main()
