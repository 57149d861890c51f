"""Index expressions and schedule boxes as code: the one printer both kernel generators use.

An index expression (``l+k-3``, ``c*256+q``, ``h//4``, ``l%256``) prints as exact integer code
(a numerator and a denominator, so rational coefficients stay exact, as the reference evaluates
them); a :class:`IndexDialect` says how the target spells floor division and remainder (Python
and Numba floor; Triton truncates, so its kernels call floor helpers). A schedule's ranges and
boxes print through :class:`LoopNames`: every tile loop ``j`` has its tile's bounds ``lo{j}``,
``hi{j}`` and its first-tile flag ``f{j}`` in scope.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import sympy

from mambalaya.errors import MambalayaError
from mambalaya.schedule import AxisBox, Range
from mambalaya.schedule.intervals import CodeDialect


def _python_power(n: str, e: int) -> str:
    return f"({n} ** {e})"


@dataclass(frozen=True)
class IndexDialect:
    """How a target language spells the index operations whose rounding matters."""

    floordiv: str = "({n} // {d})"
    ceildiv: str = "(-((-{n}) // {d}))"
    mod: str = "({n} % {m})"
    power: Callable[[str, int], str] = _python_power
    error: type[Exception] = MambalayaError
    constant_modulus: bool = False  # remainders only by a positive whole constant
    minimum: str = "min({a}, {b})"
    maximum: str = "max({a}, {b})"
    ternary: str = "({a} if {cond} else {b})"
    int_const: str = "{v}"  # an integer variable's initial value (Triton: a typed scalar, so branches agree)

    @property
    def intervals(self) -> CodeDialect:
        return CodeDialect(self.floordiv, self.ternary)


NUMBA_INDEX = IndexDialect()


def index_code(expr: sympy.Expr, rv: dict[str, str], values: dict,
               dialect: IndexDialect = NUMBA_INDEX) -> tuple[str, int]:
    """Integer code for an index expression as (numerator code, denominator): exact, like the reference."""
    def sub(x: sympy.Expr) -> tuple[str, int]:
        return index_code(x, rv, values, dialect)

    if expr.is_Integer:
        return str(int(expr)), 1
    if expr.is_Rational:
        return str(int(expr.p)), int(expr.q)
    if expr.is_Symbol:
        name = str(expr)
        if name in rv:
            return rv[name], 1
        value = values[name]
        if float(value) != int(value):
            raise MambalayaError(f"param {name} = {value} used in an index is not a whole number")
        return str(int(value)), 1
    if expr.is_Add:
        parts = [sub(a) for a in expr.args]
        den = 1
        for _, d in parts:
            den = den * d // math.gcd(den, d)
        return "(" + " + ".join(f"{n} * {den // d}" if den // d != 1 else n for n, d in parts) + ")", den
    if expr.is_Mul:
        parts = [sub(a) for a in expr.args]
        return "(" + " * ".join(n for n, _ in parts) + ")", math.prod(d for _, d in parts)
    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) >= 0:
        n, d = sub(expr.base)
        e = int(expr.exp)
        return dialect.power(n, e), d**e
    if isinstance(expr, sympy.floor):
        n, d = sub(expr.args[0])
        return (dialect.floordiv.format(n=n, d=d) if d != 1 else n), 1
    if isinstance(expr, sympy.ceiling):
        n, d = sub(expr.args[0])
        return (dialect.ceildiv.format(n=n, d=d) if d != 1 else n), 1
    if isinstance(expr, sympy.Mod):
        n, d = sub(expr.args[0])
        m, md = sub(expr.args[1])
        if d != 1 or md != 1 or (dialect.constant_modulus
                                 and not (expr.args[1].is_Integer and int(expr.args[1]) > 0)):
            raise dialect.error(f"remainder of a fraction or by a non-constant in index {expr}")
        return dialect.mod.format(n=n, m=m), 1
    raise dialect.error(f"cannot generate code for index expression {expr}")


def bind(expr: sympy.Expr, rv: dict[str, str], values: dict) -> sympy.Expr:
    """Substitute the (whole-number) params of an index expression, leaving rank symbols."""
    subs = {}
    for sym in expr.free_symbols:
        name = str(sym)
        if name in rv:
            continue
        value = values[name]
        if float(value) != int(value):
            raise MambalayaError(f"param {name} = {value} used in an index is not a whole number")
        subs[sym] = sympy.Integer(int(value))
    return expr.xreplace(subs) if subs else expr


def int_index(expr: sympy.Expr, rv: dict[str, str], values: dict, what: str,
              dialect: IndexDialect = NUMBA_INDEX) -> str:
    n, d = index_code(bind(expr, rv, values), rv, values, dialect)
    if d != 1:
        raise dialect.error(f"index {expr} of {what} is fractional")
    return n


@dataclass(frozen=True)
class LoopNames:
    """How generated code names a tile loop's current tile: ``[lo{j}, hi{j})`` and ``f{j}`` (its first)."""

    dialect: IndexDialect = NUMBA_INDEX

    def lo(self, j: int) -> str:
        return f"lo{j}"

    def hi(self, j: int) -> str:
        return f"hi{j}"

    def first(self, j: int) -> str:
        return f"f{j}"

    def range_code(self, r: Range, loops: set[int] | frozenset[int] | None = None) -> tuple[str, str]:
        """``[lo, hi)`` of a range as code (its whole extent outside the loops given)."""
        d = self.dialect
        if r.loop is None or (loops is not None and r.loop not in loops):
            return "0", str(r.size)
        j = r.loop
        lo, hi = self.lo(j), self.hi(j)
        if r.kind == "tile":
            a = lo if not r.skew else d.ternary.format(a="0", cond=self.first(j), b=f"{lo} + {r.skew}")
            b = d.minimum.format(a=f"{hi} + {r.skew}" if r.skew else hi, b=r.size)
            return a, b
        if r.kind == "parent":
            a = d.maximum.format(a=f"{lo} * {r.scale} + {r.offset}", b=0)
            b = d.minimum.format(a=f"{hi} * {r.scale} + {r.offset}", b=r.size)
            return a, b
        a = d.floordiv.format(n=f"({lo} - {r.offset})", d=r.divisor)
        b = d.floordiv.format(n=f"({hi} - 1 - {r.offset})", d=r.divisor)
        if r.modulus is not None:
            m = r.modulus
            same = f"{d.floordiv.format(n=a, d=m)} == {d.floordiv.format(n=b, d=m)}"
            a = d.ternary.format(a=f"({a} - {m} * {d.floordiv.format(n=a, d=m)})", cond=same, b="0")
            b = d.ternary.format(a=f"({b} - {m} * {d.floordiv.format(n=b, d=m)})", cond=same, b=str(m - 1))
        return d.maximum.format(a=a, b=0), d.minimum.format(a=f"{b} + 1", b=r.size)

    def box_code(self, axis: AxisBox, ranges: dict[str, dict[str, Range]], name: str) -> list[str]:
        """Statements setting ``{name}_lo`` and ``{name}_hi`` to the inclusive bounds of a box axis, clipped to the
        axis (lo > hi: empty): the hull of its reads, a read over an empty range of its member counting for
        nothing (as :class:`~mambalaya.schedule.extent.AxisFn` evaluates it)."""
        d = self.dialect
        lines = [f"{name}_lo = {d.int_const.format(v=axis.size)}", f"{name}_hi = {d.int_const.format(v=-1)}"]
        for form, member in axis.reads:
            rr = ranges[member]
            lo_map, hi_map, nonempty = {}, {}, []
            for r in form.ranks:
                a, b = self.range_code(rr[r], axis.loops)
                lo_map[r], hi_map[r] = a, f"({b} - 1)"
                if a != "0" or b != str(rr[r].size):
                    nonempty.append(f"({a}) < ({b})")
            a, b = form.code(lo_map, hi_map, d.intervals)
            set_lo = f"{name}_lo = {d.minimum.format(a=f'{name}_lo', b=a)}"
            set_hi = f"{name}_hi = {d.maximum.format(a=f'{name}_hi', b=b)}"
            if nonempty:
                lines += [f"if {' and '.join(nonempty)}:", f"    {set_lo}", f"    {set_hi}"]
            else:
                lines += [set_lo, set_hi]
        lines.append(f"{name}_lo = {d.maximum.format(a=f'{name}_lo', b=0)}")
        lines.append(f"{name}_hi = {d.minimum.format(a=f'{name}_hi', b=axis.size - 1)}")
        return lines


__all__ = ["NUMBA_INDEX", "IndexDialect", "LoopNames", "bind", "index_code", "int_index"]
