"""The step rule (hookdbg/recorder/steps.py) on the training loops people write."""

import numpy as np
import pytest
import torch
from torch import nn

import hookdbg
from hookdbg.store.schema import StepKind
from tests.helpers import module_names, tables


def steps_of(path) -> tuple[int, dict[str, list[int]]]:
    """Number of training steps, and for each root module the steps its forward calls
    fell in (eval batches' calls as ``-1``)."""
    t = tables(path)
    names = module_names(t)
    evals = set(t["steps"]["segment"][t["steps"]["kind"] == StepKind.EVAL].tolist())
    calls = t["calls"][(t["calls"]["phase"] == 0) & (t["calls"]["depth"] == 0)]
    by_root: dict[str, list[int]] = {}
    for row in calls:
        step = -1 if int(row["segment"]) in evals else int(row["step"])
        by_root.setdefault(names[int(row["module"])], []).append(step)
    return int(np.count_nonzero(t["steps"]["kind"] == StepKind.TRAIN)), by_root


def eval_batches(path) -> int:
    return int(np.count_nonzero(tables(path)["steps"]["kind"] == StepKind.EVAL))


def test_gan_with_two_optimizers_is_one_step_per_iteration(tmp_path):
    torch.manual_seed(0)
    net_g, net_d = nn.Sequential(nn.Linear(4, 8), nn.Tanh()), nn.Sequential(nn.Linear(8, 1))
    opt_d = torch.optim.Adam(net_d.parameters())
    opt_g = torch.optim.Adam(net_g.parameters())
    bce = nn.BCEWithLogitsLoss()
    with hookdbg.record(tmp_path / "gan.h5", quiet=True):
        for _ in range(4):  # the DCGAN tutorial's order of calls
            real = torch.randn(8, 8)
            opt_d.zero_grad()
            loss_real = bce(net_d(real), torch.ones(8, 1))
            fake = net_g(torch.randn(8, 4))
            loss_fake = bce(net_d(fake.detach()), torch.zeros(8, 1))
            (loss_real + loss_fake).backward()
            opt_d.step()
            opt_g.zero_grad()
            bce(net_d(fake), torch.ones(8, 1)).backward()
            opt_g.step()
    n, roots = steps_of(tmp_path / "gan.h5")
    assert n == 4
    assert roots["net_d"] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert roots["net_g"] == [0, 1, 2, 3]


def test_gradient_accumulation_is_one_step_per_optimizer_step(tmp_path):
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hookdbg.record(tmp_path / "acc.h5", quiet=True):
        for _ in range(3):
            for _ in range(4):  # micro-batches
                model(torch.randn(2, 3)).sum().backward()
            opt.step()
            opt.zero_grad()
    n, roots = steps_of(tmp_path / "acc.h5")
    assert n == 3 and roots["model"] == [0] * 4 + [1] * 4 + [2] * 4


@pytest.mark.parametrize(
    ("options", "recorded"),
    [
        ({}, 5),
        ({"every": 2}, 3),
        ({"steps": "1:3"}, 2),
        ({"every": 2, "modules": "!*"}, 3),  # the root not selected: no call recorded
    ],
)
def test_manual_weight_updates_without_an_optimizer(tmp_path, options, recorded):
    """Only a backward says such a step ended, and root calls that are not recorded
    (steps --every/--steps leave out, a root --modules leaves out) must hear of it too:
    otherwise they ran into one another as eval batches."""
    model = nn.Linear(3, 1)
    with hookdbg.record(tmp_path / "sgd.h5", quiet=True, **options):
        for _ in range(5):
            model(torch.randn(2, 3)).pow(2).mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(-0.1 * p.grad)
                    p.grad = None
    t = tables(tmp_path / "sgd.h5")
    assert len(t["steps"]) == 5 and np.all(t["steps"]["kind"] == StepKind.TRAIN)
    assert list(t["steps"]["step"]) == [0, 1, 2, 3, 4]
    assert int(t["steps"]["recorded"].sum()) == recorded


def test_validation_batches_are_eval_batches_kept_apart(tmp_path):
    model, criterion = nn.Linear(3, 2), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    with hookdbg.record(tmp_path / "val.h5", quiet=True):
        for _ in range(2):
            opt.zero_grad()
            criterion(model(x), y).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            for _ in range(3):
                criterion(model(x), y)
        model.train()
        opt.zero_grad()
        criterion(model(x), y).backward()
        opt.step()
    n, roots = steps_of(tmp_path / "val.h5")
    assert n == 3 and eval_batches(tmp_path / "val.h5") == 3
    assert roots["model"] == [0, 1, -1, -1, -1, 2] and roots["criterion"] == roots["model"]
    t = tables(tmp_path / "val.h5")
    # an eval batch carries the number of training steps before it, the next step too
    assert t["steps"]["step"].tolist() == [0, 1, 2, 2, 2, 2]


