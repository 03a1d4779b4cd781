"""The step rule (hookdbg/recorder/steps/steps.py) on the training loops people write."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

import hookdbg
from hookdbg.store.schema import ModuleKind, StepKind
from tests.helpers import module_id, module_names, tables


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
    """A Normalize module applied per sample in a Dataset, a target network under
    no_grad in train mode inside the iteration, a sample after the optimizer step (an
    eval batch of its own), and an eval loop: only optimizer steps count."""
    normalize = nn.Sequential(nn.Identity())  # a transform: no parameters
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    target = nn.Linear(3, 2)  # never .eval()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        for _ in range(4):
            batch = torch.stack([normalize(torch.randn(3)) for _ in range(5)])
            opt.zero_grad()
            out = model(batch)
            with torch.no_grad():
                goal = target(batch)
            (out - goal).pow(2).mean().backward()
            opt.step()
            with torch.no_grad():
                model(torch.randn(1, 3))  # a sample, model still in train mode
        model.eval()
        with torch.no_grad():
            for _ in range(2):
                model(torch.randn(2, 3))
    n, roots = steps_of(tmp_path / "run.h5")
    assert n == 4 and eval_batches(tmp_path / "run.h5") == 4 + 2
    assert roots["normalize"] == [0] * 5 + [1] * 5 + [2] * 5 + [3] * 5
    assert roots["target"] == [0, 1, 2, 3]
    assert roots["model"] == [0, -1, 1, -1, 2, -1, 3, -1, -1, -1]


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
    # each epoch: two test batches, and the sample, an eval batch of its own
    assert n == 2 and eval_batches(tmp_path / "vae.h5") == 6
    assert roots["model.fc3"] == [-1, -1] and roots["model.fc4"] == [-1, -1]
    t = tables(tmp_path / "vae.h5")
    names = module_names(t)
    segments = {
        names[int(r["module"])]: int(r["segment"])
        for r in t["calls"][(t["calls"]["phase"] == 0) & (t["calls"]["depth"] == 0)]
    }
    assert segments["model.fc3"] == segments["model.fc4"]  # the last sample's batch


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


def test_layers_trained_in_turn_each_with_its_own_optimizer(tmp_path):
    """The forward-forward example: each layer owns an optimizer and is trained for a
    few iterations before the next layer starts."""

    class Layer(nn.Linear):
        def __init__(self, n_in: int, n_out: int) -> None:
            super().__init__(n_in, n_out)
            self.opt = torch.optim.Adam(self.parameters(), lr=0.03)

        def fit(self, x_pos: torch.Tensor, x_neg: torch.Tensor) -> tuple:
            for _ in range(3):
                g_pos, g_neg = self(x_pos).pow(2).mean(1), self(x_neg).pow(2).mean(1)
                loss = torch.log1p(torch.exp(torch.cat([2 - g_pos, g_neg - 2]))).mean()
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
            return self(x_pos).detach(), self(x_neg).detach()

    torch.manual_seed(0)
    first, second = Layer(8, 6), Layer(6, 6)
    h_pos, h_neg = torch.randn(16, 8), torch.randn(16, 8)
    with hookdbg.record(tmp_path / "ff.h5", quiet=True):
        for layer in (first, second):
            h_pos, h_neg = layer.fit(h_pos, h_neg)
    n, roots = steps_of(tmp_path / "ff.h5")
    assert n == 6
    # the first layer's outputs, made for the second with gradients on, fall in the
    # step where the second layer's training begins
    assert roots["first"] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert roots["second"][:6] == [3, 3, 4, 4, 5, 5]


def test_a_new_optimizer_mid_run_is_no_new_run(tmp_path):
    """A warm-up with SGD, then an Adam made in its place (the SGD is garbage)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))

    def train(optimizer: torch.optim.Optimizer, iterations: int) -> None:
        for _ in range(iterations):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()

    with hookdbg.record(tmp_path / "warmup.h5", quiet=True):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        train(optimizer, 3)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        train(optimizer, 5)
    n, roots = steps_of(tmp_path / "warmup.h5")
    assert n == 8 and roots["model"] == list(range(8))


