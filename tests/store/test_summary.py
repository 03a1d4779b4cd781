"""The tensor summary's one declaration (hookdbg/store/summary.py) and what follows it:
the C header generated from it, the tensors table, and every list of statistics."""

from __future__ import annotations

import re

import torch

from hookdbg import cells
from hookdbg.analysis import query, scalars
from hookdbg.recorder.summaries import stats
from hookdbg.store import schema, summary


def test_the_committed_header_is_generated_from_the_declaration():
    """A stale summary.h (a field added, moved or renamed without running
    ``python -m hookdbg.store.summary``) would make the C extensions write a field at
    another's place."""
    assert summary.HEADER.read_text() == summary.header_text()
    defined = dict(re.findall(r"#define SUMMARY_(\w+)\s+(\d+)", summary.HEADER.read_text()))
    assert {k.lower(): int(v) for k, v in defined.items() if k != "FIELDS"} == {
        name: summary.at(name) for name in summary.NAMES
    }
    assert int(defined["FIELDS"]) == summary.LENGTH


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
