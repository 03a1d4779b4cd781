"""RecordOptions: which steps a recording records."""

import pytest

from hookdbg.options import RecordOptions


@pytest.mark.parametrize("every", [1, 2, 5])
@pytest.mark.parametrize("steps", [None, "3:", "2:11", "7"])
def test_steps_to_recorded_agrees_with_records_step(every, steps):
    options = RecordOptions.build(every=every, steps=steps)
    for step in range(40):
        ahead = next((d for d in range(40) if options.records_step(step + d)), None)
        assert options.steps_to_recorded(step) == ahead, step