def test_no_grad_test_loop_without_eval_is_one_eval_batch_per_batch(tmp_path):
    """The super_resolution example: its test loop runs under no_grad and never calls
    .eval(); so does a prediction after each LBFGS step (time_sequence_prediction)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.PixelShuffle(2))
    criterion = nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    x, target = torch.randn(4, 1, 4, 4), torch.randn(4, 1, 8, 8)
    with hookdbg.record(tmp_path / "sr.h5", quiet=True):
        for _epoch in range(2):
            for _ in range(3):
                optimizer.zero_grad()
                criterion(model(x), target).backward()
                optimizer.step()
            with torch.no_grad():
                for _ in range(2):
                    criterion(model(x), target)
    n, roots = steps_of(tmp_path / "sr.h5")
    assert n == 6 and eval_batches(tmp_path / "sr.h5") == 4
    assert roots["model"] == [0, 1, 2, -1, -1, 3, 4, 5, -1, -1]
    assert roots["criterion"] == roots["model"]


def test_a_prediction_after_each_lbfgs_step_is_an_eval_batch(tmp_path):
    seq = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8, max_iter=3)
    x, y, test_x = torch.randn(16, 3), torch.randn(16, 1), torch.randn(4, 3)

    def closure():
        optimizer.zero_grad()
        loss = (seq(x) - y).pow(2).mean()
        loss.backward()
        return loss

    with hookdbg.record(tmp_path / "seq.h5", quiet=True):
        for _ in range(3):
            optimizer.step(closure)
            with torch.no_grad():
                seq(test_x)
    n, roots = steps_of(tmp_path / "seq.h5")
    assert n == 3 and eval_batches(tmp_path / "seq.h5") == 3
    assert [s for s in roots["seq"] if s != -1] == [0] * 3 + [1] * 3 + [2] * 3
    assert roots["seq"][3::4] == [-1, -1, -1]


class TinyGPT(nn.Module):
    """minGPT's shape: ``generate`` calls the model once per new token."""

    def __init__(self, vocab: int = 11, block_size: int = 8, width: int = 16) -> None:
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(block_size, width)
        self.lm_head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        return self.lm_head(x.cumsum(1))  # causal, crudely

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        for _ in range(max_new_tokens):
            logits = self(idx[:, -self.block_size :])
            probs = torch.softmax(logits[:, -1, :], dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, num_samples=1)), dim=1)
        return idx


def test_one_generate_call_is_one_eval_batch(tmp_path):
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randint(0, 11, (4, 8)), torch.randint(0, 11, (4, 8))
    with hookdbg.record(tmp_path / "gpt.h5", quiet=True):
        for it in range(4):
            model.train()
            loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            model.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if it % 2 == 1:  # minGPT's trainer callback: a few samples
                model.eval()
                for _ in range(3):
                    model.generate(torch.zeros(1, 1, dtype=torch.long), 5)
        model.eval()
        with torch.no_grad():  # a test loop still has one eval batch per batch
            for _ in range(2):
                model(x)
    n, _ = steps_of(tmp_path / "gpt.h5")
    assert n == 4 and eval_batches(tmp_path / "gpt.h5") == 2 * 3 + 2
    t = tables(tmp_path / "gpt.h5")
    calls = t["calls"][(t["calls"]["phase"] == 0) & (t["calls"]["depth"] == 0)]
    per_batch = np.unique(calls["segment"], return_counts=True)[1]
    assert per_batch.tolist() == [1, 1] + [5] * 3 + [1, 1] + [5] * 3 + [1, 1]


@pytest.mark.parametrize("how", ["torch.load", "deepcopy", "load_state_dict"])
def test_a_reloaded_model_tests_in_eval_batches_of_its_own(tmp_path, how):
    """After training with a validation loop, the best model is loaded again (or
    copied) and tested: its first test batch is not the original's last eval batch."""
    torch.manual_seed(0)

    def make() -> nn.Module:
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    model = make()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    with hookdbg.record(tmp_path / "best.h5", quiet=True):
        for _epoch in range(2):
            model.train()
            for _ in range(2):
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
            model.eval()
            with torch.no_grad():
                for _ in range(2):
                    model(x)
        if how == "torch.load":
            torch.save(model, tmp_path / "best.pt")
            best = torch.load(tmp_path / "best.pt", weights_only=False)
        elif how == "deepcopy":
            best = copy.deepcopy(model)
        else:
            best = make()
            best.load_state_dict(model.state_dict())
        best.eval()
        with torch.no_grad():
            for _ in range(3):
                best(x)
    n, roots = steps_of(tmp_path / "best.h5")
    assert n == 4 and eval_batches(tmp_path / "best.h5") == 2 * 2 + 3
    assert roots["best"] == [-1] * 3
    t = tables(tmp_path / "best.h5")
    calls = t["calls"][(t["calls"]["phase"] == 0) & (t["calls"]["depth"] == 0)]
    assert np.unique(calls["segment"]).size == len(calls)  # no two forwards share one


