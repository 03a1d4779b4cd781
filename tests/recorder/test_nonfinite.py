"""NaN/inf alerts name where a non-finite value was born, not everywhere it spread."""

import pytest
import torch
from torch import nn

import hookdbg
from hookdbg.store.schema import Phase, Slot
from tests.helpers import SAMPLES, module_names, tables
from tests.helpers import hookdbg as run_hookdbg


def origins(path) -> list[tuple[str, int, int, str, int]]:
    t = tables(path)
    names = module_names(t)
    return [
        (
            names[int(a["module"])],
            int(a["phase"]),
            int(a["slot"]),
            a["path"].decode(),
            int(a["step"]),
        )
        for a in t["alerts"]
    ]


def test_forward_origin_of_the_nan_sample(tmp_path):
    out = run_hookdbg(
        "record",
        "-o",
        tmp_path / "nan.h5",
        SAMPLES / "nan_blowup.py",
        "--nan-step",
        "2",
        "--steps",
        "4",
    )
    assert out.returncode == 0, out.stderr
    assert origins(tmp_path / "nan.h5") == [("model.standardize", Phase.FWD, Slot.OUTPUT, "", 2)]
    assert (
        "NaN first appeared at step 2 in model.standardize (Standardize) forward output"
        in out.stderr
    )
    assert "step 3  loss nan" in out.stdout  # the script itself ran on, untouched
    assert tables(tmp_path / "nan.h5")["alerts"]["first"][0] == 1


def test_backward_origin_of_the_nan_sample(tmp_path):
    out = run_hookdbg(
        "record",
        "-o",
        tmp_path / "nan.h5",
        SAMPLES / "nan_blowup.py",
        "--where",
        "backward",
        "--nan-step",
        "1",
        "--steps",
        "3",
    )
    assert out.returncode == 0, out.stderr
    assert origins(tmp_path / "nan.h5") == [("model.length", Phase.BWD, Slot.GRAD_INPUT, "0", 1)]
    assert "in model.length (Length) backward grad_input[0]" in out.stderr


def test_nan_in_the_data_is_named_as_such(tmp_path):
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    x = torch.randn(2, 3)
    x[0, 1] = float("nan")
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        model(x)
    t = tables(tmp_path / "run.h5")
    assert origins(tmp_path / "run.h5") == [("model", Phase.FWD, Slot.INPUT, "0", 0)]
    assert b"came from the data" in t["alerts"]["message"][0]


def _alerts(path) -> list[tuple[tuple[str, int, int, str, int], str]]:
    messages = [m.decode() for m in tables(path)["alerts"]["message"]]
    return list(zip(origins(path), messages, strict=True))


@pytest.mark.parametrize(
    ("make_loss", "kind"),
    [
        (lambda out: torch.log(out.mean() - 100.0), "NaN"),  # log of a negative number
        (lambda out: torch.log(out.abs()).sum(), "inf"),  # log|x| at 0: -inf
    ],
)
def test_a_loss_made_non_finite_by_tensor_code_is_born_in_the_loss(tmp_path, make_loss, kind):
    """The loss is computed by tensor code after the model, where no module hook looks:
    what backward() is called on is checked, and named as the origin when every module
    output was finite."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        for step in range(4):
            out = model(torch.zeros(3, 2)) * 0
            loss = make_loss(out) if step == 2 else out.pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    (where, message), *_ = _alerts(tmp_path / "run.h5")
    assert where == ("loss", Phase.FWD, Slot.LOSS, "", 2)
    assert f"{kind} first appeared at step 2 in loss (the loss at test_nonfinite.py:" in message
    assert "born in the loss computation after model (Sequential)" in message


def test_a_loss_of_a_model_that_returned_nan_is_not_an_origin(tmp_path):
    """The model's output already held the NaN: the origin stays the module."""

    class Poison(nn.Module):
        def forward(self, x):
            return x * float("nan")

    model = nn.Sequential(nn.Linear(2, 2), Poison())
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        ((model(torch.ones(3, 2)) - 1.0) ** 2).mean().backward()
    assert [w[:3] for w, _ in _alerts(tmp_path / "run.h5")] == [("model.1", Phase.FWD, Slot.OUTPUT)]


