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
- A ``where`` mask of one comparison between two plain ranks of the same size
  (``s <= q``) counts only the kept pairs, ``n(n+1)/2`` (``<``: ``n(n-1)/2``), for every
  node whose ranks include both; any other mask is ignored (counted in full).
- Each count carries its reduction length (the product of the reduced ranks' sizes)
  so the latency model can charge pipeline fill and drain on a CGLA.

A MAC is one op (2 FLOP in :func:`flops`); every other op is 1 FLOP.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

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


@dataclass(frozen=True)
class _Mask:
    """A ``s <= q`` style mask: the two ranks and the count of kept pairs."""

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
    """The kept-pair count of a one-comparison mask between two same-size plain ranks, else None."""
    if len(einsum.where) != 1:
        return None
    cmp = einsum.where[0]
    if (
        not (cmp.lhs.is_Symbol and cmp.rhs.is_Symbol)
        or cmp.lhs == cmp.rhs
        or cmp.op not in ("<=", "<", ">=", ">")
    ):
        return None
    a, b = str(cmp.lhs), str(cmp.rhs)
    if sympy.simplify(cascade.rank_expr(a) - cascade.rank_expr(b)) != 0:
        return None
    n = size(a)
    pairs = n * (n + 1) / 2 if cmp.op in ("<=", ">=") else n * (n - 1) / 2
    return _Mask(frozenset({a, b}), pairs if isinstance(pairs, sympy.Expr) else int(pairs))


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
