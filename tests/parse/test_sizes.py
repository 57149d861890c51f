"""Size expressions: a restricted grammar into sympy, no eval."""

from __future__ import annotations

import re

import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

from mambalaya.errors import CascadeError
from mambalaya.ir.expr import param_symbol
from mambalaya.ir.sizes import evaluate_size
from mambalaya.parse.sizes import parse_size


def resolve(name: str) -> sympy.Expr:
    if name in {"E", "L", "Q", "expand"}:
        return param_symbol(name)
    raise CascadeError(f"unknown name '{name}'")


@pytest.mark.parametrize("text,values,expected", [
    ("expand*E", {"expand": 2, "E": 768}, 1536),
    ("ceil(E/16)", {"E": 768}, 48),
    ("ceil(E/16)", {"E": 770}, 49),
    ("ceil(L/Q)", {"L": 100, "Q": 32}, 4),
    ("L//Q + 1", {"L": 100, "Q": 32}, 4),
    ("2**3 + E % 5", {"E": 12}, 10),
    ("max(E, L) - min(E, L)", {"E": 3, "L": 10}, 7),
    ("-(-E)", {"E": 5}, 5),
    (12, {}, 12),
])
def test_size_values(text, values, expected):
    assert evaluate_size(parse_size(text, resolve), values, "t") == expected


@pytest.mark.parametrize("text,words", [
    ("E +", "expected a number"),
    ("foo(E)", "unknown name 'foo'"),
    ("E E", "unexpected text"),
    ("__import__('os')", "unexpected character '_'"),
    ("E; 1", "unexpected character ';'"),
    ("ceil(E, L)", "takes 1 argument"),
    ("(E", "expected ')'"),
])
def test_malformed_sizes(text, words):
    with pytest.raises(CascadeError, match=re.escape(words)):
        parse_size(text, resolve)


def test_fractional_and_nonpositive_sizes_are_rejected():
    with pytest.raises(CascadeError, match="not a whole number"):
        evaluate_size(parse_size("E/3", resolve), {"E": 10}, "t")
    with pytest.raises(CascadeError, match="must be positive"):
        evaluate_size(parse_size("E - L", resolve), {"E": 1, "L": 1}, "t")
    with pytest.raises(CascadeError, match="needs param"):
        evaluate_size(parse_size("E*Q", resolve), {"E": 1}, "t")


@given(st.text(max_size=40))
def test_any_text_parses_or_fails_cleanly(text):
    try:
        parse_size(text, resolve)
    except CascadeError:
        pass
