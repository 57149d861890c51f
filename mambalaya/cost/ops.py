"""Operation counts per Einsum, by kind: what the compute side of the roofline charges.

Counting rule (one rule, two number types: ints for the mapper's fast path,
sympy expressions over the cascade's params for users):

- Every node of the right-hand side is evaluated once per point of the ranks its
  value varies over (loop-invariant code is hoisted): ``exp(ACS[b,c,chunk-1,h])``
  inside an Einsum over ``b,c,h,p,n`` costs ``B*C*H`` exps, not ``B*C*H*P*N``.
- A ``Call`` costs one op of its :data:`~mambalaya.ir.functions.FUNCTIONS` kind;
  ``+ - * /`` cost one ``add``/``mul``/``div`` (:data:`BINOP_KINDS`), and the additive
  terms of an Einsum are added over its output ranks.
- A product summed over ranks R (Einstein summation of a term, or ``sum_r``/``mean_r``
  of a product) is a *contraction*: its factors are multiplied pairwise, cheapest
  union of ranks first (``mul`` ops), until two operands remain, which are combined by
  one ``mac`` per point of the full space. The MACs run on the matrix unit (tensor
  cores, the 2D PE array) when the contraction is GEMM-shaped: a reduced rank in both
  operands and, on each side, a free rank the other lacks (in_proj, out_proj and the
  SSD's C.B, intra-chunk, chunk-state and state-to-output products; a depthwise conv
  or Mamba-1's ``sum_n C*H`` are not). Shape is structural, sizes do not matter, so a
  batch-1 decode projection (a GEMV) is still a matrix op.
- ``sum``/``mean``/``cumsum`` of a non-product cost one ``add`` per element of their
  argument, ``max``/``min`` one ``max``; ``mean`` adds one ``mul`` per result.
- A ``where`` mask counts only the points of its ranks it keeps, for every node whose
  ranks include all of them: any conjunction of comparisons of affine expressions of
  ranks and params (``s <= q`` keeps ``n(n+1)/2`` pairs, ``n < kvlen`` keeps
  ``min(kvlen, N)``), counted exactly (:func:`kept_points`). In sympy counts only a
  comparison between two plain ranks of the same size has a closed form; there, and past
  :data:`MASK_ENUMERATE_UP_TO` points to walk, a mask is counted in full (an upper bound).
- Each count carries its reduction length (the product of the reduced ranks' sizes)
  so the latency model can charge pipeline fill and drain on a CGLA.

A MAC is one op (2 FLOP in :func:`flops`); every other op is 1 FLOP.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import sympy

from mambalaya.ir.cascade import Cascade, Einsum
from mambalaya.ir.expr import BinOp, Call, Node, Reduce, free_ranks, multiplicative_factors
from mambalaya.ir.functions import BINOP_KINDS, FUNCTIONS, REDUCE_KINDS

#: Key of matrix-unit MACs in an ops-by-kind dict (element-wise MACs are ``mac``).
MATRIX_MAC = "matrix_mac"

Count = int | sympy.Expr


@dataclass(frozen=True)
class OpCount:
    """Ops of one kind from one node: ``count`` ops, on the matrix unit when ``matrix``."""

    kind: str
    count: Count
    matrix: bool = False
    reduce_len: int = 0  # length of the reduction it belongs to (0: none), for pipeline occupancy

    @property
    def key(self) -> str:
        return MATRIX_MAC if self.matrix else self.kind


#: Most points of a mask's ranks (all but the last, whose kept interval is solved) that are walked to count it
MASK_ENUMERATE_UP_TO = 1 << 22


@dataclass(frozen=True)
class _Mask:
    """A ``where`` mask: its ranks and the count of their points it keeps."""

    ranks: frozenset[str]
    pairs: Count


class _Counter:
    """Walks one Einsum's tree; ``size`` gives a rank's size as an int or a sympy expression."""

    def __init__(self, cascade: Cascade, einsum: Einsum, symbolic: bool) -> None:
        self.sizes = cascade.rank_sizes
        self.size: Callable[[str], Count] = cascade.rank_expr if symbolic else cascade.rank_size
        self.mask = _simple_mask(cascade, einsum, self.size)

    def space(self, ranks: frozenset[str]) -> Count:
        """Points of an iteration space over ``ranks`` (masked pairs only, under a simple mask)."""
        total: Count = 1
        masked = self.mask is not None and self.mask.ranks <= ranks
        for r in sorted(ranks):
            if not (masked and r in self.mask.ranks):
                total = total * self.size(r)
        return total * self.mask.pairs if masked else total

    def numeric(self, ranks: frozenset[str]) -> int:
        return math.prod(self.sizes[r] for r in ranks)

    def node(self, node: Node) -> list[OpCount]:
        if isinstance(node, Call):
            out = [c for a in node.args for c in self.node(a)]
            return out + [OpCount(FUNCTIONS[node.fn].op_kind, self.space(free_ranks(node)))]
        if isinstance(node, BinOp):
            if node.op == "*":
                ops, operands = self.product(multiplicative_factors(node) or [node.lhs, node.rhs])
                return ops + [OpCount("mul", self.space(operands[0] | operands[1]))]
            return (
                self.node(node.lhs)
                + self.node(node.rhs)
                + [OpCount(BINOP_KINDS[node.op], self.space(free_ranks(node)))]
            )
        if isinstance(node, Reduce):
            return self.reduce(node)
        return []  # Access, Const, ParamRef: a read, no arithmetic

    def product(self, factors: list[Node]) -> tuple[list[OpCount], list[frozenset[str]]]:
        """Multiply factors pairwise, cheapest union first, down to two operands (or one)."""
        ops = [c for f in factors for c in self.node(f)]
        operands = [free_ranks(f) for f in factors]
        while len(operands) > 2:
            pairs = [(i, j) for i in range(len(operands)) for j in range(i + 1, len(operands))]
            i, j = min(pairs, key=lambda p: (self.numeric(operands[p[0]] | operands[p[1]]), p))
            merged = operands[i] | operands[j]
            ops.append(OpCount("mul", self.space(merged)))
            operands = [o for k, o in enumerate(operands) if k not in (i, j)] + [merged]
        return ops, operands

    def contraction(self, node: Node, reduced: frozenset[str]) -> list[OpCount]:
        """``node`` summed over ``reduced``: MACs for a product, adds otherwise."""
        length = self.numeric(reduced)
        factors = multiplicative_factors(node)
        if factors is None:
            return self.node(node) + [OpCount("add", self.space(free_ranks(node)), reduce_len=length)]
        ops, operands = self.product(factors)
        if len(operands) == 1:  # cannot happen for a product, kept for safety
            return ops + [OpCount("add", self.space(operands[0]), reduce_len=length)]
        a, b = operands
        matrix = bool(reduced & a & b) and bool(a - b - reduced) and bool(b - a - reduced)
        return ops + [OpCount("mac", self.space(a | b), matrix=matrix, reduce_len=length)]

    def reduce(self, node: Reduce) -> list[OpCount]:
        length = self.sizes[node.rank]
        if node.op in ("sum", "mean"):
            ops = self.contraction(node.arg, frozenset({node.rank}))
            if node.op == "mean":
                ops.append(OpCount("mul", self.space(free_ranks(node))))
            return ops
        return self.node(node.arg) + [
            OpCount(REDUCE_KINDS[node.op], self.space(free_ranks(node.arg)), reduce_len=length)
        ]

    def einsum(self, einsum: Einsum) -> list[OpCount]:
        ops: list[OpCount] = []
        terms = einsum.terms()
        for _, term, summed in terms:
            ops += self.contraction(term, frozenset(summed)) if summed else self.node(term)
        if len(terms) > 1:
            ops.append(OpCount("add", (len(terms) - 1) * self.space(frozenset(einsum.out_ranks))))
        return ops


def _simple_mask(cascade: Cascade, einsum: Einsum, size: Callable[[str], Count]) -> _Mask | None:
    """The mask's ranks and the count of their points it keeps (module docstring), else None (count in full)."""
    ranks = frozenset(r for cmp in einsum.where for r in cmp.ranks())
    if not ranks:
        return None
    if size is cascade.rank_size:
        kept = kept_points(cascade, einsum)
        return None if kept is None else _Mask(ranks, kept)
    if len(einsum.where) != 1 or len(ranks) != 2:
        return None
    cmp = einsum.where[0]
    if not (cmp.lhs.is_Symbol and cmp.rhs.is_Symbol) or cmp.op not in ("<=", "<", ">=", ">"):
        return None
    a, b = str(cmp.lhs), str(cmp.rhs)
    if sympy.simplify(cascade.rank_expr(a) - cascade.rank_expr(b)) != 0:
        return None
    n = size(a)
    return _Mask(ranks, n * (n + 1) / 2 if cmp.op in ("<=", ">=") else n * (n - 1) / 2)


