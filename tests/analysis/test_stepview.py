import numpy as np

from hookdbg.analysis.stepview import eval_range, module_rows, segment_rows
from hookdbg.read import open_recording


def test_module_rows_over_eval_batches_are_those_of_each_batch(eval_h5):
    """`hookdbg show --eval --steps 1:3` reads what the TUI reads for eval 1 and eval 2."""
    with open_recording(eval_h5) as rec:
        head = rec.modules.resolve("model.head").id
        view = module_rows(rec, head, 1, 2, evals=True)
        assert view.span == "eval batches 1-2" and len(view.rows)
        each = [segment_rows(rec, "tensors", n, True, None) for n in (1, 2)]
        expected = np.concatenate([rows[rows["module"] == head] for rows in each])
        assert view.rows["call"].tolist() == expected["call"].tolist()
        assert set(view.call_index.values()) == {0}  # one call of the head per batch


def test_module_rows_of_one_training_step(eval_h5):
    with open_recording(eval_h5) as rec:
        head = rec.modules.resolve("model.head").id
        view = module_rows(rec, head, 3, 3, evals=False)
        assert view.span == "step 3" and set(view.rows["step"].tolist()) == {3}
        assert not rec.is_eval(view.rows["segment"]).any()


def test_eval_range_numbers_the_eval_batches(eval_h5):
    with open_recording(eval_h5) as rec:
        assert eval_range(rec, None, None) == (0, 3)
        assert eval_range(rec, 2, 9) == (2, 3)
        first, last = eval_range(rec, 5, None)
        assert first > last
