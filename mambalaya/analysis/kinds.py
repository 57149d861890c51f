"""What kind of operation an Einsum is, and which rank (if any) it walks sequentially.

The kind drives the colours of the rendered cascade (DESIGN's figure: GEMMs
with a weight, recurrences, element-wise maps, unary nonlinearities); the
iterative rank drives fusion legality (a recurrence's rank is the outermost
sequential loop of its group; a prefix sum's rank is walked in order).
"""

from __future__ import annotations

from mambalaya.ir.cascade import Cascade, Einsum
from mambalaya.ir.expr import Call, Reduce, walk

#: Einsum kinds, in legend order, with a human label.
KINDS: dict[str, str] = {
    "gemm": "GEMM / conv with a weight",
    "recurrent": "recurrence / prefix sum",
    "reduction": "reduction (no weight)",
    "elementwise": "element-wise / broadcast",
    "unary": "unary nonlinear",
}


def prefix_rank(einsum: Einsum) -> str | None:
    """The rank of a ``cumsum_q(...)`` prefix sum in the Einsum, if it has one."""
    for node in walk(einsum.expr):
        if isinstance(node, Reduce) and node.op == "cumsum":
            return node.rank
    return None


def iterative_rank(einsum: Einsum) -> tuple[str, str] | None:
    """``(rank, "recurrence" | "prefix_sum")`` for an Einsum that walks a rank in order, else None."""
    if einsum.recurrence is not None:
        return einsum.recurrence.rank, "recurrence"
    rank = prefix_rank(einsum)
    return (rank, "prefix_sum") if rank else None


def einsum_kind(cascade: Cascade, einsum: Einsum) -> str:
    """One of :data:`KINDS` for an Einsum."""
    if iterative_rank(einsum) is not None:
        return "recurrent"
    roles = {t: cascade.tensors[t].role for t in einsum.reads}
    has_weight = any(r == "weight" for r in roles.values())
    if einsum.reduced_ranks:
        return "gemm" if has_weight else "reduction"
    data_reads = [t for t, r in roles.items() if r != "weight"]
    if len(data_reads) <= 1 and any(isinstance(n, Call) for n in walk(einsum.expr)):
        return "unary"
    return "elementwise"
