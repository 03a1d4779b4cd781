"""The one naming rule for per-rank recordings, and where this process sits."""

import os
import subprocess
import sys
import textwrap

from hookdbg.ranks import Placement, placement, rank_file, rank_files, rank_of, rank_path
from hookdbg.read import RankSet, open_recording, open_run


def test_rank_file_and_back():
    assert rank_file("out/run.h5", 3).as_posix() == "out/run.rank3.h5"
    assert rank_of("out/run.h5", "out/run.rank3.h5") == 3
    assert rank_of("out/run.h5", "out/run.rank.h5") is None
    assert rank_of("out/run.h5", "out/run.rank3.h5.bak") is None
    assert rank_of("out/run.h5", "out/other.rank3.h5") is None


def test_rank_path_only_on_several_ranks():
    assert rank_path("run.h5", Placement(0, 1)).name == "run.h5"
    assert rank_path("run.h5", Placement(1, 2)).name == "run.rank1.h5"


def test_rank_files_sorted_by_rank_with_names_glob_would_misread(tmp_path):
    for rank in (10, 2, 0):
        rank_file(tmp_path / "exp[1].h5", rank).touch()
    (tmp_path / "exp[1].rankx.h5").touch()
    (tmp_path / "exp1.rank5.h5").touch()  # "[1]" is no glob here
    assert list(rank_files(tmp_path / "exp[1].h5")) == [0, 2, 10]


def test_placement_from_the_launchers_environment():
    torchrun = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}
    assert placement(torchrun) == Placement(3, 4, 1)
    assert placement({}) == Placement(0, 1, 0)
    # Lightning's own launcher sets no RANK: on one node the local rank is the rank
    assert placement({"WORLD_SIZE": "2", "LOCAL_RANK": "1", "NODE_RANK": "0"}) == Placement(1, 2, 1)
    assert placement({"RANK": "junk", "WORLD_SIZE": "2"}) == Placement(0, 2, 0)
    assert Placement(1, 2).prefix == "hookdbg[rank 1]: " and Placement().prefix == "hookdbg: "


def test_importable_without_torch():
    code = "import sys, hookdbg.ranks; assert 'torch' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


RANK_SCRIPT = """
import torch, hookdbg
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with hookdbg.record({path!r}, quiet=True) as rec:
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
print(rec.path)
"""


def test_python_api_under_torchrun_writes_the_rank_file(tmp_path):
    path = tmp_path / "run.h5"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RANK_SCRIPT.format(path=str(path)))],
        capture_output=True,
        text=True,
        env={**os.environ, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "run.rank1.h5")
    assert not path.exists()
    with open_recording(tmp_path / "run.rank1.h5") as rec:
        assert (rec.info.rank, rec.info.world_size, len(rec.steps)) == (1, 2, 2)
    with open_run(path) as run:
        assert isinstance(run, RankSet) and run.ranks == [1] and run.missing == [0]
