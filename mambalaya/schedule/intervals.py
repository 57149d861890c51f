"""Interval arithmetic over index expressions: which indices of a tensor axis a read touches.

A schedule loads, buffers and stores *boxes*: per tensor axis, the interval of indices an
access reaches while its Einsum's ranks sweep their ranges for the current tile. An index
expression (params bound: ``l+k-3``, ``c*256+q``, ``l//256``, ``l%256``, ``2048+16*g+n``) is
compiled once into an :class:`IndexForm` tree; its interval over rank intervals is then
evaluated exactly in integers, numerically (the cost model, the trace interpreter) or as code
(the kernel generators print the same arithmetic). Ranks are given as inclusive ``[lo, hi]``
pairs; the result is the inclusive ``[lo, hi]`` of the index.

The forms are sums of terms ``coefficient * (1 | rank | floor(form) | form mod m)`` over a common
denominator (``l//256`` is ``floor(l/256)``); anything else is refused with
:class:`~mambalaya.errors.MambalayaError` (a schedule cannot box it).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import sympy

from mambalaya.errors import MambalayaError

Interval = tuple[int, int]  # inclusive [lo, hi]


@dataclass(frozen=True)
class Term:
    """``coef * x`` with ``x`` a rank (``rank``), a floor or a remainder (``sub``) or 1 (neither)."""

    coef: int
    rank: str | None = None
    sub: IndexForm | None = None  # floor(sub) or sub mod modulus
    modulus: int | None = None  # None: floor(sub)


@dataclass(frozen=True)
class IndexForm:
    """``(const + sum of terms) / den``, exactly; ``den == 1`` at the top of an integer index."""

    const: int
    terms: tuple[Term, ...]
    den: int = 1

    def __hash__(self) -> int:  # (kept: a schedule's boxes are dictionary keys looked up millions of times)
        got = self.__dict__.get("_hash")
        if got is None:
            got = hash((self.const, self.terms, self.den))
            object.__setattr__(self, "_hash", got)
        return got

    def __getstate__(self) -> dict:  # (a string's hash differs between processes: never pickle one)
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @functools.cached_property
    def ranks(self) -> frozenset[str]:
        out: set[str] = set()
        for t in self.terms:
            if t.rank is not None:
                out.add(t.rank)
            if t.sub is not None:
                out |= t.sub.ranks
        return frozenset(out)

    def is_plain(self, rank: str) -> bool:
        """The form is the rank itself."""
        return self.const == 0 and self.den == 1 and len(self.terms) == 1 and self.terms[0] == Term(1, rank)

    def offset_of(self, rank: str) -> int | None:
        """``k`` when the form is ``rank + k`` (a plain offset read), else None."""
        if self.den != 1 or len(self.terms) != 1 or self.terms[0] != Term(1, rank):
            return None
        return self.const

    def interval(self, ranges: Mapping[str, Interval]) -> Interval:
        """The inclusive [lo, hi] of the form over inclusive rank intervals (an integer form)."""
        lo, hi = self._num(ranges)
        if self.den != 1:
            raise MambalayaError(f"fractional index {self}")
        return lo, hi

    def _num(self, ranges: Mapping[str, Interval]) -> Interval:
        """Numerator bounds: the form times its denominator."""
        lo = hi = self.const
        for t in self.terms:
            if t.rank is not None:
                a, b = ranges[t.rank]
            else:
                assert t.sub is not None
                a, b = _sub_interval(t, ranges)
            if t.coef >= 0:
                lo += t.coef * a
                hi += t.coef * b
            else:
                lo += t.coef * b
                hi += t.coef * a
        return lo, hi

    def value(self, point: Mapping[str, int]) -> int:
        """The form at one point of its ranks (exact floor division and remainder)."""
        lo, _ = self._num({r: (point[r], point[r]) for r in self.ranks})
        if lo % self.den:
            raise MambalayaError(f"fractional index {self}")
        return lo // self.den

    def code(self, lo: Mapping[str, str], hi: Mapping[str, str], dialect: CodeDialect) -> tuple[str, str]:
        """Code for the inclusive [lo, hi] of an integer form, from code for each rank's bounds."""
        a, b = self._code(lo, hi, dialect)
        if self.den != 1:
            raise MambalayaError(f"fractional index {self}")
        return a, b

    def _code(self, lo: Mapping[str, str], hi: Mapping[str, str], dialect: CodeDialect) -> tuple[str, str]:
        los, his = [str(self.const)] if self.const else [], [str(self.const)] if self.const else []
        for t in self.terms:
            if t.rank is not None:
                a, b = lo[t.rank], hi[t.rank]
            else:
                a, b = _sub_code(t, lo, hi, dialect)
            if t.coef < 0:
                a, b = b, a
            los.append(a if t.coef == 1 else f"{t.coef} * {a}")
            his.append(b if t.coef == 1 else f"{t.coef} * {b}")
        return "(" + (" + ".join(los) or "0") + ")", "(" + (" + ".join(his) or "0") + ")"

    def __str__(self) -> str:
        parts = [str(self.const)] if self.const else []
        for t in self.terms:
            if t.rank is not None:
                x = t.rank
            elif t.modulus is None:
                x = f"floor({t.sub})"
            else:
                x = f"({t.sub} mod {t.modulus})"
            parts.append(x if t.coef == 1 else f"{t.coef}*{x}")
        body = " + ".join(parts) or "0"
        return body if self.den == 1 else f"({body})/{self.den}"


