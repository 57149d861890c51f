"""The footprint shortcuts (one interval of an affine index, a chunk merge) equal enumerating the points."""

from __future__ import annotations

import numpy as np
import pytest
from analysis.cascades import random_cascades
from hypothesis import HealthCheck, given, settings

from mambalaya.cost import footprint
from mambalaya.ir.expr import accesses
from mambalaya.parse import open_cascade, parse_cascade_text
from mambalaya.parse.cascade_file import cascade_from_dict


def _all_boxes(cascade, monkeypatch, interval_from: int) -> list:
    monkeypatch.setattr(footprint, "_INTERVAL_FROM", interval_from)
    return [footprint.access_boxes(cascade, a) for e in cascade.einsums for a in accesses(e.expr)]


def _same(cascade, monkeypatch) -> None:
    fast, slow = _all_boxes(cascade, monkeypatch, -1), _all_boxes(cascade, monkeypatch, 1 << 62)
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow, strict=True):
        assert [(x.tensor, x.dims) for x in a] == [(x.tensor, x.dims) for x in b]
        for x, y in zip(a, b, strict=True):
            assert len(x.clusters) == len(y.clusters)
            for (p, c), (q, d) in zip(x.clusters, y.clusters, strict=True):
                assert p == q and (c is None) == (d is None) and (c is None or np.array_equal(c, d)), (x, y)


@pytest.mark.parametrize("name,params", [("mamba2", {"seqlen": 100}), ("mamba2", {"seqlen": 4096}),
                                         ("mamba1", {"seqlen": 37}), ("mamba2-decode", {}), ("attention", {}),
                                         ("mamba1-decode", {})])
def test_shortcuts_equal_enumeration(name: str, params: dict, monkeypatch) -> None:
    _same(open_cascade(name, params=params), monkeypatch)


def test_gapped_and_clipped_indices(monkeypatch) -> None:
    c = parse_cascade_text("""
name: g
params: {L: 10, K: 3, C: 4, Q: 5}
ranks: {l: L, k: K, c: C, q: Q, s: Q}
tensors:
  A: {role: input, shape: [L]}
einsums:
  - S[c, q] = A[3*c + q - 2]
  - G[c, q] = A[7*c + q]
  - N[l, k] = A[l - 2*k + 1]
  - B[c, q] = S[c, q] * S[c, 4 - q] + G[c, q]
  - Y[l] = B[l // 5, l % 5] + N[l, 0]
""", file="<g>")
    _same(c, monkeypatch)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_cascades())
def test_shortcuts_equal_enumeration_random(data) -> None:
    cascade = cascade_from_dict(data)
    with pytest.MonkeyPatch.context() as mp:
        _same(cascade, mp)
