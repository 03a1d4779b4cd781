import numpy as np

from hookdbg.analysis.captures import NonFinite, modules_stored, nonfinite, stored_calls
from hookdbg.read import open_recording
from hookdbg.store.schema import Slot


def test_the_flight_recorder_keeps_the_nan_origin_and_the_step_before(nan_h5):
    """What `hookdbg tensor nan.h5 standardize --slot output --call K` picks from."""
    with open_recording(nan_h5) as rec:
        assert "model.standardize" in modules_stored(rec)
        standardize = rec.modules.resolve("standardize")
        outputs = stored_calls(rec.captured(standardize.id), Slot.OUTPUT, "")
        assert [c.step for c in outputs] == [2, 3]
        assert nonfinite(rec.tensor(outputs[0])) == NonFinite(0, 0, None)
        born = nonfinite(rec.tensor(outputs[1]))
        assert born is not None and born.nan == 16 and born.inf == 0 and born.first == (0, 0)
        assert stored_calls(rec.captured(standardize.id), Slot.GRAD_OUTPUT, "") == []


def test_nonfinite_of_tensors_that_cannot_hold_any():
    assert nonfinite(np.arange(4)) is None
    assert nonfinite(np.zeros(0, dtype=np.float32)) is None
    assert nonfinite(np.array([1.0, np.inf, np.nan])) == NonFinite(1, 1, (1,))
