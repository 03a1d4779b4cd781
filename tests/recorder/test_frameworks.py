"""Training frameworks run the loop themselves: steps must still be the trainer's steps
and validation its eval batches, under the unmodified ``hookdbg record``. torch.func's
transforms hand modules wrappers without storage: their values must still be read."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functionalize

import hookdbg as hookdbg_api
from tests.helpers import hookdbg, module_id, tables

LIGHTNING = """
import torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import lightning as L

class LitNet(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 2))
    def forward(self, x):
        return self.backbone(x)
    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)
    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)

L.seed_everything(0)
X, Y = torch.randn(96, 4, 4), torch.randint(0, 2, (96,))
train = DataLoader(TensorDataset(X[:64], Y[:64]), batch_size=8)
val = DataLoader(TensorDataset(X[64:], Y[64:]), batch_size=8)
trainer = L.Trainer(max_steps=6, limit_val_batches=2, val_check_interval=3,
                    accumulate_grad_batches={accum}, accelerator="cpu", logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
model = LitNet()
trainer.fit(model, train, val)
print("global_step", trainer.global_step)
"""

HF_TRAINER = """
import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

class Toy(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(n)
        self.ids = torch.randint(5, 60, (n, 8), generator=g)
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, i):
        mask = torch.ones(8, dtype=torch.long)
        mask[6 - i % 3:] = 0  # padded
        return {{"input_ids": self.ids[i], "attention_mask": mask, "labels": i % 2}}

torch.manual_seed(0)
config = BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=16, num_labels=2)
model = BertForSequenceClassification(config)
args = TrainingArguments(output_dir={out!r}, max_steps=4, per_device_train_batch_size=4,
                         per_device_eval_batch_size=4, eval_strategy="steps", eval_steps=2,
                         gradient_accumulation_steps={accum}, save_strategy="no",
                         report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
trainer = Trainer(model=model, args=args, train_dataset=Toy(32), eval_dataset=Toy(8))
trainer.train()
print("global_step", trainer.state.global_step)
"""


def summary(path) -> dict:
    out = hookdbg("summary", "--json", path)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize(
    ("accum", "evals"),
    [
        (1, 6),  # 2 sanity-check batches, 2 after step 3, 2 after step 6
        (2, 8),  # validation every 3 batches: 3 times, twice in the middle of a step
    ],
)
def test_lightning_steps_are_the_trainers_steps(tmp_path, accum, evals):
    pytest.importorskip("lightning")
    script = tmp_path / "lit.py"
    script.write_text(textwrap.dedent(LIGHTNING.format(accum=accum)))
    out = hookdbg("record", "-q", "-o", tmp_path / "run.h5", script, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "global_step 6" in out.stdout
    data = summary(tmp_path / "run.h5")
    assert (data["steps"], data["eval_batches"]) == (6, evals)
    assert any(m["name"] == "model.backbone.1" for m in data["module_table"])


@pytest.mark.parametrize("accum", [1, 2])
def test_hugging_face_trainer_steps_are_its_global_steps(tmp_path, accum):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    script = tmp_path / "hf.py"
    script.write_text(textwrap.dedent(HF_TRAINER.format(out=str(tmp_path / "out"), accum=accum)))
    out = hookdbg("record", "-q", "-o", tmp_path / "run.h5", script, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "global_step 4" in out.stdout
    data = summary(tmp_path / "run.h5")
    assert (data["steps"], data["eval_batches"]) == (4, 4)  # evaluation at steps 2 and 4
    assert data["alerts"] == 0  # padded attention masks are no alert


TORCH_FUNC = """
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

class Sqrt(nn.Module):
    def forward(self, h):
        return h.sqrt()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
params = {k: v.detach() for k, v in model.named_parameters()}
x, y = torch.randn(32, 8), torch.randn(32, 1)

def loss_fn(p, xb, yb):
    return ((functional_call(model, p, (xb,)) - yb) ** 2).mean()

for step in range(3):
    g = grad(loss_fn)(params, x, y)
    params = {k: v - 0.1 * g[k] for k, v in params.items()}
per_sample = vmap(grad(loss_fn), in_dims=(None, 0, 0))(params, x[:4, None], y[:4, None])
root = Sqrt()  # of a negative number: NaN, in the forward pass of a grad transform
bad = grad(lambda p: root(functional_call(model, p, (x,))).sum())(params)
print([round(float(v.double().sum()), 9) for v in params.values()])
print(per_sample["0.weight"].shape, bad["2.bias"])
"""


def test_torch_func_grad_and_vmap_are_recorded_with_their_values(tmp_path):
    script = tmp_path / "func.py"
    script.write_text(TORCH_FUNC)
    plain = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    out = hookdbg("record", "-o", tmp_path / "run.h5", "--capture", "model.0", script)
    assert out.returncode == 0, out.stderr
    assert "internal error" not in out.stderr
    assert out.stdout == plain.stdout  # the training is what it was

    t = tables(tmp_path / "run.h5")
    first = module_id(t, "model.0")
    rows = t["tensors"][t["tensors"]["module"] == first]
    step0 = rows[(rows["step"] == 0) & (rows["slot"] == 1)][0]  # the first pass's output
    torch.manual_seed(0)
    linear = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))[0]
    with torch.no_grad():
        expected = linear(torch.randn(32, 8)).double()
    assert step0["shape"].decode() == "32,16"
    assert step0["min"] == pytest.approx(expected.min().item(), abs=1e-6)
    assert step0["max"] == pytest.approx(expected.max().item(), abs=1e-6)
    assert step0["mean"] == pytest.approx(expected.mean().item(), abs=1e-6)
    grads = rows[rows["slot"] == 2]  # grad_output, as grad() computed it
    assert len(grads) >= 4 and (grads["std"] > 0).all()
    # under vmap: every sample at once, with the batch dimension
    assert "4,1,8" in {s.decode() for s in rows[rows["slot"] == 0]["shape"]}
    captured = t["captures"][t["captures"]["module"] == first]
    assert len(captured) >= 6  # the full tensors too

    (alert,) = t["alerts"]
    assert alert["module"] == module_id(t, "root") and alert["phase"] == 0
    assert alert["slot"] == 1 and alert["step"] == 4  # 3 grad steps, vmap's, then this one


TORCH_FUNC_MORE = """
import torch
from torch import nn
from torch.func import functional_call, functionalize, grad, linearize, vmap

torch.manual_seed(0)
conv = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16, 2))
x = torch.randn(5, 1, 1, 4, 4)  # 5 samples of (1, 4, 4): vmap over dimension 0
per_sample = vmap(conv)(x)
transposed = vmap(conv[3], in_dims=1)(torch.randn(16, 6))  # 6 samples, batch on dim 1
with torch.no_grad():
    functional = functionalize(lambda v: conv[3](v).add_(1.0))(torch.randn(3, 16))