@dataclass(frozen=True)
class CodeDialect:
    """How generated code spells floor division (``{n}``, ``{d}``) and a conditional."""

    floordiv: str = "({n} // {d})"
    ternary: str = "({a} if {cond} else {b})"


PYTHON = CodeDialect()


def _sub_interval(t: Term, ranges: Mapping[str, Interval]) -> Interval:
    sub = t.sub
    assert sub is not None
    a, b = sub._num(ranges)
    d = sub.den
    if t.modulus is None:
        return a // d, b // d
    m = t.modulus
    if d != 1:
        raise MambalayaError(f"remainder of a fraction in index {sub}")
    if a // m == b // m:  # within one period: the remainder is the value itself
        return a % m, b % m
    return 0, m - 1


def _sub_code(t: Term, lo: Mapping[str, str], hi: Mapping[str, str], dialect: CodeDialect) -> tuple[str, str]:
    sub = t.sub
    assert sub is not None
    a, b = sub._code(lo, hi, dialect)
    d = sub.den
    if t.modulus is None:
        if d == 1:
            return a, b
        return dialect.floordiv.format(n=a, d=d), dialect.floordiv.format(n=b, d=d)
    m = t.modulus
    qa, qb = dialect.floordiv.format(n=a, d=m), dialect.floordiv.format(n=b, d=m)
    same = f"{qa} == {qb}"
    ra, rb = f"({a} - {m} * {qa})", f"({b} - {m} * {qb})"
    return dialect.ternary.format(a=ra, cond=same, b="0"), dialect.ternary.format(a=rb, cond=same, b=str(m - 1))


# ---- compiling sympy index expressions --------------------------------------------------


def compile_index(expr: sympy.Expr, values: Mapping[str, int | float], ranks: frozenset[str] | set[str],
                  sizes: Mapping[str, int] | None = None) -> IndexForm:
    """The :class:`IndexForm` of an index expression; params take their bound values. With the ranks' ``sizes``,
    a floor or remainder is simplified over the ranks' ranges (:func:`_floor_of`, :func:`_mod_of`): an index
    composed through an inlined producer, ``(g*CG + m) // CG`` with ``m < CG``, is the plain rank ``g``."""
    form = _compile(sympy.expand(expr) if not expr.has(sympy.floor, sympy.Mod) else expr, values, ranks, sizes)
    return form


