"""Index expressions: exact evaluation, and the static range proofs the kernel generators rely on."""

from __future__ import annotations

import itertools

import numpy as np
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from mambalaya.ir.indexing import eval_index, index_span, index_within

L, Q, C = sympy.symbols("l q c")
SIZES = {"l": 37, "q": 16, "c": 3}


def _values(expr: sympy.Expr) -> np.ndarray:
    """Every value of ``expr`` over its ranks, exactly (as fractions num / den)."""
    grids = dict(zip(SIZES, np.meshgrid(*(np.arange(n) for n in SIZES.values()), indexing="ij"), strict=True))
    num, den = eval_index(expr, grids, {})
    return np.broadcast_to(num, grids["l"].shape) / den


def test_rank_split_reads_are_proven_in_range() -> None:
    """The shapes Mamba-2's chunked reads take: ``c*chunk + q``, ``l // chunk``, ``l % chunk``."""
    assert index_within(C * 16 + Q, SIZES, 48)
    assert not index_within(C * 16 + Q, SIZES, 47)
    assert index_within(sympy.floor(L / 16), SIZES, 3)
    assert index_within(sympy.Mod(L, 16), SIZES, 16)
    assert index_within(Q, SIZES, 16) and index_within(Q, SIZES, 32, 0, 15) and not index_within(Q, SIZES, 30, 0, 15)


def test_what_it_cannot_prove_is_refused() -> None:
    assert not index_within(L / 2, SIZES, 100)  # fractional: the generators keep a gather / refuse it
    assert not index_within(L - 3, SIZES, 37)  # a convolution's left halo reaches -3
    assert index_span(L * Q, SIZES) is None  # not a sum of rank terms


TERMS = st.sampled_from([L, Q, C, sympy.floor(L / 4), sympy.floor((L + Q) / 8), sympy.Mod(L, 5), sympy.Mod(Q + 3, 4)])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3), TERMS), min_size=1, max_size=3), st.integers(-4, 4))
def test_span_contains_every_value(terms: list, const: int) -> None:
    """Interval arithmetic is sound: every value lies in the span (a superset when a rank repeats), and
    a range it proves holds for every point of the grid."""
    expr = sympy.Integer(const) + sum((k * t for k, t in terms), sympy.Integer(0))
    vals = _values(expr)
    span = index_span(expr, SIZES)
    assert span is not None
    assert float(span[0]) <= vals.min() and vals.max() <= float(span[1])
    for extent in (1, 8, 40, 200):
        if index_within(expr, SIZES, extent):
            assert vals.min() >= 0 and vals.max() < extent and np.all(vals == np.round(vals))


def test_exact_when_each_rank_appears_once() -> None:
    for k1, k2 in itertools.product((-2, 1, 3), (1, 4)):
        expr = k1 * L + k2 * sympy.floor(Q / 4) + 5
        vals = _values(expr)
        lo, hi = index_span(expr, SIZES)
        assert (float(lo), float(hi)) == (vals.min(), vals.max())
