"""Restricted grammar for size and index expressions, built into sympy.

Grammar (precedence low to high)::

    expr   := term (('+' | '-') term)*
    term   := unary (('*' | '/' | '//' | '%') unary)*
    unary  := '-' unary | power
    power  := atom (('**' | '^') unary)?
    atom   := NUMBER | NAME | FUNC '(' expr (',' expr)* ')' | '(' expr ')'
    FUNC   := ceil | floor | min | max

Names resolve through a caller-given table, so a size expression may name
only params and derived sizes, and an index expression also rank variables.
Nothing here calls ``sympify`` or ``eval``.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy

from mambalaya.errors import CascadeError
from mambalaya.parse.lexer import TokenStream

_FUNCS: dict[str, tuple[int, Callable[..., sympy.Expr]]] = {
    "ceil": (1, sympy.ceiling),
    "floor": (1, sympy.floor),
    "min": (2, sympy.Min),
    "max": (2, sympy.Max),
}

#: Resolves a name to its symbol, or raises CascadeError.
Resolver = Callable[[str], sympy.Expr]


def parse_size(text: str | int | float, resolve: Resolver) -> sympy.Expr:
    """Parse a whole size expression (a YAML value) into sympy."""
    if isinstance(text, bool):
        raise CascadeError(f"size expression must be a number or text, got {text!r}")
    if isinstance(text, int):
        return sympy.Integer(text)
    if isinstance(text, float):
        if not text.is_integer():
            raise CascadeError(f"size {text} is not a whole number")
        return sympy.Integer(int(text))
    stream = TokenStream(str(text))
    expr = parse_index_expr(stream, resolve)
    if stream.peek.kind != "end":
        stream.fail("unexpected text after the expression")
    return expr


def parse_index_expr(stream: TokenStream, resolve: Resolver) -> sympy.Expr:
    """Parse one expression from a token stream (used inside ``T[...]`` too)."""
    return _expr(stream, resolve)


def _expr(s: TokenStream, resolve: Resolver) -> sympy.Expr:
    value = _term(s, resolve)
    while s.peek.text in ("+", "-"):
        op = s.next().text
        rhs = _term(s, resolve)
        value = value + rhs if op == "+" else value - rhs
    return value


def _term(s: TokenStream, resolve: Resolver) -> sympy.Expr:
    value = _unary(s, resolve)
    while s.peek.text in ("*", "/", "//", "%"):
        op = s.next().text
        rhs = _unary(s, resolve)
        if op == "*":
            value = value * rhs
        elif op == "/":
            value = value / rhs
        elif op == "//":
            value = sympy.floor(value / rhs)
        else:
            value = sympy.Mod(value, rhs)
    return value


def _unary(s: TokenStream, resolve: Resolver) -> sympy.Expr:
    if s.accept("-"):
        return -_unary(s, resolve)
    return _power(s, resolve)


def _power(s: TokenStream, resolve: Resolver) -> sympy.Expr:
    base = _atom(s, resolve)
    if s.peek.text in ("**", "^"):
        s.next()
        exponent = _unary(s, resolve)
        return base**exponent
    return base


def _atom(s: TokenStream, resolve: Resolver) -> sympy.Expr:
    tok = s.peek
    if tok.kind == "num":
        s.next()
        if any(c in tok.text for c in ".eE"):
            value = float(tok.text)
            return sympy.Integer(int(value)) if value.is_integer() else sympy.Float(value)
        return sympy.Integer(int(tok.text))
    if tok.kind == "name":
        s.next()
        if tok.text in _FUNCS and s.peek.text == "(":
            arity, fn = _FUNCS[tok.text]
            s.next()
            args = [_expr(s, resolve)]
            while s.accept(","):
                args.append(_expr(s, resolve))
            s.expect(")", f" to close {tok.text}(")
            if len(args) != arity:
                s.fail(f"{tok.text}() takes {arity} argument(s), got {len(args)}", tok)
            return fn(*args)
        try:
            return resolve(tok.text)
        except CascadeError as err:
            raise CascadeError(f"{err.message} (column {tok.col + 1} in '{s.text}')") from None
    if tok.text == "(":
        s.next()
        value = _expr(s, resolve)
        s.expect(")", " to close '('")
        return value
    s.fail("expected a number, a name or '('")
    raise AssertionError("unreachable")
