"""The analyzer's shortcuts change nothing: a group analysed after its subgroups (the enumeration's
order: union-find and convexity started from the subgroup's) equals the group analysed alone, and the
cheap lower bound on the tile-1 buffer never exceeds the exact one."""

from __future__ import annotations

import pytest
import sympy
from analysis.cascades import random_cascades
from hypothesis import HealthCheck, given, settings

from mambalaya.analysis import GroupAnalyzer
from mambalaya.analysis.candidates import candidate_groups
from mambalaya.analysis.matching import _simplify
from mambalaya.parse import open_cascade
from mambalaya.parse.cascade_file import cascade_from_dict

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _full(cg) -> tuple:
    return cg.to_dict(), cg.terms, cg.loops.ranks, cg.notes


def _same_alone(cascade, limit: int | None = None) -> int:
    grown = GroupAnalyzer(cascade)  # analyses every group after the subgroup it grew from
    groups = list(candidate_groups(cascade, max_size=limit))
    for g in groups:
        cg = grown.analyze(g)
        bound = cg._model.least_bound() if cg.legal and cg._model is not None else None
        alone = GroupAnalyzer(cascade, grown.edges).analyze(g)
        assert _full(cg) == _full(alone), g
        if bound is not None:
            assert bound <= cg.buffer_min_bytes, (g, bound, cg.buffer_min_bytes)
    return len(groups)


@pytest.mark.parametrize("name,limit", [("mamba1", 6), ("mamba2", 5), ("mamba2-decode", 6), ("attention", None)])
def test_grown_analysis_equals_analysis_alone(name: str, limit: int | None) -> None:
    assert _same_alone(open_cascade(name), limit) > 20


@SETTINGS
@given(random_cascades())
def test_grown_analysis_equals_analysis_alone_random(data) -> None:
    _same_alone(cascade_from_dict(data), 6)


def test_simplify_shortcut_is_sympy_simplify() -> None:
    d = sympy.Symbol("d_conv", integer=True, positive=True)
    w = sympy.Symbol("w", integer=True, nonnegative=True)
    for e in [d - 1, 1 - d, w + 3, -w + 7, d, sympy.Integer(5), 2 * d + 2, d + w, d * w - 1]:
        assert sympy.srepr(_simplify(e)) == sympy.srepr(sympy.simplify(e)), e
