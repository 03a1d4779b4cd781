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
