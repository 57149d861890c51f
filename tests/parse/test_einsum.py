"""Einsum statements: text to typed nodes."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mambalaya.errors import CascadeError
from mambalaya.ir.expr import Access, BinOp, Call, Const, ParamRef, Reduce, accesses, free_ranks
from mambalaya.parse.einsum import parse_einsum

RANKS = {"b", "l", "d", "k", "n", "c", "q", "s"}
PARAMS = {"K", "Q", "eps"}


def test_gemm_with_bias():
    p = parse_einsum("XC[b,l,d] = W[d,k] * X[b,l+k-K+1,d] + bc[d]", RANKS, PARAMS)
    assert str(p.output) == "XC[b,l,d]"
    assert isinstance(p.expr, BinOp) and p.expr.op == "+"
    assert [a.tensor for a in accesses(p.expr)] == ["W", "X", "bc"]
    assert free_ranks(p.expr) == {"b", "l", "d", "k"}


def test_reduction_function_param_and_mask():
    p = parse_einsum("Y[b,l] = sum_n(A[b,l,n]) * rsqrt(V[b,l] + eps) where l >= 1 and l < Q", RANKS, PARAMS)
    assert isinstance(p.expr.lhs, Reduce) and p.expr.lhs.rank == "n"
    assert isinstance(p.expr.rhs, Call) and p.expr.rhs.fn == "rsqrt"
    assert isinstance(p.expr.rhs.args[0].rhs, ParamRef)
    assert [c.op for c in p.where] == [">=", "<"]


def test_negative_literals_fold_and_negation_is_a_call():
    p = parse_einsum("Y[d] = -2 * -X[d]", RANKS, PARAMS)
    assert p.expr.lhs == Const(-2.0)
    assert isinstance(p.expr.rhs, Call) and p.expr.rhs.fn == "neg"


def test_split_index_expressions():
    p = parse_einsum("Y[b,l] = X[b, l//Q, l%Q] + Z[b, c*Q+q]", RANKS, PARAMS)
    x, z = accesses(p.expr)
    assert isinstance(x, Access) and str(x) == "X[b,floor(l/Q),Mod(l,Q)]"
    assert z.ranks() == {"b", "c", "q"}


@pytest.mark.parametrize("text,words", [
    ("Y[b] = ", "expected a tensor"),
    ("Y[b+1] = X[b]", "plain rank variables"),
    ("Y[b,b] = X[b]", "repeats a rank"),
    ("Y[b] = X[b] X[b]", "unexpected text"),
    ("Y[b] = foo(X[b])", "unknown function 'foo'"),
    ("Y[b] = sum_z(X[b])", "unknown rank 'z'"),
    ("Y[b] = exp(X[b], X[b])", "takes 1 argument"),
    ("Y[b] = X[b] where b", "expected a comparison"),
    ("Y[b] = bogus", "neither a tensor"),
    ("[b] = X[b]", "starts with its output"),
])
def test_malformed_einsums(text, words):
    with pytest.raises(CascadeError, match=re.escape(words)):
        parse_einsum(text, RANKS, PARAMS)


@given(st.text(alphabet="YXbldkn[]=+-*/(),_ sumexp0123456789", max_size=50))
def test_any_text_parses_or_fails_cleanly(text):
    try:
        parse_einsum(text, RANKS, PARAMS)
    except CascadeError:
        pass
