"""The recorder on real models: what it writes, and that it changes nothing it records."""

import contextlib
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest
import torch
import torchvision
from torch import nn

import hookdbg
from hookdbg.store.schema import Phase, Slot
from tests.helpers import SAMPLES, module_id, module_names, tables

sys.path.insert(0, str(SAMPLES))
from numnet_mlp import NumNet
from transformer import Spotter, batch


def train_resnet(n_steps: int, path=None, **options):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g)
    recorder = hookdbg.record(path, quiet=True, **options).start() if path else None
    losses = []
    try:
        for _ in range(n_steps):
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach().clone())
    finally:
        if recorder:
            recorder.close()
    grads = [p.grad.clone() for p in model.parameters()]
    return losses, [p.detach().clone() for p in model.parameters()], grads, recorder


def test_resnet18_recording_changes_nothing_bitwise(tmp_path):
    plain = train_resnet(2)
    recorded = train_resnet(2, tmp_path / "run.h5")
    for a, b in zip(plain[:3], recorded[:3], strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    t = tables(tmp_path / "run.h5")
    assert len(t["steps"]) == 2 and t["end"]["status"][0] == b"complete"
    names = set(module_names(t).values())
    assert {"model", "model.layer1.0.relu", "model.fc", "criterion", "optimizer"} <= names
    # every recorded forward call has a backward timing row where a gradient flowed
    fwd = t["calls"][t["calls"]["phase"] == Phase.FWD]
    bwd = t["calls"][t["calls"]["phase"] == Phase.BWD]
    assert len(fwd) == 2 * 77 and len(bwd) >= 0.9 * len(fwd)
    assert np.all(bwd["self"] <= bwd["total"] + 1e-9) and np.all(fwd["self"] <= fwd["total"])
    assert recorded[3].dropped_rows == 0


def test_inputs_are_summarised_before_inplace_relu(tmp_path):
    train_resnet(1, tmp_path / "run.h5")
    t = tables(tmp_path / "run.h5")
    relu, bn1 = module_id(t, "model.relu"), module_id(t, "model.bn1")
    rows = t["tensors"][t["tensors"]["phase"] == Phase.FWD]
    relu_in = rows[(rows["module"] == relu) & (rows["slot"] == Slot.INPUT)][0]
    relu_out = rows[(rows["module"] == relu) & (rows["slot"] == Slot.OUTPUT)][0]
    bn_out = rows[(rows["module"] == bn1) & (rows["slot"] == Slot.OUTPUT)][0]
    assert relu_in["min"] < 0 and relu_in["min"] == bn_out["min"]  # before ReLU ran in place
    assert relu_out["min"] == 0 and relu_out["zero_frac"] > 0.2


def test_call_counts_match_an_independent_per_module_counter(tmp_path):
    torch.manual_seed(0)
    model = Spotter()
    counter: Counter[str] = Counter()
    handles = [
        m.register_forward_pre_hook(lambda mod, args, name=name: counter.update([name]))
        for name, m in model.named_modules()
    ]
    optimizer = torch.optim.AdamW(model.parameters())
    g = torch.Generator().manual_seed(0)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        for _ in range(3):
            tokens, mask, labels = batch(8, g)
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(tokens, mask), labels).backward()
            optimizer.step()
    for h in handles:
        h.remove()
    t = tables(tmp_path / "run.h5")
    names = module_names(t)
    fwd = t["calls"][t["calls"]["phase"] == Phase.FWD]
    recorded = Counter(names[int(m)].removeprefix("model").lstrip(".") for m in fwd["module"])
    assert recorded == counter
    for module in set(fwd["module"]):
        for step in range(3):
            idx = fwd[(fwd["module"] == module) & (fwd["step"] == step)]["index"]
            assert sorted(idx) == list(range(len(idx)))


def test_keyword_inputs_and_nested_outputs_are_walked(tmp_path):
    torch.manual_seed(0)
    model = Spotter()
    lstm = nn.LSTM(4, 3, batch_first=True)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        tokens, mask, _ = batch(4, torch.Generator().manual_seed(0))
        model(tokens, mask)
        lstm(torch.randn(2, 5, 4))
    t = tables(tmp_path / "run.h5")
    rows = t["tensors"]
    enc = rows[rows["module"] == module_id(t, "model.encoder")]
    mask_row = enc[enc["path"] == b"src_key_padding_mask"][0]
    assert mask_row["slot"] == Slot.INPUT and mask_row["dtype"] == b"bool"
    assert mask_row["shape"] == b"4,24" and (mask_row["min"], mask_row["max"]) == (0, 1)
    assert mask_row["nan"] == 0  # an integer tensor cannot hold NaN
    out = rows[(rows["module"] == module_id(t, "lstm")) & (rows["slot"] == Slot.OUTPUT)]
    assert sorted(out["path"]) == [b"0", b"1.0", b"1.1"]


