import os

import pytest
import torch

# Without a GPU, Triton kernels (hookdbg/recorder/summaries/blockkernel.py) run in Triton's
# interpreter on CPU tensors: tests/recorder/test_blockstats.py checks them that way. The
# switch is read when triton is first imported, so it is set before any test runs.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _global_hooks_untouched():
    """Every test must leave torch's global hook registries as it found them."""
    from torch.nn.modules import module as m
    from torch.optim import optimizer as o

    registries = (
        m._global_forward_pre_hooks,
        m._global_forward_hooks,
        m._global_backward_hooks,
        m._global_backward_pre_hooks,
        o._global_optimizer_pre_hooks,
        o._global_optimizer_post_hooks,
    )
    before = [dict(r) for r in registries]
    yield
    assert [dict(r) for r in registries] == before, "a test left global hooks behind"


@pytest.fixture(autouse=True)
def _few_threads():
    torch.set_num_threads(1)


def _record(tmp_path_factory, name: str, *args: str):
    from tests.helpers import hookdbg

    path = tmp_path_factory.mktemp("recordings") / f"{name}.h5"
    out = hookdbg("record", "-q", "-o", path, *args)
    assert out.returncode == 0, out.stderr
    return path


@pytest.fixture(scope="session")
def mlp_h5(tmp_path_factory):
    """samples/numnet_mlp.py, 4 steps."""
    from tests.helpers import SAMPLES

    return _record(tmp_path_factory, "mlp", SAMPLES / "numnet_mlp.py", "--steps", "4")


@pytest.fixture(scope="session")
def eval_h5(tmp_path_factory):
    """samples/numnet_mlp.py, 6 steps validated every 3: 6 training steps, 4 eval batches."""
    from tests.helpers import SAMPLES

    return _record(
        tmp_path_factory, "eval", SAMPLES / "numnet_mlp.py", "--steps", "6", "--eval-every", "3"
    )


@pytest.fixture(scope="session")
def nan_h5(tmp_path_factory):
    """samples/nan_blowup.py: NaN born in model.standardize's forward at step 3."""
    from tests.helpers import SAMPLES

    return _record(tmp_path_factory, "nan", SAMPLES / "nan_blowup.py", "--steps", "5")


@pytest.fixture(scope="session")
def fp16_h5(tmp_path_factory):
    """samples/fp16_overflow.py: model.0's float16 output climbs 4x a step to inf at
    step 8, in its forward."""
    from tests.helpers import SAMPLES

    return _record(tmp_path_factory, "fp16", SAMPLES / "fp16_overflow.py")


# a GAN's loop: two loss sites (errD, errG) and two optimizers in each step
GAN = """
import torch
from torch import nn

torch.manual_seed(0)
disc, gen = nn.Linear(4, 1), nn.Linear(2, 4)
opt_d = torch.optim.SGD(disc.parameters(), lr=0.1)
opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
for step in range(5):
    opt_d.zero_grad()
    fake = gen(torch.randn(8, 2)).detach()
    real = nn.functional.softplus(-disc(torch.randn(8, 4))).mean()
    errD = real + nn.functional.softplus(disc(fake)).mean()
    errD.backward()
    opt_d.step()
    opt_g.zero_grad()
    errG = nn.functional.softplus(-disc(gen(torch.randn(8, 2)))).mean()
    errG.backward()
    opt_g.step()
"""


@pytest.fixture(scope="session")
def gan_h5(tmp_path_factory):
    """5 steps of a small GAN: two loss sites, errD first, then errG."""
    script = tmp_path_factory.mktemp("gan") / "gan.py"
    script.write_text(GAN)
    return _record(tmp_path_factory, "gan", script)


@pytest.fixture(scope="session")
def resnet_h5(tmp_path_factory):
    """samples/resnet_fakedata.py: torchvision resnet18, 2 steps of 4x3x32x32."""
    from tests.helpers import SAMPLES

    return _record(
        tmp_path_factory,
        "resnet",
        SAMPLES / "resnet_fakedata.py",
        "--steps",
        "2",
        "--batch",
        "4",
        "--size",
        "32",
    )


@pytest.fixture(scope="session")
def deep_h5(tmp_path_factory):
    """tests/cli/nested_chain.py: a chain of modules 1000 deep, each calling the next, 2
    steps, under the recursion limit python needs for it (the script sets it): deeper
    than the default limit a reader runs under."""
    from tests.helpers import ROOT

    chain = ROOT / "tests" / "cli" / "nested_chain.py"
    return _record(tmp_path_factory, "deep", chain, "1000", "--limit", "4500")
