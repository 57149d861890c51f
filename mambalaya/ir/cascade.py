"""The cascade IR: Einsums and tensors, their ranks and shapes, as a graph.

A :class:`Cascade` is immutable and carries its params; ``with_params``
gives a re-bound copy. Sizes are sympy expressions over param symbols
(``rank_expr``) and numbers under the bound params (``rank_size``, ``shape``).
The networkx graph has a node per Einsum (``("einsum", name)``) and per tensor
(``("tensor", name)``), with tensor -> Einsum edges for reads and
Einsum -> tensor edges for writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from numbers import Real
from typing import Any

import networkx as nx
import sympy

from mambalaya.errors import CascadeError
from mambalaya.ir.expr import Access, Compare, Node, accesses, additive_terms, all_ranks, free_ranks, rank_symbol
from mambalaya.ir.sizes import evaluate_size

ROLES = ("input", "weight", "intermediate", "output")
DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Recurrence:
    """An Einsum that reads its own output one step back along an iterative rank."""

    rank: str  # the iterative (sequential) rank variable
    position: int  # the output position it indexes
    init: str | None  # the tensor holding the state before step 0 (zeros when None)


@dataclass(frozen=True)
class Einsum:
    """One statement: an output access, a right-hand side and an optional mask."""

    output: Access
    expr: Node
    where: tuple[Compare, ...]
    text: str
    line: int | None = None
    recurrence: Recurrence | None = None

    @property
    def name(self) -> str:
        return self.output.tensor

    @cached_property
    def out_ranks(self) -> tuple[str, ...]:
        return tuple(str(ix) for ix in self.output.indices)

    @cached_property
    def ranks(self) -> tuple[str, ...]:
        """The iteration space: output ranks first, then the others in reading order."""
        seen = list(self.out_ranks)
        for acc in accesses(self.expr):
            for ix in acc.indices:
                for sym in sorted(ix.free_symbols, key=str):
                    if sym.is_integer and str(sym) not in seen:
                        seen.append(str(sym))
        for r in sorted(all_ranks(self.expr) | {r for c in self.where for r in c.ranks()}):
            if r not in seen:
                seen.append(r)
        return tuple(seen)

    @cached_property
    def reduced_ranks(self) -> tuple[str, ...]:
        return tuple(r for r in self.ranks if r not in self.out_ranks)

    @cached_property
    def reads(self) -> tuple[str, ...]:
        """Tensors read, in order, without repeats (the initial state included)."""
        names = [a.tensor for a in accesses(self.expr)]
        if self.recurrence and self.recurrence.init:
            names.append(self.recurrence.init)
        return tuple(dict.fromkeys(names))

    def terms(self) -> list[tuple[int, Node, frozenset[str]]]:
        """Signed additive terms with the ranks each sums over (Einstein, per term)."""
        out = set(self.out_ranks)
        return [(sign, t, free_ranks(t) - out) for sign, t in additive_terms(self.expr)]


@dataclass(frozen=True)
class TensorSpec:
    """What the cascade knows of one tensor."""

    name: str
    role: str
    shape: tuple[sympy.Expr, ...]  # symbolic, over param symbols
    rank_names: tuple[str | None, ...]  # the plain rank at each position, where one is used
    dtype: str = "float32"
    source: str | None = None  # checkpoint name (e.g. "in_proj.weight") for real weights
    line: int | None = None

    @property
    def element_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Cascade:
    """A validated cascade of Einsums with its params bound."""

    name: str
    params: dict[str, int | float]
    derived: dict[str, sympy.Expr]
    rank_exprs: dict[str, sympy.Expr]
    tensors: dict[str, TensorSpec]
    einsums: tuple[Einsum, ...]
    file: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # extension keys (config map, description)

    # ---- sizes ---------------------------------------------------------
    @cached_property
    def values(self) -> dict[str, int | float]:
        """Params and derived sizes, evaluated."""
        values: dict[str, int | float] = dict(self.params)
        for name, expr in self.derived.items():
            values[name] = evaluate_size(expr, values, f"derived size '{name}'")
        return values

    def rank_expr(self, rank: str) -> sympy.Expr:
        """A rank's size as a sympy expression of params, derived sizes substituted."""
        expr = self.rank_exprs[rank]
        for _ in range(len(self.derived) + 1):
            subs = {s: self.derived[str(s)] for s in expr.free_symbols if str(s) in self.derived}
            if not subs:
                break
            expr = expr.subs(subs)
        return expr

    @cached_property
    def rank_sizes(self) -> dict[str, int]:
        return {r: evaluate_size(e, self.values, f"rank '{r}'") for r, e in self.rank_exprs.items()}

    def rank_size(self, rank: str) -> int:
        return self.rank_sizes[rank]

    def shape(self, tensor: str) -> tuple[int, ...]:
        return self._shapes[tensor]

    @cached_property
    def _shapes(self) -> dict[str, tuple[int, ...]]:
        return {
            name: tuple(evaluate_size(e, self.values, f"tensor {name} position {i}") for i, e in enumerate(t.shape))
            for name, t in self.tensors.items()
        }

    def size(self, tensor: str) -> int:
        n = 1
        for s in self.shape(tensor):
            n *= s
        return n

    def nbytes(self, tensor: str) -> int:
        return self.size(tensor) * self.tensors[tensor].element_bytes

    def with_params(self, **overrides: int | float) -> Cascade:
        """A copy with some params changed (unknown names are an error)."""
        unknown = sorted(set(overrides) - set(self.params))
        if unknown:
            raise CascadeError(
                f"unknown param(s) {', '.join(unknown)} for cascade '{self.name}' "
                f"(its params: {', '.join(sorted(self.params))})",
                file=self.file,
            )
        for k, v in overrides.items():  # name the size the user set, not a derived one it breaks
            was = self.params[k]
            whole = isinstance(v, Real) and not isinstance(v, bool) and v > 0 and float(v).is_integer()
            if isinstance(was, int) and was > 0 and not whole:
                raise CascadeError(f"param {k}={v!r}: {k} is a size (it was {was}); give a positive whole number",
                                   file=self.file)
        bound = replace(self, params={**self.params, **overrides})
        bound.check_sizes()
        return bound

    def check_sizes(self) -> None:
        """Evaluate every size under the bound params; raise on a bad one."""
        try:
            _ = self.rank_sizes, self._shapes
        except CascadeError as err:
            raise err.located(self.file) from None

    # ---- structure -----------------------------------------------------
    def einsum(self, name: str) -> Einsum:
        return self._by_name[name]

    @cached_property
    def _by_name(self) -> dict[str, Einsum]:
        return {e.name: e for e in self.einsums}

    @cached_property
    def einsum_names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.einsums)

    def inputs(self) -> list[str]:
        return [n for n, t in self.tensors.items() if t.role in ("input", "weight")]

    def outputs(self) -> list[str]:
        return [n for n, t in self.tensors.items() if t.role == "output"]

    def consumers(self, tensor: str) -> list[str]:
        """Einsums reading ``tensor`` (a recurrence reading itself excluded), in cascade order."""
        return list(self._consumers.get(tensor, ()))

    @cached_property
    def _consumers(self) -> dict[str, tuple[str, ...]]:
        """:meth:`consumers` of every tensor, found once (the mapper asks millions of times)."""
        out: dict[str, list[str]] = {}
        for e in self.einsums:
            for t in dict.fromkeys(e.reads):
                if t != e.name:
                    out.setdefault(t, []).append(e.name)
        return {t: tuple(v) for t, v in out.items()}

    def producer(self, tensor: str) -> str | None:
        return tensor if tensor in self._by_name else None

    @cached_property
    def graph(self) -> nx.DiGraph:
        g = nx.DiGraph(name=self.name)
        for name, t in self.tensors.items():
            g.add_node(("tensor", name), kind="tensor", role=t.role)
        for i, e in enumerate(self.einsums):
            g.add_node(("einsum", e.name), kind="einsum", index=i, text=e.text)
            g.add_edge(("einsum", e.name), ("tensor", e.name))
            for t in e.reads:
                if t != e.name:
                    g.add_edge(("tensor", t), ("einsum", e.name))
        return g

    @cached_property
    def einsum_graph(self) -> nx.DiGraph:
        """Einsum -> Einsum edges, one per intermediate tensor read (tensor on the edge)."""
        g = nx.DiGraph()
        for e in self.einsums:
            g.add_node(e.name)
        for e in self.einsums:
            for t in e.reads:
                if t in self._by_name and t != e.name:
                    g.add_edge(t, e.name, tensor=t)
        return g


def index_ranks(ix: sympy.Expr) -> list[str]:
    """Rank variables an index expression uses, in a stable order."""
    return sorted(str(s) for s in ix.free_symbols if s.is_integer)


def is_plain_rank(ix: sympy.Expr) -> bool:
    return bool(ix.is_Symbol and ix.is_integer)


__all__ = [
    "Cascade",
    "Einsum",
    "Recurrence",
    "TensorSpec",
    "ROLES",
    "DTYPE_BYTES",
    "index_ranks",
    "is_plain_rank",
    "rank_symbol",
]