out, jvp_fn = linearize(conv[3], torch.randn(2, 16))  # traced on meta tensors
tangent = jvp_fn(torch.ones(2, 16))

net = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))  # only functional_call
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for _ in range(3):
    opt.zero_grad()
    p = dict(net.named_parameters())
    g = grad(lambda q: functional_call(net, q, (torch.ones(4, 1),)).pow(2).sum())(p)
    p = {k: v - 0.1 * g[k] for k, v in p.items()}
    functional_call(net, p, (torch.ones(4, 1),)).pow(2).sum().backward()
    opt.step()
print(per_sample.shape, transposed.shape, functional.sum().item(), tangent.shape)
print(sum(float(v.double().sum()) for v in net.parameters()))
"""


def test_torch_func_shapes_are_the_batchs_then_the_samples_at_every_level(tmp_path):
    script = tmp_path / "more.py"
    script.write_text(TORCH_FUNC_MORE)
    plain = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    shapes = {}
    for level in ("stats", "shapes"):
        path = tmp_path / f"{level}.h5"
        out = hookdbg("record", "-o", path, "--level", level, script)
        assert out.returncode == 0, out.stderr
        assert "internal error" not in out.stderr and out.stdout == plain.stdout
        t = tables(path)
        shapes[level] = {
            (r["step"], r["call"], r["module"], r["phase"], r["slot"], r["path"]): r["shape"]
            for r in t["tensors"]
        }
        if level == "stats":
            rows = t["tensors"]
    # the same tensors, with the same shapes, whether their values are read or not
    assert shapes["shapes"].items() <= shapes["stats"].items() and len(shapes["shapes"]) > 80

    def shapes_of(name, slot):
        r = rows[(rows["module"] == module_id(t, name)) & (rows["slot"] == slot)]
        return [s.decode() for s in r["shape"]]

    # under vmap: the batch first, then the sample; a view's elements are its base's
    assert shapes_of("conv.2", 1)[0] == "5,1,16" and shapes_of("conv.0", 0)[0] == "5,1,1,4,4"
    assert "6,16" in shapes_of("conv.3", 0)  # in_dims=1: the batch still comes first
    assert "3,2" in shapes_of("conv.3", 1)  # functionalize: its values, read
    sizes = [int(np.prod([int(d) for d in s.split(b",") if d])) for s in rows["shape"]]
    assert (rows["numel"] == sizes).all()  # every shape holds what was counted
    # parameters met only inside functional_call are watched once the optimizer steps them
    net_grads = rows[(rows["slot"] == 4) & (rows["module"] == module_id(t, "net.0"))]
    last = int(rows["step"].max())
    assert sorted(set(net_grads["step"].tolist())) == [last - 1, last]  # not the first


def test_functionalize_reads_a_view_after_its_base_changed_in_place(tmp_path):
    """functionalize replays an in-place change of a base on its views only when asked:
    a view read without that would show the values from before."""

    class Twice(nn.Module):
        def forward(self, h):
            return h * 2.0

    linear, twice = nn.Linear(4, 4), Twice()

    def run(x):
        a = linear(x)
        view = a.view(-1)
        a.fill_(float("nan"))  # the view holds NaN from here on
        return twice(view)

    with hookdbg_api.record(tmp_path / "run.h5", quiet=True), torch.no_grad():
        functionalize(run)(torch.randn(2, 4))
    t = tables(tmp_path / "run.h5")
    rows = t["tensors"][t["tensors"]["module"] == module_id(t, "twice")]
    assert (rows["nan"] == 8).all() and len(rows) == 2  # its input and its output
    (alert,) = t["alerts"]
    assert alert["module"] == module_id(t, "twice") and alert["slot"] == 0  # the input
