"""Evaluating symbolic sizes under bound params."""

from __future__ import annotations

import sympy

from mambalaya.errors import CascadeError


def evaluate_size(expr: sympy.Expr, values: dict[str, int | float], what: str) -> int:
    """A size expression's value under bound params: a positive whole number, or an error."""
    value = substitute(expr, values, what)
    if not value.is_number or value.is_infinite or value.has(sympy.nan, sympy.zoo):
        raise CascadeError(f"{what}: size {expr} does not evaluate to a number")
    number = float(value)
    if abs(number - round(number)) > 1e-9:
        raise CascadeError(f"{what}: size {expr} = {value} is not a whole number")
    if round(number) <= 0:
        raise CascadeError(f"{what}: size {expr} = {round(number)} must be positive")
    return int(round(number))


def substitute(expr: sympy.Expr, values: dict[str, int | float], what: str) -> sympy.Expr:
    """Replace param symbols by their values; every param must be set."""
    missing = sorted(str(s) for s in expr.free_symbols if not s.is_integer and str(s) not in values)
    if missing:
        raise CascadeError(f"{what}: {expr} needs param(s) {', '.join(missing)}, which are not set")
    subs = {s: _number(values[str(s)]) for s in expr.free_symbols if str(s) in values and not s.is_integer}
    return expr.xreplace(subs) if subs else expr


def _number(value: int | float) -> sympy.Expr:
    if isinstance(value, int):
        return sympy.Integer(value)
    if float(value).is_integer():
        return sympy.Integer(int(value))
    return sympy.Float(value)
