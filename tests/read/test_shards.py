"""Global statistics merged from the summaries of a tensor's shards."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from hookdbg.read.shards import merge
from hookdbg.recorder.summaries.stats import summarise
from hookdbg.store import summary
from hookdbg.store.schema import SUMMARY_COLUMNS, TENSORS


def rows(*pieces: torch.Tensor) -> list[np.void]:
    """Tensors-table rows summarising each piece, as the recorder writes them."""
    table = np.zeros(len(pieces), dtype=TENSORS)
    for row, piece in zip(table, pieces, strict=True):
        for name, value in zip(SUMMARY_COLUMNS, summarise(piece), strict=False):
            row[name] = str(value).encode() if name in ("shape", "dtype", "device") else value
    return list(table)


def expect(whole: torch.Tensor) -> dict[str, float]:
    w = whole.double()
    finite = w[torch.isfinite(w)]
    return {
        "numel": whole.numel(),
        "min": float(finite.min()),
        "max": float(finite.max()),
        "mean": float(finite.mean()),
        "std": float(finite.std(correction=0)),
        "norm": float(finite.norm()),
        "nan": int(torch.isnan(w).sum()),
        "zero_frac": float((w == 0).double().mean()),
        "absmean": float(finite.abs().mean()),  # declared a mean over finite values
    }


def check(merged: dict[str, float | int], whole: torch.Tensor) -> None:
    for key, want in expect(whole).items():
        assert merged[key] == pytest.approx(want, rel=1e-6, abs=1e-6), key


def test_shards_merge_into_the_whole_tensors_statistics():
    g = torch.Generator().manual_seed(0)
    whole = torch.randn(10, 16, generator=g) * 3 + 1
    whole[2, :5] = 0
    check(merge(rows(*whole.split([3, 7]))), whole)


def test_values_at_the_ends_merge_where_each_shard_tells_which():
    """sat_frac: shards that each reach both ends of the whole (a ReLU6's output: 0
    and 6) add their values at them; a shard with one end only cannot say how many of
    its values sit there, so the merged fraction is not measured."""
    g = torch.Generator().manual_seed(1)
    whole = torch.nn.functional.relu6(4 * torch.randn(8, 64, generator=g))
    ends = (whole == 0) | (whole == 6)
    merged = merge(rows(*whole.split([3, 5])))
    assert merged["sat_frac"] == pytest.approx(float(ends.double().mean()), rel=1e-6)
    ramp = torch.arange(12.0).reshape(2, 6)  # the min in one shard, the max in the other
    assert math.isnan(merge(rows(*ramp.split(1)))["sat_frac"])


def test_an_empty_shard_adds_nothing():
    """FSDP2 gives the last ranks no rows of a tensor with fewer rows than ranks."""
    whole = torch.linspace(-1, 2, 16).reshape(1, 16)
    merged = merge(rows(whole, whole[:0]))
    check(merged, whole)
    assert not math.isnan(float(merged["std"]))


def test_non_finite_values_are_counted_and_left_out_of_the_statistics():
    whole = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    whole[3, 1] = float("nan")
    check(merge(rows(whole[:1], whole[1:])), whole)


def test_a_field_merges_as_its_declaration_says_or_reads_as_not_measured(monkeypatch):
    """zero_frac is declared an element-weighted mean; a field that declares no merge
    (and that read/shards.py does not merge by name) reads as not measured in a global
    row, never as one shard's."""
    whole = torch.tensor([[0.0, 1.0, 0.0, 2.0], [3.0, 0.0, 4.0, 5.0]])
    pieces = rows(*whole.split([1, 1]))
    assert merge(pieces)["zero_frac"] == pytest.approx(3 / 8)
    undeclared = tuple(
        dataclasses.replace(f, merge="") if f.name == "zero_frac" else f for f in summary.FIELDS
    )
    monkeypatch.setattr(summary, "FIELDS", undeclared)
    assert math.isnan(merge(pieces)["zero_frac"])
