"""Expression trees of the extended-Einsum language.

An Einsum's right-hand side is a tree of these frozen nodes. Index
expressions inside an :class:`Access` are sympy expressions over rank symbols
and parameter symbols (affine in the common case: ``i+k-3``, ``c*Q+q``; floor
division and remainder appear when a split rank is read back: ``l//Q``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import sympy

#: Explicit reduction operators, written ``op_rank(...)``.
REDUCE_OPS = ("sum", "max", "min", "mean", "cumsum")

#: Comparison operators allowed in a ``where`` predicate.
COMPARE_OPS = ("<=", "<", ">=", ">", "==", "!=")


def rank_symbol(name: str) -> sympy.Symbol:
    """The sympy symbol of a rank variable (an integer, so sympy can tell it from a param)."""
    return sympy.Symbol(name, integer=True, nonnegative=True)


def param_symbol(name: str) -> sympy.Symbol:
    """The sympy symbol of a named parameter or derived size."""
    return sympy.Symbol(name, positive=True)


@dataclass(frozen=True)
class Access:
    """A read (or the write) of a tensor at index expressions."""

    tensor: str
    indices: tuple[sympy.Expr, ...]

    def ranks(self) -> frozenset[str]:
        return _access_ranks(self.indices)

    def __str__(self) -> str:
        return f"{self.tensor}[{','.join(_index_str(ix) for ix in self.indices)}]"


@lru_cache(maxsize=1 << 16)
def _access_ranks(indices: tuple[sympy.Expr, ...]) -> frozenset[str]:
    """Rank variables of index expressions (cached: printing sympy symbols is slow, and a mapper asks often)."""
    return frozenset(str(s) for ix in indices for s in ix.free_symbols if s.is_integer)


@dataclass(frozen=True)
class Const:
    """A numeric literal."""

    value: float

    def __str__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True)
class ParamRef:
    """A scalar parameter used as a value (``eps`` in ``rsqrt(v + eps)``)."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Call:
    """A map function applied element-wise (``exp``, ``silu``, ``clamp``...)."""

    fn: str
    args: tuple[Node, ...]

    def __str__(self) -> str:
        return f"{self.fn}({', '.join(map(str, self.args))})"


@dataclass(frozen=True)
class BinOp:
    """An element-wise binary operator: ``+ - * /``."""

    op: str
    lhs: Node
    rhs: Node

    def __str__(self) -> str:
        return f"({self.lhs} {self.op} {self.rhs})"


@dataclass(frozen=True)
class Reduce:
    """An explicit reduction over one rank (``sum_n(...)``), or a prefix sum."""

    op: str
    rank: str
    arg: Node

    def __str__(self) -> str:
        return f"{self.op}_{self.rank}({self.arg})"


Node = Access | Const | ParamRef | Call | BinOp | Reduce


@dataclass(frozen=True)
class Compare:
    """One comparison of a ``where`` predicate between two index expressions."""

    lhs: sympy.Expr
    op: str
    rhs: sympy.Expr

    def ranks(self) -> frozenset[str]:
        return frozenset(str(s) for s in (self.lhs - self.rhs).free_symbols if s.is_integer)

    def __str__(self) -> str:
        return f"{_index_str(self.lhs)} {self.op} {_index_str(self.rhs)}"


@lru_cache(maxsize=1 << 14)
def _index_str(ix: sympy.Expr) -> str:
    """An index as the cascade syntax writes it (kept: sympy prints slowly, and a chain of layers prints each
    layer's indices again)."""
    return str(ix).replace(" ", "")


def children(node: Node) -> tuple[Node, ...]:
    """The direct sub-expressions of a node."""
    if isinstance(node, Call):
        return node.args
    if isinstance(node, BinOp):
        return (node.lhs, node.rhs)
    if isinstance(node, Reduce):
        return (node.arg,)
    return ()


def walk(node: Node):
    """Every node of a tree, parents before children."""
    yield node
    for child in children(node):
        yield from walk(child)


def accesses(node: Node) -> list[Access]:
    """The tensor reads of a tree, in reading order."""
    return [n for n in walk(node) if isinstance(n, Access)]


def free_ranks(node: Node) -> frozenset[str]:
    """Ranks a node's value varies over (explicit reductions remove theirs)."""
    if isinstance(node, Access):
        return node.ranks()
    if isinstance(node, Reduce):
        inner = free_ranks(node.arg)
        return inner if node.op == "cumsum" else inner - {node.rank}
    out: frozenset[str] = frozenset()
    for child in children(node):
        out |= free_ranks(child)
    return out


def all_ranks(node: Node) -> frozenset[str]:
    """Every rank a tree mentions, reduced ones included."""
    out: frozenset[str] = frozenset()
    for n in walk(node):
        if isinstance(n, Access):
            out |= n.ranks()
        elif isinstance(n, Reduce):
            out |= {n.rank}
    return out


def additive_terms(node: Node) -> list[tuple[int, Node]]:
    """Split a top-level sum into signed terms: Einstein summation is per term."""
    if isinstance(node, BinOp) and node.op in "+-":
        left = additive_terms(node.lhs)
        right = additive_terms(node.rhs)
        if node.op == "-":
            right = [(-sign, term) for sign, term in right]
        return left + right
    return [(1, node)]


def multiplicative_factors(node: Node) -> list[Node] | None:
    """The factors of a pure product, or None when the node is not one."""
    if isinstance(node, BinOp) and node.op == "*":
        left = multiplicative_factors(node.lhs) or [node.lhs]
        right = multiplicative_factors(node.rhs) or [node.rhs]
        return left + right
    return None
