"""The step rule (hookdbg/recorder/steps.py) on the training loops people write."""

import numpy as np
import torch
from torch import nn

import hookdbg
from tests.helpers import module_names, tables


def steps_of(path) -> tuple[int, dict[str, list[int]]]:
    """Number of steps, and for each root module the steps its forward calls fell in."""
    t = tables(path)
    names = module_names(t)
    calls = t["calls"][(t["calls"]["phase"] == 0) & (t["calls"]["depth"] == 0)]
    by_root: dict[str, list[int]] = {}
    for row in calls:
        by_root.setdefault(names[int(row["module"])], []).append(int(row["step"]))
    return len(t["steps"]), by_root


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


def test_manual_weight_updates_without_an_optimizer(tmp_path):
    model = nn.Linear(3, 1)
    with hookdbg.record(tmp_path / "sgd.h5", quiet=True):
        for _ in range(5):
            model(torch.randn(2, 3)).pow(2).mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(-0.1 * p.grad)
                    p.grad = None
    t = tables(tmp_path / "sgd.h5")
    assert len(t["steps"]) == 5 and np.all(t["steps"]["backward"] == 1)


def test_validation_batches_are_steps_of_their_own(tmp_path):
    model, criterion = nn.Linear(3, 2), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    with hookdbg.record(tmp_path / "val.h5", quiet=True):
        for _ in range(2):
            opt.zero_grad()
            criterion(model(x), y).backward()
            opt.step()
        with torch.no_grad():
            for _ in range(3):
                criterion(model(x), y)
        opt.zero_grad()
        criterion(model(x), y).backward()
        opt.step()
    n, roots = steps_of(tmp_path / "val.h5")
    assert n == 6
    assert roots["model"] == [0, 1, 2, 3, 4, 5] and roots["criterion"] == [0, 1, 2, 3, 4, 5]


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