def _compile(expr: sympy.Expr, values: Mapping[str, int | float], ranks, sizes=None) -> IndexForm:
    if expr.is_Integer:
        return IndexForm(int(expr), ())
    if expr.is_Rational:
        return IndexForm(int(expr.p), (), int(expr.q))
    if expr.is_Symbol:
        name = str(expr)
        if name in ranks:
            return IndexForm(0, (Term(1, name),))
        value = values.get(name)
        if value is None or float(value) != int(value):
            raise MambalayaError(f"param {name} = {value} used in an index is not a whole number")
        return IndexForm(int(value), ())
    if isinstance(expr, sympy.floor):
        inner = _compile(expr.args[0], values, ranks, sizes)
        return IndexForm(0, (Term(1, sub=inner),)) if sizes is None else _floor_of(inner, sizes)
    if isinstance(expr, sympy.Mod):
        m = _compile(expr.args[1], values, ranks, sizes)
        if m.terms or m.den != 1 or m.const <= 0:
            raise MambalayaError(f"remainder by a non-constant in index {expr}")
        inner = _compile(expr.args[0], values, ranks, sizes)
        return IndexForm(0, (Term(1, sub=inner, modulus=m.const),)) if sizes is None else _mod_of(inner, m.const, sizes)
    if expr.is_Add:
        parts = [_compile(a, values, ranks, sizes) for a in expr.args]
        den = 1
        for p in parts:
            den = den * p.den // math.gcd(den, p.den)
        const, terms = 0, []
        for p in parts:
            f = den // p.den
            const += p.const * f
            terms += [Term(t.coef * f, t.rank, t.sub, t.modulus) for t in p.terms]
        return _merge(IndexForm(const, tuple(terms), den))
    if expr.is_Mul:
        parts = [_compile(a, values, ranks, sizes) for a in expr.args]
        varying = [p for p in parts if p.terms]
        if len(varying) > 1:
            raise MambalayaError(f"product of ranks in index {expr}: a schedule cannot box it")
        num, den = 1, 1
        for p in parts:
            if not p.terms:
                num *= p.const
                den *= p.den
        if not varying:
            g = math.gcd(num, den)
            return IndexForm(num // g, (), den // g)
        v = varying[0]
        return _merge(IndexForm(v.const * num, tuple(Term(t.coef * num, t.rank, t.sub, t.modulus) for t in v.terms),
                                v.den * den))
    if expr.is_Pow and expr.exp.is_Integer:
        base = _compile(expr.base, values, ranks, sizes)
        e = int(expr.exp)
        if not base.terms and (e >= 0 or base.const):
            num, den = (base.const, base.den) if e >= 0 else (base.den, base.const)
            num, den = num ** abs(e), den ** abs(e)
            if den < 0:
                num, den = -num, -den
            g = math.gcd(num, den)
            return IndexForm(num // g, (), den // g)
    raise MambalayaError(f"index expression {expr} cannot be boxed by a schedule")


def _split_multiples(form: IndexForm, d: int) -> tuple[IndexForm, IndexForm]:
    """``form`` (numerator over ``form.den``) as ``q + r/d``: ``q`` the terms and constant that are whole multiples of
    ``d * form.den`` divided out (an integer form), ``r`` the rest (a numerator over ``d * form.den``)."""
    step = d * form.den
    whole, rest = [], []
    for t in form.terms:
        (whole if t.coef % step == 0 else rest).append(t)
    q_const, r_const = divmod(form.const, step)
    return (IndexForm(q_const, tuple(Term(t.coef // step, t.rank, t.sub, t.modulus) for t in whole)),
            IndexForm(r_const, tuple(rest), step))


def _floor_of(inner: IndexForm, sizes: Mapping[str, int]) -> IndexForm:
    """``floor(inner)``, simplified: whole multiples of the denominator leave the floor (``floor(g + x) = g +
    floor(x)``), and a floor whose argument stays within one unit over the ranks' ranges is that constant."""
    q, r = _split_multiples(inner, 1)
    lo, hi = r._num({x: (0, sizes[x] - 1) for x in r.ranks})
    if lo // r.den == hi // r.den:
        return _merge(IndexForm(q.const + lo // r.den, q.terms))
    if not q.terms and not q.const:
        return IndexForm(0, (Term(1, sub=inner),))
    return _merge(IndexForm(q.const, (*q.terms, Term(1, sub=_merge(r)))))


def _mod_of(inner: IndexForm, m: int, sizes: Mapping[str, int]) -> IndexForm:
    """``inner mod m``, simplified: whole multiples of ``m`` drop out, and an argument that stays within one
    period over the ranks' ranges is itself, shifted (``(16*h + p) mod 16`` with ``p < 16`` is ``p``)."""
    if inner.den != 1:
        return IndexForm(0, (Term(1, sub=inner, modulus=m),))
    _, r = _split_multiples(inner, m)
    r = IndexForm(r.const, r.terms)  # (the numerator: the remainder of an integer form)
    lo, hi = r._num({x: (0, sizes[x] - 1) for x in r.ranks})
    if lo // m == hi // m:
        return _merge(IndexForm(r.const - m * (lo // m), r.terms))
    return IndexForm(0, (Term(1, sub=_merge(r), modulus=m),))


def _merge(form: IndexForm) -> IndexForm:
    """Like terms added; zero terms dropped; the fraction reduced."""
    coefs: dict[tuple, int] = {}
    for t in form.terms:
        key = (t.rank, t.sub, t.modulus)
        coefs[key] = coefs.get(key, 0) + t.coef
    terms = tuple(Term(c, *key) for key, c in coefs.items() if c)
    g = form.den
    for t in terms:
        g = math.gcd(g, t.coef)
    g = math.gcd(g, form.const) if form.const else g
    if g > 1:
        return IndexForm(form.const // g, tuple(Term(t.coef // g, t.rank, t.sub, t.modulus) for t in terms),
                         form.den // g)
    return IndexForm(form.const, terms, form.den)


def hull(intervals: list[Interval]) -> Interval:
    """The smallest interval holding all of them."""
    return min(a for a, _ in intervals), max(b for _, b in intervals)


def clip(iv: Interval, size: int) -> Interval:
    """An inclusive interval clipped to ``[0, size)``; empty when ``lo > hi``."""
    return max(iv[0], 0), min(iv[1], size - 1)


def length(iv: Interval) -> int:
    return max(0, iv[1] - iv[0] + 1)


def affine_parts(form: IndexForm) -> dict[str, int] | None:
    """Rank -> coefficient when the form is affine in plain ranks (no floor or remainder), else None."""
    if form.den != 1 or any(t.rank is None for t in form.terms):
        return None
    return {t.rank: t.coef for t in form.terms if t.rank is not None}


__all__ = ["PYTHON", "CodeDialect", "IndexForm", "Interval", "Term", "affine_parts", "clip", "compile_index", "hull",
           "length"]
