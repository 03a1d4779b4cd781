"""A rank that ends early under torchrun (--on-nan stop, or killed): every rank's file
says how that rank ended, and the run's summary tells them apart."""

import json
import subprocess
from pathlib import Path

import pytest

from hookdbg.read import Status, open_run
from hookdbg.text import utf8
from tests.helpers import hookdbg
from tests.helpers import torchrun as launch

SCRIPT = Path(__file__).with_name("rank_ends.py")


def torchrun(out: Path, how: str, *record: str) -> subprocess.CompletedProcess[str]:
    return launch("-m", "hookdbg", "record", "-q", "-o", out, *record, SCRIPT, how)


def ended(out: Path) -> dict[int, tuple[Status, str, str]]:
    """Each rank's status, and its end row's status and message."""
    with open_run(out) as run:
        return {
            rank: (
                run[rank].status,
                "" if run[rank].end is None else utf8(run[rank].end["status"]),
                "" if run[rank].end is None else utf8(run[rank].end["message"]),
            )
            for rank in run.ranks
        }


@pytest.mark.parametrize("how", ["nan", "kill"])
def test_every_rank_says_how_it_ended_when_a_peer_ends_early(tmp_path, how):
    out = tmp_path / "run.h5"
    done = torchrun(out, how, *(["--on-nan", "stop"] if how == "nan" else []))
    assert done.returncode != 0, done.stderr[-3000:]
    ends = ended(out)
    if how == "nan":  # the origin's rank stopped there
        assert ends[1][:2] == (Status.COMPLETE, "stopped"), ends
    else:  # nothing can close a file when its process is killed
        assert ends[1][0] is Status.CUT_SHORT, ends
    # the survivor's collective failed, and torchrun sent it SIGTERM: closed all the same
    status, end, message = ends[0]
    assert status is Status.COMPLETE and end in ("exception", "terminated"), ends
    assert message, ends
    text = " ".join(hookdbg("summary", out).stdout.split())
    assert "(every rank)" not in text, text
    first = "stopped at the first NaN/inf origin (exit status 3)" if how == "nan" else "cut short"
    assert f"{first}" in text and "(rank 1)" in text and "(rank 0)" in text, text
    data = json.loads(hookdbg("summary", out, "--json").stdout)
    assert [r["ended"] for r in data["per_rank"]][1] == ("stopped" if how == "nan" else None)


def test_a_rank_receiving_a_nan_through_tensor_parallel_names_no_origin(tmp_path):
    """--on-nan stop, checks waiting for the step's statistics (as on a GPU): rank 1,
    where the NaN was born, stops there; rank 0, which it reaches through the
    all-reduce inside a row-parallel Linear's forward, names no origin and does not stop
    on one."""
    out = tmp_path / "run.h5"
    launch(SCRIPT, "tp", out)
    ends = ended(out)
    assert ends[1][:2] == (Status.COMPLETE, "stopped") and "model.0 (Linear)" in ends[1][2]
    assert ends[0][0] is Status.COMPLETE, ends
    found = json.loads(hookdbg("alerts", out, "--json").stdout)["alerts"]
    assert found[0]["rank"] == 1, found
    for alert in found:
        if alert["rank"] == 0:
            assert "came from another rank" in alert["message"], alert
    if ends[0][1] == "stopped":  # it stopped where the NaN came in, saying so
        assert "came from another rank" in ends[0][2], ends