def test_gradient_rows_for_outputs_inputs_and_parameters(tmp_path):
    torch.manual_seed(0)
    model = NumNet()
    x = torch.randn(16, 8, 8)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        model(x).pow(2).mean().backward()
    t = tables(tmp_path / "run.h5")
    rows = t["tensors"][t["tensors"]["phase"] == Phase.BWD]
    head = module_id(t, "model.head")
    slots = Counter(int(s) for s in rows[rows["module"] == head]["slot"])
    assert slots == {Slot.GRAD_OUTPUT: 1, Slot.GRAD_INPUT: 1, Slot.PARAM_GRAD: 2}
    weight = rows[(rows["module"] == head) & (rows["path"] == b"weight")][0]
    assert weight["norm"] == pytest.approx(model.head.weight.grad.norm().item(), rel=1e-5)
    # the gradient w.r.t. head's input is the gradient w.r.t. the body's output
    grad_in = rows[(rows["module"] == head) & (rows["slot"] == Slot.GRAD_INPUT)][0]
    body_out = rows[
        (rows["module"] == module_id(t, "model.body")) & (rows["slot"] == Slot.GRAD_OUTPUT)
    ]
    assert body_out[0]["norm"] == grad_in["norm"]


def test_levels_record_less(tmp_path):
    for level in ("timing", "shapes", "stats"):
        train_resnet(1, tmp_path / f"{level}.h5", level=level)
    timing, shapes, full = (tables(tmp_path / f"{lv}.h5") for lv in ("timing", "shapes", "stats"))
    assert len(timing["tensors"]) == 0 and len(timing["calls"]) == len(full["calls"])
    assert len(shapes["tensors"]) > 0 and np.isnan(shapes["tensors"]["mean"]).all()
    assert not np.isnan(full["tensors"]["mean"][full["tensors"]["slot"] == Slot.OUTPUT]).any()


def test_module_globs_select_what_is_recorded(tmp_path):
    train_resnet(1, tmp_path / "run.h5", modules=["layer1.*", "!*.bn*"])
    t = tables(tmp_path / "run.h5")
    names = module_names(t)
    recorded = {names[int(m)] for m in t["calls"]["module"]} - {"optimizer", "loss"}
    assert recorded and all(n.startswith("model.layer1.") and ".bn" not in n for n in recorded)


def test_every_and_step_range(tmp_path):
    train_resnet(6, tmp_path / "run.h5", every=2, steps="1:")
    t = tables(tmp_path / "run.h5")
    assert list(t["steps"]["step"]) == list(range(6))
    assert list(t["steps"]["recorded"]) == [0, 1, 0, 1, 0, 1]
    assert set(t["calls"]["step"]) == {1, 3, 5}


def _train_every_5(path, tweak=None):
    """14 SGD steps of a small MLP, every 5th recorded; ``tweak(model, i)`` runs
    before iteration ``i``'s forward. Returns the parameter-gradient rows by step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    with hookdbg.record(path, quiet=True, every=5):
        for i in range(14):
            if tweak is not None:
                tweak(model, i)
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    t = tables(path)
    assert list(t["steps"]["recorded"]) == [1, 0, 0, 0, 0] * 2 + [1, 0, 0, 0]
    rows = t["tensors"][t["tensors"]["slot"] == Slot.PARAM_GRAD]
    return {int(s): rows[rows["step"] == s] for s in (0, 5, 10)}


def test_gradients_are_read_before_the_scripts_own_later_hooks(tmp_path):
    """An optimizer step fused into backward (a post-accumulate hook that steps and
    zeroes .grad, added after recording began) must not make the recorded parameter
    gradients zero in later recorded steps: hookdbg's hook keeps its place before it."""

    def zero(p):
        p.grad.zero_()  # where a fused optimizer would step first

    def fuse(model, i):
        if i == 1:
            for p in model.parameters():
                p.register_post_accumulate_grad_hook(zero)

    by_step = _train_every_5(tmp_path / "fused.h5", fuse)
    for step in (0, 5, 10):
        assert len(by_step[step]) == 4
        assert np.all(by_step[step]["norm"] > 0), step


