from hookdbg.analysis.ranks import Desync, RankDiff, StepSpread
from hookdbg.store.schema import Slot


def test_the_replicas_last_agreed_at_the_compared_step_before_the_first_desync():
    desync = Desync(5, "model.head", Slot.PARAM, "weight", {0: 1.0, 1: 1.5})
    assert RankDiff(0.0, 0.0, [0, 2, 4, 5, 6], 10, [desync]).last_agreed == 4
    assert RankDiff(0.0, 0.0, [5, 6], 4, [desync]).last_agreed is None  # at once
    assert RankDiff(0.0, 0.0, [0, 1], 4).last_agreed is None  # in sync


def test_the_lag_is_measured_against_the_fastest_rank():
    spread = StepSpread(3, {0: 0.010, 1: 0.025, 2: 0.012})
    assert (spread.slowest, round(spread.lag, 9), round(spread.lag_share, 9)) == (1, 0.015, 1.5)
    assert StepSpread(0, {0: 0.0, 1: 0.5}).lag_share == 0.0  # no time to compare with