def test_per_sample_transforms_and_samples_belong_to_their_iteration(tmp_path):
    """A Normalize module applied per sample in a Dataset, a GAN-style sample under
    no_grad after the optimizer step, and an eval loop: only optimizer steps count."""
    normalize = nn.Sequential(nn.Identity())  # a transform: no parameters
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        for _ in range(4):
            batch = torch.stack([normalize(torch.randn(3)) for _ in range(5)])
            opt.zero_grad()
            model(batch).pow(2).mean().backward()
            opt.step()
            with torch.no_grad():
                model(torch.randn(1, 3))  # a sample, model still in train mode
        model.eval()
        with torch.no_grad():
            for _ in range(2):
                model(torch.randn(2, 3))
    n, roots = steps_of(tmp_path / "run.h5")
    assert n == 4 and eval_batches(tmp_path / "run.h5") == 2
    assert roots["normalize"] == [0] * 5 + [1] * 5 + [2] * 5 + [3] * 5
    assert roots["model"] == [0, 0, 1, 1, 2, 2, 3, 3, -1, -1]


def test_a_submodule_called_on_its_own_is_no_step_of_its_own(tmp_path):
    """The VAE example: ``model.decode(z)`` calls ``self.fc3`` then ``self.fc4``."""

    class VAE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc3, self.fc4 = nn.Linear(4, 2), nn.Linear(2, 3), nn.Linear(3, 4)

        def decode(self, z: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(self.fc4(torch.relu(self.fc3(z))))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.decode(self.fc1(x))

    model = VAE()
    opt = torch.optim.Adam(model.parameters())
    with hookdbg.record(tmp_path / "vae.h5", quiet=True):
        for _ in range(2):
            opt.zero_grad()
            model(torch.rand(8, 4)).sum().backward()
            opt.step()
            model.eval()
            with torch.no_grad():
                for _ in range(2):
                    model(torch.rand(8, 4))  # test loop
                model.decode(torch.randn(5, 2))  # a sample
            model.train()
    n, roots = steps_of(tmp_path / "vae.h5")
    assert n == 2 and eval_batches(tmp_path / "vae.h5") == 4
    assert roots["model.fc3"] == [-1, -1] and roots["model.fc4"] == [-1, -1]


def test_teacher_in_eval_mode_is_part_of_the_student_step(tmp_path):
    teacher, student = nn.Linear(3, 2).eval(), nn.Linear(3, 2)
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    with hookdbg.record(tmp_path / "kd.h5", quiet=True):
        for _ in range(3):
            x = torch.randn(4, 3)
            with torch.no_grad():
                target = teacher(x)
            opt.zero_grad()
            (student(x) - target).pow(2).mean().backward()
            opt.step()
    n, roots = steps_of(tmp_path / "kd.h5")
    assert n == 3 and eval_batches(tmp_path / "kd.h5") == 0
    assert roots["teacher"] == [0, 1, 2] and roots["student"] == [0, 1, 2]


def test_eval_loop_of_another_model_then_training(tmp_path):
    """Validation of an EMA copy, then training resumes: the eval batches stay apart."""
    model = nn.Linear(3, 2)
    ema = nn.Linear(3, 2).eval()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hookdbg.record(tmp_path / "ema.h5", quiet=True):
        for _epoch in range(2):
            for _ in range(2):
                opt.zero_grad()
                model(torch.randn(4, 3)).sum().backward()
                opt.step()
            with torch.no_grad():
                for _ in range(3):
                    ema(torch.randn(4, 3))
    n, roots = steps_of(tmp_path / "ema.h5")
    assert n == 4 and eval_batches(tmp_path / "ema.h5") == 6
    assert roots["model"] == [0, 1, 2, 3] and roots["ema"] == [-1] * 6


def test_lbfgs_closure_forwards_stay_in_their_step(tmp_path):
    model = nn.Linear(3, 1)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=4)
    x, y = torch.randn(8, 3), torch.randn(8, 1)

    def closure():
        opt.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        return loss

    with hookdbg.record(tmp_path / "lbfgs.h5", quiet=True):
        for _ in range(3):
            opt.step(closure)
    n, roots = steps_of(tmp_path / "lbfgs.h5")
    assert n == 3 and len(roots["model"]) > 3 and sorted(set(roots["model"])) == [0, 1, 2]


def test_an_optimizer_that_never_steps_does_not_freeze_the_steps(tmp_path):
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    spare = torch.optim.SGD(model.parameters(), lr=0.01)  # noqa: F841  (found, never used)
    with hookdbg.record(tmp_path / "spare.h5", quiet=True):
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(2, 3)).sum().backward()
            opt.step()
    n, _ = steps_of(tmp_path / "spare.h5")
    assert n == 4  # the first step absorbs one iteration before the rule corrects itself