def test_a_parameter_frozen_mid_run_keeps_the_recording_going(tmp_path):
    """Freezing a layer between recorded steps (fine-tuning schedules do) stops its
    gradients, not the recording."""

    def freeze(model, i):
        if i == 6:
            model[0].weight.requires_grad_(False)

    by_step = _train_every_5(tmp_path / "frozen.h5", freeze)
    assert len(by_step[5]) == 4 and len(by_step[10]) == 3  # model.0.weight: none


def test_exception_in_forward_keeps_the_call_stack_and_removes_hooks(tmp_path):
    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    model = nn.Sequential(nn.Linear(2, 2), Boom())
    with pytest.raises(ValueError), hookdbg.record(tmp_path / "run.h5", quiet=True) as rec:
        with contextlib.suppress(ValueError):
            model(torch.randn(1, 2))
        model[0](torch.randn(1, 2))  # still recorded, at the right depth
        raise ValueError("the script fails")
    t = tables(tmp_path / "run.h5")
    assert t["end"]["status"][0] == b"exception" and b"the script fails" in t["end"]["message"][0]
    last = t["calls"][-1]
    assert module_names(t)[int(last["module"])] == "model.0" and last["depth"] == 0
    assert rec._calls.stack == []


def test_keyboard_interrupt_is_recorded_as_such(tmp_path):
    with pytest.raises(KeyboardInterrupt), hookdbg.record(tmp_path / "run.h5", quiet=True):
        nn.Linear(2, 2)(torch.randn(1, 2))
        raise KeyboardInterrupt
    assert tables(tmp_path / "run.h5")["end"]["status"][0] == b"interrupted"


def test_a_second_recorder_is_refused_and_existing_files_need_force(tmp_path):
    with (
        hookdbg.record(tmp_path / "a.h5", quiet=True),
        pytest.raises(hookdbg.RecordError, match="already running"),
    ):
        hookdbg.record(tmp_path / "b.h5", quiet=True).start()
    with pytest.raises(hookdbg.RecordError, match=r"already exists.*--force"):
        hookdbg.record(tmp_path / "a.h5")
    hookdbg.record(tmp_path / "a.h5", force=True, quiet=True).start().close()


def test_dataloader_workers_do_not_record(tmp_path):
    class Doubling(nn.Module):  # a transform that is a module, run in a worker process
        def forward(self, x):
            return x * 2

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return Doubling()(torch.full((2,), float(i)))

    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        got = [b for b in torch.utils.data.DataLoader(Data(), batch_size=2, num_workers=1)]
    assert torch.equal(got[1], torch.tensor([[4.0, 4.0], [6.0, 6.0]]))
    assert len(tables(tmp_path / "run.h5")["calls"]) == 0


def test_a_recorder_records_once(tmp_path):
    model = nn.Linear(2, 2)
    rec = hookdbg.record(tmp_path / "run.h5", quiet=True)
    with rec:
        model(torch.randn(1, 2)).sum().backward()
    with pytest.raises(hookdbg.RecordError, match=r"already recorded to .*make a new one"), rec:
        model(torch.randn(1, 2))
    t = tables(tmp_path / "run.h5")  # the first recording is intact
    assert t["end"]["status"][0] == b"complete" and len(t["calls"][t["calls"]["phase"] == 0]) == 1
    with hookdbg.record(tmp_path / "next.h5", quiet=True):  # and nothing was left running
        model(torch.randn(1, 2))
    assert len(tables(tmp_path / "next.h5")["calls"]) == 1


def test_lazy_modules_are_recorded_and_their_parameters_watched_once_made(tmp_path):
    model = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
    t = tables(tmp_path / "run.h5")
    assert len(t["steps"]) == 3
    lazy = module_id(t, "model.0")
    grads = t["tensors"][(t["tensors"]["module"] == lazy) & (t["tensors"]["slot"] == 5)]
    assert {(int(r["step"]), r["path"]) for r in grads} >= {(2, b"weight"), (2, b"bias")}