def test_a_gradient_made_non_finite_by_the_loss_computation(tmp_path):
    """The loss is finite (sqrt(0) = 0) but its gradient is not: born in the backward
    pass of the loss computation, after the model."""
    model = nn.Linear(2, 1)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        out = model(torch.zeros(1, 2)) * 0
        torch.sqrt(out.abs()).sum().backward()  # d/dx sqrt|x| at 0
    (where, message), *_ = _alerts(tmp_path / "run.h5")
    assert where[:3] == ("model", Phase.BWD, Slot.GRAD_OUTPUT)
    assert "born in the backward pass of the loss computation after model (Linear)" in message


def test_a_gradient_made_non_finite_between_two_modules(tmp_path):
    """Tensor code between two modules turns their finite gradient into inf: named with
    the module on each side."""
    torch.manual_seed(0)
    first, second = nn.Linear(2, 3), nn.Linear(3, 1)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        hidden = first(torch.zeros(4, 2)) * 0
        second(torch.sqrt(hidden.abs())).sum().backward()
    (where, message), *_ = _alerts(tmp_path / "run.h5")
    assert where[:3] == ("first", Phase.BWD, Slot.GRAD_OUTPUT)
    assert "tensor code between first (Linear) and second (Linear)" in message


@pytest.mark.parametrize("level", ["stats", "shapes", "timing"])
def test_optimizer_step_that_makes_weights_nonfinite(tmp_path, level):
    """Below ``stats``, ``--nan-check`` checks the weights after each optimizer step too
    (their norms, not kept): the step that broke them is the origin, not the next
    forward that reads them."""
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=float("inf"))
    with hookdbg.record(tmp_path / "run.h5", quiet=True, level=level, nan_check=True):
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        model(torch.ones(1, 2))  # NaN weights: spread, not born
    found = origins(tmp_path / "run.h5")
    assert [(m, p, s) for m, p, s, _, _ in found] == [("model", Phase.OPT, Slot.PARAM)] * 2
    assert {path for *_, path, _ in found} == {"weight", "bias"}
    weights = tables(tmp_path / "run.h5").get("tensors", ())
    kept = [r for r in weights if int(r["phase"]) == Phase.OPT]
    assert len(kept) == (2 if level == "stats" else 0)  # weight rows only at stats


def test_one_warning_per_origin_however_often_it_recurs(tmp_path, capsys):
    model = nn.Sequential(nn.Linear(2, 2))
    with hookdbg.record(tmp_path / "run.h5"), torch.no_grad():
        for _ in range(3):  # three inference steps
            model(torch.tensor([[float("inf"), 1.0]]))
    err = capsys.readouterr().err
    assert err.count("inf first appeared") == 1
    assert len(tables(tmp_path / "run.h5")["alerts"]) == 3


# -- masks: -inf on purpose is no alert; NaN always is ----------------------------------


def test_healthy_transformer_with_causal_and_padding_masks_raises_no_alert(tmp_path):
    torch.manual_seed(0)
    model = nn.Transformer(
        d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32
    )
    opt = torch.optim.Adam(model.parameters())
    src, tgt = torch.randn(6, 3, 16), torch.randn(5, 3, 16)
    causal = nn.Transformer.generate_square_subsequent_mask(5)  # float, -inf above
    padding = torch.zeros(3, 6, dtype=torch.bool)
    padding[0, 4:] = True
    float_padding = torch.zeros(3, 6).masked_fill(padding, float("-inf"))
    with hookdbg.record(tmp_path / "run.h5", quiet=True, on_nan="stop"):
        for mask in (padding, float_padding):
            out = model(src, tgt, tgt_mask=causal, src_key_padding_mask=mask)
            out.pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    assert origins(tmp_path / "run.h5") == []


def test_a_fully_masked_row_is_a_nan_born_in_attention(tmp_path):
    attention = nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 4, 8)
    mask = torch.zeros(2, 4)
    mask[1] = float("-inf")  # every key of the second sequence masked: softmax of -inf
    with hookdbg.record(tmp_path / "run.h5", quiet=True), torch.no_grad():
        attention(x, x, x, key_padding_mask=mask)
    t = tables(tmp_path / "run.h5")
    assert origins(tmp_path / "run.h5") == [("attention", Phase.FWD, Slot.OUTPUT, "0", 0)]
    message = t["alerts"]["message"][0].decode()
    assert "NaN first appeared in eval batch 0" in message
    assert "input[key_padding_mask] held 4 -inf, from the data" in message


