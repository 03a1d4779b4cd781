"""The run-up to an alert: an fp16 Linear whose output climbs to overflow
(samples/fp16_overflow.py, recorded by a real `hookdbg record`) shows its climb against
float16's largest value, step by step."""

from __future__ import annotations

import itertools

from hookdbg.analysis.alerts import alert_reports
from hookdbg.analysis.runup import LARGEST, run_up
from hookdbg.read import open_recording


def test_the_run_up_shows_the_climb_to_float16s_largest_value(fp16_h5):
    rec = open_recording(fp16_h5)
    first = alert_reports(rec)[0]
    step = int(first.alert["step"])
    assert first.module.name == "model.0" and first.alert["phase"] == 0  # forward
    climbs = run_up(rec, first)
    origin, fed = climbs[0], climbs[1]
    assert origin.dtype == "float16" and origin.largest == LARGEST["float16"] == 65504.0
    assert origin.steps == tuple(range(step - 4, step + 1))  # every step recorded
    # the weights grow 4x a step: so does every magnitude before the overflow
    finite = origin.absmax[:-1]
    assert all(3.5 < b / a < 4.5 for a, b in itertools.pairwise(finite)), finite
    headroom = [origin.headroom(i) for i in range(len(origin.steps))]
    assert 0.1 < headroom[-2] < 1 and headroom[-3] < headroom[-2]  # seen coming
    assert origin.nan[-1] + origin.inf[-1] > 0 and origin.nan[:-1] == (0,) * 4
    assert fed.label == "input[0]" and fed.inf == (0,) * 5  # what fed it stayed finite
    # parameters' values are summarised by their norms on most steps: no magnitude, no row
    assert all(any(v == v for v in c.absmax) or any(c.nan) or any(c.inf) for c in climbs)