def kept_points(cascade: Cascade, einsum: Einsum) -> int | None:
    """How many points of the ranks of the Einsum's ``where`` mask it keeps, exactly, or None past
    :data:`MASK_ENUMERATE_UP_TO` points to walk. Params take their values; the points of every rank but the
    last are walked (numpy) and, where each comparison is affine in the last rank, its kept interval is solved
    per point; otherwise every point is walked."""
    ranks = sorted({r for cmp in einsum.where for r in cmp.ranks()})
    sizes = [cascade.rank_size(r) for r in ranks]
    syms = {str(s): s for cmp in einsum.where for s in (cmp.lhs - cmp.rhs).free_symbols}
    values = {syms[k]: v for k, v in cascade.values.items() if k in syms and k not in ranks}
    diffs = [(sympy.expand((cmp.lhs - cmp.rhs).subs(values)), cmp.op) for cmp in einsum.where]  # diff op 0
    last = syms[ranks[-1]]
    coefs = [d.coeff(last, 1) if op != "!=" and d.is_polynomial(last) and sympy.degree(d, last) <= 1 else None
             for d, op in diffs]
    solved = all(c is not None and c.is_Integer for c in coefs)
    walked = ranks[:-1] if solved else ranks
    points = math.prod(sizes[:len(walked)])
    if points > MASK_ENUMERATE_UP_TO:
        return None
    grids = np.meshgrid(*(np.arange(n, dtype=np.int64) for n in sizes[:len(walked)]), indexing="ij")
    env = {r: g.ravel() for r, g in zip(walked, grids, strict=True)}

    def value(expr: sympy.Expr) -> np.ndarray:
        free = sorted(expr.free_symbols, key=str)
        got = sympy.lambdify(free, expr, modules="numpy")(*(env[str(x)] for x in free))
        return np.broadcast_to(np.asarray(got, dtype=np.int64), (points,))

    if not solved:
        keep = np.ones(points, dtype=bool)
        for d, op in diffs:
            keep &= _OPS[op](value(d), 0)
        return int(keep.sum())
    lo, hi = np.zeros(points, dtype=np.int64), np.full(points, sizes[-1] - 1, dtype=np.int64)
    for (d, op), c in zip(diffs, coefs, strict=True):
        c = int(c)
        rest = value(d - c * last)  # the comparison reads c*x + rest op 0
        if c == 0:
            hi = np.where(_OPS[op](rest, 0), hi, -1)
            continue
        if op in ("<", "<=", "=="):  # c*x <= -rest - strict
            r = -rest - (op == "<")
            hi, lo = (np.minimum(hi, r // c), lo) if c > 0 else (hi, np.maximum(lo, -(r // -c)))
        if op in (">", ">=", "=="):  # c*x >= -rest + strict
            r = -rest + (op == ">")
            lo, hi = (np.maximum(lo, -(-r // c)), hi) if c > 0 else (lo, np.minimum(hi, -r // -c))
    return int(np.maximum(hi - lo + 1, 0).sum())


_OPS = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal, "!=": np.not_equal}


def einsum_ops(cascade: Cascade, einsum: Einsum | str, symbolic: bool = False) -> tuple[OpCount, ...]:
    """Every op of one Einsum, one entry per node, by the rule of the module docstring."""
    e = cascade.einsum(einsum) if isinstance(einsum, str) else einsum
    counts = _Counter(cascade, e, symbolic).einsum(e)
    if symbolic:
        counts = [
            OpCount(c.kind, sympy.factor(sympy.sympify(c.count)), c.matrix, c.reduce_len) for c in counts
        ]
    return tuple(c for c in counts if c.count != 0)


def ops_by_kind(counts: tuple[OpCount, ...] | list[OpCount]) -> dict[str, Count]:
    """Totals per kind; matrix MACs under :data:`MATRIX_MAC`, element-wise MACs under ``mac``."""
    out: dict[str, Count] = {}
    for c in counts:
        out[c.key] = out.get(c.key, 0) + c.count
    if out and any(isinstance(v, sympy.Expr) for v in out.values()):
        out = {k: sympy.factor(sympy.sympify(v)) for k, v in out.items()}
    return dict(sorted(out.items()))


def flops(ops: dict[str, Count]) -> Count:
    """Floating-point operations: a MAC is 2, every other op 1."""
    return sum(((2 if k in ("mac", MATRIX_MAC) else 1) * v for k, v in ops.items()), 0)


def cascade_ops(cascade: Cascade, symbolic: bool = False) -> dict[str, dict[str, Count]]:
    """Ops by kind of every Einsum, in cascade order (``symbolic``: sympy over the params)."""
    return {e.name: ops_by_kind(einsum_ops(cascade, e, symbolic)) for e in cascade.einsums}


__all__ = ["MATRIX_MAC", "OpCount", "cascade_ops", "einsum_ops", "flops", "ops_by_kind"]