def test_an_ensemble_batch_stays_one_eval_batch(tmp_path):
    """Two models run on each test batch: one eval batch each time, the first included."""
    a, b = nn.Linear(3, 2), nn.Linear(3, 2)
    opt = torch.optim.SGD(a.parameters(), lr=0.1)
    with hookdbg.record(tmp_path / "ens.h5", quiet=True):
        for _ in range(2):
            opt.zero_grad()
            a(torch.randn(4, 3)).sum().backward()
            opt.step()
        a.eval(), b.eval()
        with torch.no_grad():
            for _ in range(3):
                x = torch.randn(4, 3)
                a(x) + b(x)
    n, roots = steps_of(tmp_path / "ens.h5")
    assert n == 2 and eval_batches(tmp_path / "ens.h5") == 3
    assert roots["a"] == [0, 1, -1, -1, -1] and roots["b"] == [-1, -1, -1]


def test_a_gan_progress_sample_is_an_eval_batch(tmp_path):
    """The DCGAN tutorial's ``netG(fixed_noise)`` under no_grad after the iteration."""
    torch.manual_seed(0)
    net_g, net_d = nn.Sequential(nn.Linear(4, 8), nn.Tanh()), nn.Sequential(nn.Linear(8, 1))
    opt_d = torch.optim.Adam(net_d.parameters())
    opt_g = torch.optim.Adam(net_g.parameters())
    bce, fixed_noise = nn.BCEWithLogitsLoss(), torch.randn(2, 4)
    with hookdbg.record(tmp_path / "gan.h5", quiet=True):
        for i in range(4):
            opt_d.zero_grad()
            loss_real = bce(net_d(torch.randn(8, 8)), torch.ones(8, 1))
            fake = net_g(torch.randn(8, 4))
            (loss_real + bce(net_d(fake.detach()), torch.zeros(8, 1))).backward()
            opt_d.step()
            opt_g.zero_grad()
            bce(net_d(fake), torch.ones(8, 1)).backward()
            opt_g.step()
            if i % 2 == 1:
                with torch.no_grad():
                    net_g(fixed_noise)
    n, roots = steps_of(tmp_path / "gan.h5")
    assert n == 4 and eval_batches(tmp_path / "gan.h5") == 2
    assert roots["net_g"] == [0, 1, -1, 2, 3, -1]
    assert roots["net_d"] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]


def test_a_generator_run_under_no_grad_for_the_critic_is_part_of_the_step(tmp_path):
    """The fakes for the critic's step come from ``G`` under no_grad in train mode, at
    the start of every iteration: no eval batch, one step per iteration."""
    net_g, net_d = nn.Linear(4, 8), nn.Linear(8, 1)
    opt_g, opt_d = torch.optim.Adam(net_g.parameters()), torch.optim.Adam(net_d.parameters())
    with hookdbg.record(tmp_path / "gan.h5", quiet=True):
        for _ in range(4):
            with torch.no_grad():
                fake = net_g(torch.randn(8, 4))
            opt_d.zero_grad()
            (net_d(fake).mean() - net_d(torch.randn(8, 8)).mean()).backward()
            opt_d.step()
            opt_g.zero_grad()
            (-net_d(net_g(torch.randn(8, 4))).mean()).backward()
            opt_g.step()
    n, roots = steps_of(tmp_path / "gan.h5")
    assert n == 4 and eval_batches(tmp_path / "gan.h5") == 0
    assert roots["net_g"] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_actor_critic_steps_each_optimizer_in_turn(tmp_path):
    """SAC's order: the critic steps before the actor has run in the iteration, then
    the actor, then the temperature (a bare tensor): one step per iteration."""
    critic, actor = nn.Linear(5, 1), nn.Linear(4, 1)
    log_alpha = torch.zeros(1, requires_grad=True)
    q_opt, pi_opt = torch.optim.Adam(critic.parameters()), torch.optim.Adam(actor.parameters())
    alpha_opt = torch.optim.Adam([log_alpha])
    with hookdbg.record(tmp_path / "sac.h5", quiet=True):
        for _ in range(3):
            state = torch.randn(8, 4)
            q_opt.zero_grad()
            critic(torch.cat([state, torch.randn(8, 1)], 1)).pow(2).mean().backward()
            q_opt.step()
            action = actor(state)
            pi_opt.zero_grad()
            (log_alpha.exp().detach() - critic(torch.cat([state, action], 1))).mean().backward()
            pi_opt.step()
            alpha_opt.zero_grad()
            (log_alpha * action.detach().pow(2).mean()).sum().backward()
            alpha_opt.step()
    n, roots = steps_of(tmp_path / "sac.h5")
    assert n == 3 and roots["actor"] == [0, 1, 2] and roots["critic"] == [0, 0, 1, 1, 2, 2]