def test_a_name_utf8_cannot_hold_is_stored_escaped(tmp_path):
    """A dict key decoded from a file name with surrogateescape holds a lone surrogate,
    which UTF-8 cannot encode: the row keeps it as a backslash escape, nothing is lost,
    and the writer, and with it the recording, goes on."""

    class Keyed(nn.Module):
        def forward(self, x):
            return {"\udcff": x * 2}

    model = nn.Sequential(nn.Linear(2, 2), Keyed())
    with hookdbg.record(tmp_path / "run.h5", quiet=True) as recorder:
        model(torch.ones(1, 2)).popitem()[1].sum().backward()
    assert recorder.write_error is None and recorder.dropped_rows == 0
    t = tables(tmp_path / "run.h5")
    keyed = t["tensors"][t["tensors"]["module"] == module_id(t, "model.1")]
    assert b"\\udcff" in set(keyed["path"]) and t["end"]["status"][0] == b"complete"


def test_a_failure_while_closing_still_finishes_the_file(tmp_path, monkeypatch, capsys):
    """A bug met while closing (here: reading the last device statistics) is reported,
    and the file still gets what was gathered and its end row, which says it failed."""
    from hookdbg.recorder.steps.segments import Segments

    def broken(self, wait):
        raise RuntimeError("a bug in hookdbg")

    model = nn.Linear(2, 2)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        model(torch.ones(1, 2)).sum().backward()
        monkeypatch.setattr(Segments, "read_batches", broken)
    assert "internal error" in capsys.readouterr().err
    t = tables(tmp_path / "run.h5")
    assert t["end"]["status"][0] == b"failed" and len(t["calls"]) >= 1
    assert b"RuntimeError: a bug in hookdbg" in t["end"]["message"][0]


READ_COMMITTED = """
import sys
from hookdbg.read import open_recording
rec = open_recording(sys.argv[1])  # the rows committed: in the columns and the tails
print(len(rec.steps), len(rec.calls_table))
"""


def test_finished_steps_reach_the_file_while_a_hook_hangs(tmp_path):
    """A hook that blocks holding the recorder's lock (a device wait behind a stuck
    collective) keeps the writer from gathering rows; the steps that finished before it
    were handed over as they ended, and are in the file."""
    path = tmp_path / "hang.h5"
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with hookdbg.record(path, quiet=True, flush_interval=0.2) as rec:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
        model(torch.randn(8, 4))  # the next step begins: the third has ended
        with rec.guard.lock:  # what a hanging hook holds
            time.sleep(0.6)  # the writer wakes every 0.1 s meanwhile
            out = subprocess.run(
                [sys.executable, "-c", READ_COMMITTED, str(path)],
                capture_output=True,
                text=True,
                timeout=60,
            )
    assert out.returncode == 0, out.stderr
    steps, calls = map(int, out.stdout.split())
    assert steps == 3 and calls >= 3 * 2 * 3  # three modules' forward and backward rows


FLUSHING = """
import sys, torch, hookdbg
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def steps(n):
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()

with hookdbg.record(sys.argv[1], quiet=True, flush_interval=3600) as rec:
    steps(3)
    print("stepped", flush=True)
    sys.stdin.readline()
    print(rec.flush(timeout=60), flush=True)
    sys.stdin.readline()
    steps(2)
    with rec.guard.lock:  # held, as inside a hook: the writer cannot take the rows itself
        print(rec.flush(timeout=60), flush=True)
    sys.stdin.readline()
print(rec.flush(), flush=True)
"""


def test_flush_puts_the_steps_run_so_far_in_the_file_at_once(tmp_path):
    """Read from another process, as a user would: with the writer left to itself for
    half an hour, the steps run so far reach the file only when the script flushes,
    also from inside a hook."""
    path = tmp_path / "run.h5"
    proc = subprocess.Popen(
        [sys.executable, "-c", FLUSHING, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    def then(line: str) -> dict:
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == line
        return tables(path)

    try:
        assert proc.stdout.readline() == "stepped\n"
        assert len(tables(path)["calls"]) == 0
        t = then("True\n")
        assert set(t["calls"]["step"]) == {0, 1, 2} and list(t["steps"]["step"]) == [0, 1]
        t = then("True\n")
        assert set(t["calls"]["step"]) == {0, 1, 2, 3, 4}
        then("False\n")  # closed: nothing left to flush
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
