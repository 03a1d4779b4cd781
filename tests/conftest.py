import pytest
import torch


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
