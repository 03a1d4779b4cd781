import numpy as np
import pytest

from hookdbg.analysis.query import QueryError, parse
from hookdbg.analysis.search import search
from hookdbg.read import open_recording
from hookdbg.store.schema import Phase, Slot


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("foo>3", "unknown statistic 'foo'"),
        ("max>abc", "'abc' is not a number"),
        ("colour:red", "unknown field 'colour'"),
        ("phase:sideways", "unknown phase 'sideways'"),
        ("slot:elbow", "unknown slot 'elbow'"),
        ("step:9:2", "empty step"),
        ("type:", "needs a value"),
        ("!", "'!' must be followed by a term"),
        ("max>", "'max>' is incomplete: put a number after '>'"),
        ("std<=", "'std<=' is incomplete"),
        ("(std<1", "no parentheses"),
        ("type:Linear )", "no parentheses"),
        (">1e4", "'>1e4' is not a comparison"),
        ("max >1", "'>1' is not a comparison"),
        ("  ", "the query is empty"),
    ],
)
def test_bad_queries_say_what_is_wrong(text, error):
    with pytest.raises(QueryError, match=error):
        parse(text)


def test_query_terms_on_a_real_recording(nan_h5):
    with open_recording(nan_h5) as rec:
        born = search(rec, parse("nan phase:fwd slot:output step:3")).rows
        names = {rec.modules.name(int(m)) for m in born["module"]}
        assert "model.standardize" in names and set(born["step"]) == {3}
        assert np.all(born["nan"] > 0)
        linear_bwd = search(rec, parse("type:Linear phase:bwd step:0:2")).rows  # module calls
        assert set(linear_bwd["phase"]) == {Phase.BWD} and set(linear_bwd["step"]) == {0, 1}
        assert {rec.modules.name(int(m)) for m in linear_bwd["module"]} == {
            "model.proj",
            "model.head",
        }
        big = search(rec, parse("absmax>2 !nan slot:in|out step:0")).rows
        assert len(big) and np.all(np.maximum(np.abs(big["min"]), np.abs(big["max"])) > 2)
        assert set(big["slot"]) <= {Slot.INPUT, Slot.OUTPUT} and np.all(big["nan"] == 0)
        grads = search(rec, parse("proj slot:grad step:1")).rows
        assert set(grads["slot"]) == {Slot.GRAD_OUTPUT, Slot.PARAM_GRAD}


def test_names_with_comparison_characters_are_searched_with_name(nan_h5):
    query = parse("name:*(x)* !name:a<b")
    with open_recording(nan_h5) as rec:
        assert search(rec, query).total == 0


def test_query_reads_only_the_steps_it_allows():
    query = parse("step:3:7 step:5 type:Conv2d")
    assert query.steps == (5, 5) and not query.on_tensors
    assert parse("nan").on_tensors and parse("std<1").columns == {"std"}
