"""The tensor summary's one declaration (hookdbg/store/summary.py) and what follows it:
the C extensions' field positions, the schema version, the tensors table, and every list
of statistics."""

from __future__ import annotations

import pytest
import torch

from hookdbg import cells
from hookdbg.analysis import query, scalars
from hookdbg.recorder.summaries import stats
from hookdbg.store import schema, summary


def test_the_c_extensions_find_every_field_by_its_name():
    """The C pass and the per-call path look the fields' positions up in the declaration
    when they are imported: each C summary holds every declared field where the
    declaration puts it, the same as the torch path's."""
    _cstats = pytest.importorskip("hookdbg.recorder._cstats")
    pytest.importorskip("hookdbg.recorder._hot")
    t = torch.tensor([0.0, 1.0, 6.0, 6.0, float("nan")])
    c = _cstats.summary(t.data_ptr(), 5, 0, (5,), "float32")
    assert len(c) == summary.LENGTH
    python = stats._torch_summary(t)
    for name in summary.NAMES:
        a, b = c[summary.at(name)], python[summary.at(name)]
        assert a == b or (a != a and b != b) or abs(a - b) < 1e-12, name


def test_the_schema_version_is_the_latest_field_or_table_change():
    latest = max(schema.SCHEMA_FLOOR, *(f.since for f in summary.FIELDS))
    assert latest == schema.SCHEMA_VERSION
    assert schema.SCHEMA_VERSION >= 7


def test_the_tensors_table_holds_the_summary_after_where_the_tensor_is():
    names = schema.TENSORS.names
    assert names[len(schema.WHERE_COLUMNS) :] == summary.NAMES
    for f in summary.FIELDS:
        assert schema.TENSORS[f.name] == f.dtype


def test_every_list_of_statistics_comes_from_the_declaration():
    shown = {f.name for f in summary.FIELDS if f.shown}
    assert set(cells.STATS) | set(cells.FRACTIONS) == shown
    assert set(query.STATS) == {f.name for f in summary.FIELDS if f.search} | {"absmax"}
    assert set(scalars.STATS) == {f.name for f in summary.FIELDS if f.scalar}


def test_every_host_summary_has_the_declared_fields():
    """The C pass, the torch fallback and the summaries without values (shapes only,
    a norm only, an integer tensor) all build tuples of the declared length."""
    t = torch.randn(10)
    made = [
        stats.summarise(t),
        stats._torch_summary(t),
        stats.shape_only(t),
        stats.norm_summary(t, 1.0),
        stats.check_finite(t),
        stats.summarise(torch.arange(5)),
    ]
    for s in made:
        assert len(s) == summary.LENGTH, s
        assert s[summary.NUMEL] in (10, 5)
    assert made[3][summary.NORM] == 1.0 and made[3][summary.COUNTS] == (0, 0, 0)
    assert made[2][summary.COUNTS] == (summary.NOT_LOOKED,) * 3