def test_inf_from_the_data_is_named_once_a_module_passes_it_on(tmp_path):
    model = nn.Sequential(nn.Linear(2, 2), nn.Tanh())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.tensor([[float("inf"), 1.0]])
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        model(x).sum().backward()
        opt.step()
    found = origins(tmp_path / "run.h5")
    assert found[0] == ("model", Phase.FWD, Slot.INPUT, "0", 0)
    message = tables(tmp_path / "run.h5")["alerts"]["message"][0].decode()
    assert "it came from the data; model.0 passed it on" in message


def test_a_mask_made_by_a_module_and_absorbed_by_another_is_no_alert(tmp_path):
    class CausalMask(nn.Module):
        def forward(self, n: int, like: torch.Tensor) -> torch.Tensor:
            return torch.full((n, n), float("-inf")).triu(1)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mask = CausalMask()
            self.attention = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mask = self.mask(x.shape[1], x)
            return self.attention(x, x, x, attn_mask=mask, need_weights=False)[0]

    model = Block()
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        model(torch.randn(2, 5, 8)).sum().backward()
    assert origins(tmp_path / "run.h5") == []


def test_inf_returned_by_the_model_is_reported_where_it_was_made(tmp_path):
    class Reciprocal(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 1 / x

    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), Reciprocal())
    with torch.no_grad():
        model[0].weight.fill_(1.0)
        model[0].bias.fill_(-10.0)  # ReLU gives exact zeros: 1/0 = +inf
    with hookdbg.record(tmp_path / "run.h5", quiet=True), torch.no_grad():
        model(torch.ones(1, 2))
    assert origins(tmp_path / "run.h5") == [("model.2", Phase.FWD, Slot.OUTPUT, "", 0)]
    assert b"; model returned it" in tables(tmp_path / "run.h5")["alerts"]["message"][0]


def test_a_container_whose_child_is_the_backward_origin_is_no_origin(tmp_path):
    class SqrtNorm(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sqrt((x * x).sum(-1, keepdim=True))  # infinite gradient at 0

    net = nn.Module()
    net.body = nn.Linear(3, 3)
    net.head = nn.Sequential(nn.Linear(3, 3), SqrtNorm())
    with torch.no_grad():
        net.head[0].weight.zero_()
        net.head[0].bias.zero_()  # the head's first layer outputs exact zeros
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        net.head(net.body(torch.randn(2, 3))).sum().backward()
    assert origins(tmp_path / "run.h5") == [("net.head.1", Phase.BWD, Slot.GRAD_INPUT, "0", 0)]


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_hugging_face_models_with_padded_attention_masks_raise_no_alert(tmp_path, attention):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_layer=2,
            n_head=2,
            n_embd=16,
            vocab_size=50,
            n_positions=16,
            attn_implementation=attention,
        )
    )
    bert = transformers.BertForSequenceClassification(
        transformers.BertConfig(
            num_hidden_layers=1,
            num_attention_heads=2,
            hidden_size=16,
            intermediate_size=32,
            vocab_size=50,
            max_position_embeddings=16,
            attn_implementation=attention,
        )
    )
    opt = torch.optim.AdamW([*gpt2.parameters(), *bert.parameters()], lr=1e-3)
    ids = torch.randint(0, 50, (3, 10))
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[0, 6:] = 0  # padding
    with hookdbg.record(tmp_path / "run.h5", quiet=True, on_nan="stop"):
        for _ in range(2):
            loss = gpt2(input_ids=ids, attention_mask=mask, labels=ids).loss
            loss = (
                loss + bert(input_ids=ids, attention_mask=mask, labels=torch.zeros(3).long()).loss
            )
            loss.backward()
            opt.step()
            opt.zero_grad()
    assert origins(tmp_path / "run.h5") == []


@pytest.mark.parametrize("options", [{"every": 2}, {"steps": "2:3"}])
def test_a_nan_born_in_a_step_not_recorded_is_named_where_it_is_first_seen(tmp_path, options):
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hookdbg.record(tmp_path / "run.h5", quiet=True, **options):
        for step in range(4):
            opt.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            if step == 1:  # step 1 is not recorded: its update goes wrong unseen
                with torch.no_grad():
                    model[2].weight[0, 0] = float("nan")
    t = tables(tmp_path / "run.h5")
    assert len(t["alerts"]) == 1
    alert = t["alerts"][0]
    assert module_names(t)[int(alert["module"])] == "model.2"
    assert (int(alert["step"]), int(alert["phase"]), int(alert["slot"])) == (
        2,
        int(Phase.FWD),
        int(Slot.PARAM),
    )
    assert alert["path"] == b"weight" and b"where nothing was recorded" in alert["message"]
