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
