import numpy as np

from hookdbg.analysis.profile import profile
from hookdbg.read import open_recording
from hookdbg.store.schema import Phase


def test_profile_of_resnet18(resnet_h5):
    with open_recording(resnet_h5) as rec:
        prof = profile(rec)
        assert (prof.first, prof.last, prof.steps) == (0, 1, 2)
        rows = {(r.module.name, r.phase): r for r in prof.rows}
        layer1 = rows[("model.layer1.0", Phase.FWD)]
        assert layer1.calls_per_step == 1 and layer1.self_mean <= layer1.total_mean
        assert rows[("model.layer1.0.relu", Phase.FWD)].calls_per_step == 2  # used twice
        # self times add up to the root's total
        root = rows[("model", Phase.FWD)]
        fwd_self = sum(
            r.self_mean
            for (name, ph), r in rows.items()
            if ph == Phase.FWD and name.startswith("model")
        )
        assert np.isclose(fwd_self, root.total_mean, rtol=1e-6)
        assert 0 < sum(r.share for r in prof.rows) <= 1.0
        top = prof.sorted("self", 3)
        assert len(top) == 3 and top[0].self_mean >= top[1].self_mean >= top[2].self_mean
        only_bwd = profile(rec, 1, 1, (Phase.BWD,))
        assert only_bwd.steps == 1 and {r.phase for r in only_bwd.rows} == {Phase.BWD}


def test_backward_of_a_module_called_twice_is_two_spans_of_its_own(tmp_path):
    """Two micro-batches through one Linear with user code between the backward passes:
    the first call's backward must not stretch to the second's."""
    import time

    import torch
    from torch import nn

    import hookdbg

    model = nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with hookdbg.record(tmp_path / "run.h5", quiet=True):
        for _ in range(2):
            for _ in range(2):  # gradient accumulation
                model(torch.randn(8, 64)).sum().backward()
                time.sleep(0.05)  # user code between the backward passes
            opt.step()
            opt.zero_grad()
    with open_recording(tmp_path / "run.h5") as rec:
        calls = rec.calls(columns=["phase", "index", "total"])
        bwd = calls[calls["phase"] == Phase.BWD]
        assert len(bwd) == 4 and bwd["total"].max() < 0.02  # each span is its own
        prof = profile(rec)
        assert 0 < sum(r.share for r in prof.rows) <= 1.0


def test_gan_profile_shares_add_up_to_at_most_the_step(tmp_path):
    import torch
    from torch import nn

    import hookdbg

    torch.manual_seed(0)
    net_g = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
    net_d = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    opt_d = torch.optim.Adam(net_d.parameters())
    opt_g = torch.optim.Adam(net_g.parameters())
    bce = nn.BCEWithLogitsLoss()
    with hookdbg.record(tmp_path / "gan.h5", quiet=True):
        for _ in range(3):  # the DCGAN example: three discriminator calls, three backwards
            opt_d.zero_grad()
            bce(net_d(torch.randn(8, 16)), torch.ones(8, 1)).backward()
            fake = net_g(torch.randn(8, 8))
            bce(net_d(fake.detach()), torch.zeros(8, 1)).backward()
            opt_d.step()
            opt_g.zero_grad()
            bce(net_d(fake), torch.ones(8, 1)).backward()
            opt_g.step()
    with open_recording(tmp_path / "gan.h5") as rec:
        prof = profile(rec)
        assert prof.steps == 3
        assert 0 < sum(r.share for r in prof.rows) <= 1.0
        for r in prof.rows:
            assert r.self_mean <= prof.step_mean