class WeightNormed(nn.Module):
    """A convolution under weight norm (torch.nn.utils.parametrize), as wav2vec2's
    positional convolution is."""

    def __init__(self):
        super().__init__()
        self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(2, 4, 3), dim=2)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(self.conv(x).mean(-1))


def _init_weights(module: nn.Module) -> None:
    """Hugging Face's weight initialisation reads the parametrized weight, with no
    module call around (its variable is ``module``)."""
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, nn.Conv1d):
                nn.init.normal_(sub.parametrizations.weight.original1, std=sub.weight.std())


@pytest.mark.parametrize("pure", [False, True], ids=["C path", "Python path"])
def test_parametrizations_read_at_build_time_are_no_eval_batch(tmp_path, monkeypatch, pure):
    from hookdbg.recorder import accelerated

    monkeypatch.setenv(accelerated.PURE_PYTHON, "1" if pure else "")
    torch.manual_seed(0)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        model = WeightNormed()
        _init_weights(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(5, 2, 8)).square().mean().backward()
            opt.step()
    n, roots = steps_of(tmp_path / "run.h5")
    assert n == 3 and eval_batches(tmp_path / "run.h5") == 0
    assert roots == {"model": [0, 1, 2]}
    t = tables(tmp_path / "run.h5")
    modules = t["modules"][t["modules"]["kind"] == ModuleKind.MODULE]
    assert all(name.startswith(b"model") for name in modules["name"]), modules["name"]
    parametrized = module_id(t, "model.conv.parametrizations.weight")
    conv = module_id(t, "model.conv")
    forward = t["calls"][t["calls"]["phase"] == 0]
    by_call = {int(r["call"]): r for r in forward}
    inside = [r for r in forward if r["module"] == parametrized]
    assert [int(r["step"]) for r in inside] == [0, 1, 2]  # part of the call reading it
    assert all(by_call[int(r["parent"])]["module"] == conv for r in inside)


def _plain_tensors():
    torch.manual_seed(0)
    w = torch.randn(6, 3, requires_grad=True)
    return w, torch.randn(16, 6), torch.randn(16, 3)


def test_tensors_trained_without_modules_step_at_each_optimizer_step(tmp_path):
    """No nn.Module at all: the backward passes say where the steps are, gradient
    accumulation included (rule 7)."""
    w, x, y = _plain_tensors()
    opt = torch.optim.SGD([w], lr=0.1)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        for _ in range(3):
            for half in (x[:8], x[8:]):  # two micro-batches per step
                ((half @ w - y[:8]) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
    t = tables(tmp_path / "run.h5")
    assert list(t["steps"]["kind"]) == [StepKind.TRAIN] * 3
    assert list(t["steps"]["optimizer_steps"]) == [1, 1, 1] and len(t["losses"]) == 6
    assert sorted(t["losses"]["step"].tolist()) == [0, 0, 1, 1, 2, 2]


def test_tensors_updated_by_hand_are_a_step_per_backward(tmp_path):
    w, x, y = _plain_tensors()
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        for _ in range(4):
            ((x @ w - y) ** 2).mean().backward()
            with torch.no_grad():
                w -= 0.1 * w.grad
            w.grad = None
    t = tables(tmp_path / "run.h5")
    assert list(t["steps"]["kind"]) == [StepKind.TRAIN] * 4
    assert t["losses"]["step"].tolist() == [0, 1, 2, 3]


def test_lbfgs_on_plain_tensors_is_a_step_per_optimizer_step(tmp_path):
    """The closure's backward passes run inside the optimizer step: they begin none."""
    w, x, y = _plain_tensors()
    opt = torch.optim.LBFGS([w], max_iter=4)

    def closure():
        opt.zero_grad()
        loss = ((x @ w - y) ** 2).mean()
        loss.backward()
        return loss

    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        for _ in range(2):
            opt.step(closure)
    t = tables(tmp_path / "run.h5")
    assert list(t["steps"]["kind"]) == [StepKind.TRAIN] * 2
    assert len(t["losses"]) > 2  # several closure evaluations per step
