"""Exact integer evaluation of index expressions on rank grids.

Index expressions (``l+k-3``, ``c*chunk+q``, ``h//HG``, ``l%chunk``) are
evaluated as (numerator array, denominator) pairs so floor division and
remainders are exact; the reference interpreter and the cost model's
footprint counter both rely on it.
"""

from __future__ import annotations

from math import gcd

import numpy as np
import sympy

from mambalaya.errors import MambalayaError


def eval_index(expr: sympy.Expr, grids: dict[str, np.ndarray], values: dict) -> tuple[np.ndarray, int]:
    """An index expression as (integer numerator array, denominator), exactly."""
    if expr.is_Integer:
        return np.asarray(int(expr), dtype=np.int64), 1
    if expr.is_Rational:
        return np.asarray(int(expr.p), dtype=np.int64), int(expr.q)
    if expr.is_Symbol:
        name = str(expr)
        if name in grids:
            return grids[name], 1
        value = values[name]
        if float(value) != int(value):
            raise MambalayaError(f"param {name} = {value} used in an index is not a whole number")
        return np.asarray(int(value), dtype=np.int64), 1
    if expr.is_Add:
        num, den = np.asarray(0, dtype=np.int64), 1
        for arg in expr.args:
            n2, d2 = eval_index(arg, grids, values)
            common = den * d2 // gcd(den, d2)
            num, den = num * (common // den) + n2 * (common // d2), common
        return num, den
    if expr.is_Mul:
        num, den = np.asarray(1, dtype=np.int64), 1
        for arg in expr.args:
            n2, d2 = eval_index(arg, grids, values)
            num, den = num * n2, den * d2
        return num, den
    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) >= 0:
        n, d = eval_index(expr.base, grids, values)
        return n ** int(expr.exp), d ** int(expr.exp)
    if expr.is_Pow and expr.exp == -1:
        n, d = eval_index(expr.base, grids, values)
        if n.ndim:
            raise MambalayaError(f"division by a rank variable in index {expr}")
        return np.asarray(d, dtype=np.int64), int(n)
    if isinstance(expr, sympy.floor):
        n, d = eval_index(expr.args[0], grids, values)
        return n // d, 1
    if isinstance(expr, sympy.ceiling):
        n, d = eval_index(expr.args[0], grids, values)
        return -((-n) // d), 1
    if isinstance(expr, sympy.Mod):
        n, d = eval_index(expr.args[0], grids, values)
        m, md = eval_index(expr.args[1], grids, values)
        if d != 1 or md != 1:
            raise MambalayaError(f"remainder of a fraction in index {expr}")
        return n % m, 1
    raise MambalayaError(f"cannot evaluate index expression {expr}")


def index_span(expr: sympy.Expr, sizes: dict[str, int]) -> tuple[sympy.Rational, sympy.Rational] | None:
    """[min, max] of an index over its ranks (each in [0, size)), by interval arithmetic on sums,
    rational multiples, floors and floor remainders by positive constants (a superset when a rank
    appears in two terms, so a bound it proves holds); None for anything else."""
    lo = hi = sympy.Integer(0)
    for term in sympy.Add.make_args(expr):
        coeff, rest = term.as_coeff_Mul()
        if not coeff.is_Rational:
            return None
        if rest == 1:
            tlo = thi = sympy.Integer(1)
        elif rest.is_Symbol and str(rest) in sizes:
            tlo, thi = sympy.Integer(0), sympy.Integer(sizes[str(rest)] - 1)
        elif isinstance(rest, sympy.floor):
            inner = index_span(rest.args[0], sizes)
            if inner is None:
                return None
            tlo, thi = sympy.floor(inner[0]), sympy.floor(inner[1])
        elif isinstance(rest, sympy.Mod) and rest.args[1].is_Integer and rest.args[1] > 0:
            m = rest.args[1]  # a rank split's remainder (l % chunk)
            inner = index_span(rest.args[0], sizes)
            if inner is not None and inner[0] >= 0 and inner[1] < m and all(x.is_Integer for x in inner):
                tlo, thi = inner  # within one period: the remainder is the value itself
            else:
                tlo, thi = sympy.Integer(0), m - 1
        else:
            return None
        a, b = coeff * tlo, coeff * thi
        lo, hi = lo + min(a, b), hi + max(a, b)
    return lo, hi


def index_within(expr: sympy.Expr, sizes: dict[str, int], extent: int, lo_add: int = 0, hi_add: int = 0) -> bool:
    """True when ``expr + lo_add .. expr + hi_add`` is a whole number inside ``[0, extent)`` for every
    value of its ranks (see :func:`index_span`).

    The generated kernels rely on it to drop bounds masks (Triton) and to read an operand as a direct
    array view (Numba): a read it cannot prove keeps its mask or its gather."""
    if not all(t.as_coeff_Mul()[0].is_Integer for t in sympy.Add.make_args(expr)):
        return False  # a fractional multiple of a rank (floors and remainders are whole by themselves)
    span = index_span(expr, sizes)
    return span is not None and span[0] + lo_add >= 0 and span[1] + hi_add < extent

