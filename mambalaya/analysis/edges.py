"""Fusion class of every producer -> tensor -> consumer edge.

The iteration spaces of producer P and consumer C are compared through the
tensor T (see :mod:`mambalaya.analysis.matching` for how ranks are matched by
position, splits and halos included): shared ranks are those matched; every
other rank of an Einsum is private to it, even when the other Einsum has a rank
of the same name. The class follows from the private ranks alone:

=====  ==============================  ==========================================
class  private ranks                   what fusing needs
=====  ==============================  ==========================================
RI     neither side                    one tile of T, any order of shared ranks
RSb    producer only (it reduces it)   P's private ranks complete before C reads
RSp    consumer only (a broadcast)     hold P's tile while C sweeps its ranks
RD     both                            fuse along shared ranks; buffer the rest
=====  ==============================  ==========================================

Modifiers: iterative (P or C walks a shared rank in order: a recurrence or a
prefix sum), halos (windows on a shared rank), and multi-consumer tensors.
The buffer need is a sympy expression in tile-size symbols ``T_<rank>`` of the
shared ranks (named by the producer's rank; by the consumer's pieces for a
split), with private, pinned or crossed positions at full extent plus any halo
window; a consumer that reduces a shared rank adds its partial-sum tile.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from mambalaya.analysis.kinds import iterative_rank
from mambalaya.analysis.matching import SAME_LOOP_KINDS, SPLIT_KINDS, Halo, PositionMatch, match_positions
from mambalaya.ir.cascade import Cascade, Einsum
from mambalaya.ir.sizes import substitute

FUSION_CLASSES = ("RI", "RSb", "RSp", "RD")


def tile_symbol(rank: str) -> sympy.Symbol:
    """The tile size of a (group) rank: ``T_l``."""
    return sympy.Symbol(f"T_{rank}", integer=True, positive=True)


def fusion_class(producer_private: bool, consumer_private: bool) -> str:
    """RI / RSb / RSp / RD from which sides have private ranks."""
    return {(False, False): "RI", (True, False): "RSb", (False, True): "RSp", (True, True): "RD"}[
        (producer_private, consumer_private)]


@dataclass(frozen=True)
class Iterative:
    """A rank walked in order across the edge (a recurrence's or a prefix sum's)."""

    rank: str  # the rank's name in the Einsum that walks it
    einsum: str  # the recurrence or prefix-sum Einsum (the producer or the consumer)
    kind: str  # "recurrence" or "prefix_sum"

    def to_dict(self) -> dict:
        return {"rank": self.rank, "einsum": self.einsum, "kind": self.kind}


@dataclass(frozen=True)
class Edge:
    """The fusion analysis of one producer -> tensor -> consumer edge."""

    producer: str
    consumer: str
    tensor: str
    fusion_class: str  # RI, RSb, RSp or RD
    shared: tuple[tuple[str, str], ...]  # (producer rank, consumer rank) pairs
    private_producer: tuple[str, ...]
    private_consumer: tuple[str, ...]
    positions: tuple[PositionMatch, ...]  # how C indexes each position of T
    iterative: Iterative | None
    halos: tuple[Halo, ...]
    multi_consumer: tuple[str, ...]  # the tensor's other consumers
    needs_complete: tuple[str, ...]  # producer ranks C needs complete before it reads a tile
    partial_sums: tuple[str, ...]  # shared consumer ranks C reduces (partial sums across their tiles)
    loop_orders: tuple[str, ...]  # the loop orders under which fusing is legal, in words
    buffer: sympy.Expr  # on-chip elements, in tile symbols T_<producer rank>
    buffer_full: sympy.Expr  # the fallback: T whole (elements, over params)
    buffer_full_elems: int  # the fallback under the bound params

    @property
    def halo(self) -> Halo | None:
        return self.halos[0] if self.halos else None

    def to_dict(self) -> dict:
        """The JSON form (the JSON contract: producer, consumer, tensor, class, iterative, halo, ...)."""
        return {
            "producer": self.producer,
            "consumer": self.consumer,
            "tensor": self.tensor,
            "class": self.fusion_class,
            "iterative": self.iterative.rank if self.iterative else None,
            "iterative_detail": self.iterative.to_dict() if self.iterative else None,
            "halo": self.halo.to_dict() if self.halo else None,
            "halos": [h.to_dict() for h in self.halos],
            "shared": [list(p) for p in self.shared],
            "private_producer": list(self.private_producer),
            "private_consumer": list(self.private_consumer),
            "multi_consumer": list(self.multi_consumer),
            "needs_complete": list(self.needs_complete),
            "partial_sums": list(self.partial_sums),
            "splits": [{"position": m.position, "producer_rank": m.producer_rank, "kind": m.kind,
                        "consumer_ranks": list(m.shared_ranks), "index": list(m.indices)}
                       for m in self.positions if m.kind not in ("same",) or m.cross or m.pinned],
            "loop_orders": list(self.loop_orders),
            "buffer": str(self.buffer),
            "buffer_full": str(self.buffer_full),
            "buffer_full_elems": self.buffer_full_elems,
        }


def _edge_iterative(producer: Einsum, consumer: Einsum, shared: tuple[tuple[str, str], ...]) -> Iterative | None:
    for einsum, side in ((producer, 0), (consumer, 1)):
        it = iterative_rank(einsum)
        if it and it[0] in {pair[side] for pair in shared}:
            return Iterative(it[0], einsum.name, it[1])
    return None


def position_footprint(cascade: Cascade, m: PositionMatch) -> sympy.Expr:
    """Rows of T the consumer needs at one position per tile of the shared ranks."""
    prank = m.producer_rank
    if m.kind in SPLIT_KINDS and m.shared and not m.pinned:
        crossed = set(m.crossed)
        out = sympy.Integer(1)
        for r in m.shared:
            out *= cascade.rank_exprs[r] if r in crossed else tile_symbol(r)
        return out
    if m.shared and not m.needs_complete:
        return tile_symbol(prank) + (m.halo.window if m.halo else 0)
    return cascade.rank_exprs[prank]


def _buffer(cascade: Cascade, consumer: Einsum, positions: tuple[PositionMatch, ...],
            partial: tuple[str, ...]) -> sympy.Expr:
    """T's footprint per tile of the shared ranks, plus C's partial sums when it reduces a shared rank."""
    tile = sympy.Mul(*(position_footprint(cascade, m) for m in positions))
    if not partial:
        return tile
    partner = {m.shared[0]: m.producer_rank for m in positions if m.kind in SAME_LOOP_KINDS and m.shared}
    shared = {r for m in positions for r in m.shared_ranks}
    acc = sympy.Integer(1)
    for r in consumer.out_ranks:
        if r in partner:
            acc *= tile_symbol(partner[r])
        elif r in shared:
            acc *= tile_symbol(r)
        else:
            acc *= cascade.rank_exprs[r]
    return tile + acc


def _loop_orders(producer: Einsum, consumer: Einsum, shared: tuple[tuple[str, str], ...],
                 positions: tuple[PositionMatch, ...], private_c: tuple[str, ...], iterative: Iterative | None,
                 needs: tuple[str, ...], partial: tuple[str, ...]) -> tuple[str, ...]:
    """The loop orders under which fusing the edge is legal, in words."""
    P, C, tensor = producer.name, consumer.name, producer.name
    out: list[str] = []
    if iterative is not None:
        what = "the state stays on chip across steps" if iterative.kind == "recurrence" else \
            "the running sum is carried across tiles"
        where = "outermost and sequential" if iterative.kind == "recurrence" else "walked in order"
        out.append(f"{iterative.rank} {where} ({iterative.einsum} is a {iterative.kind.replace('_', ' ')}; {what})")
    pairs = ", ".join(p if p == c else f"{p}~{c}" for p, c in shared)
    if shared:
        out.append(f"shared ranks {pairs} outer, in any order" + (" after the iterative rank" if iterative else ""))
    else:
        out.append(f"no shared rank: {C} runs after {P} has written all of {tensor}")
    for m in positions:
        if m.kind in ("split", "stride", "merge", "coarsen", "fine") and m.shared:
            out.append(f"re-tile {m.producer_rank} as {m.indices[0]} (tiles align to the pieces)")
    reduced = [r for r in needs if r in _reduced(producer)]
    if reduced:
        out.append(f"{P}'s private rank(s) {', '.join(reduced)} complete (innermost) before {C} reads a tile of "
                   f"{tensor}, or a partial-sum buffer")
    for m in positions:
        if m.pinned:
            out.append(f"{C} reads {tensor} at {m.producer_rank} = {', '.join(m.pinned)}: {P}'s {m.producer_rank} "
                       f"complete (that row written) before {C} reads")
        if m.cross:
            whole = ", ".join(m.crossed) if m.kind in SPLIT_KINDS else m.producer_rank
            out.append(f"{C} reads {m.producer_rank} of {tensor} as {' and '.join(m.indices)}: {whole} untiled "
                       f"(whole extent per tile)")
        if m.kind == "unmatched":
            out.append(f"{C} reads all of {m.producer_rank} of {tensor} per element: {m.producer_rank} untiled")
        if m.halo is not None:
            h = m.halo
            out.append(f"{h.rank} walked in order keeping a {h.direction} window of {h.window} row(s) of {tensor} "
                       f"(or the halo recomputed)")
    if private_c:
        out.append(f"{C}'s private rank(s) {', '.join(private_c)} inner while the tile of {tensor} is held "
                   f"(or {P} recomputed per step of them)")
    if partial:
        out.append(f"{C} reduces shared rank(s) {', '.join(partial)}: untiled, or {C} keeps partial sums of its "
                   f"output across their tiles")
    return tuple(out)


def _reduced(e: Einsum) -> tuple[str, ...]:
    """``e.reduced_ranks`` (which re-prints the output ranks once per rank: sympy printing is slow)."""
    out = set(e.out_ranks)
    return tuple(r for r in e.ranks if r not in out)


def classify_edge(cascade: Cascade, producer: str, consumer: str) -> Edge:
    """The fusion analysis of the edge ``producer -> producer's tensor -> consumer``."""
    P, C = cascade.einsum(producer), cascade.einsum(consumer)
    tensor = P.name
    if tensor not in C.reads or producer == consumer:
        raise ValueError(f"{consumer} does not read {tensor}: no edge {producer} -> {consumer}")
    positions = match_positions(cascade, P, C)
    shared = tuple(dict.fromkeys((m.producer_rank, r) for m in positions for r in m.shared_ranks))
    shared_p = {p for p, _ in shared}
    shared_c = {c for _, c in shared}
    private_p = tuple(r for r in P.ranks if r not in shared_p)
    private_c = tuple(r for r in C.ranks if r not in shared_c)
    cls = fusion_class(bool(private_p), bool(private_c))
    iterative = _edge_iterative(P, C, shared)
    halos = tuple(m.halo for m in positions if m.halo is not None)
    needs = tuple(dict.fromkeys([*_reduced(P), *(m.producer_rank for m in positions if m.needs_complete)]))
    partial = tuple(r for r in _reduced(C) if r in shared_c)
    others = tuple(c for c in cascade.consumers(tensor) if c != consumer)
    orders = _loop_orders(P, C, shared, positions, private_c, iterative, needs, partial)
    buffer = _buffer(cascade, C, positions, partial)
    full = sympy.Mul(*cascade.tensors[tensor].shape)
    return Edge(producer, consumer, tensor, cls, shared, private_p, private_c, positions, iterative, halos, others,
                needs, partial, orders, buffer, full, cascade.size(tensor))


def classify_edges(cascade: Cascade) -> tuple[Edge, ...]:
    """Every producer -> tensor -> consumer edge, by consumer in cascade order, then producer."""
    out = []
    for e in cascade.einsums:
        for t in e.reads:
            if t != e.name and cascade.producer(t) is not None:
                out.append(classify_edge(cascade, t, e.name))
    return tuple(out)


def evaluate_buffer(cascade: Cascade, expr: sympy.Expr, tiles: dict[str, int] | None = None) -> int:
    """Elements of a buffer expression with tile symbols bound (a tile not given: its rank's full extent)."""
    tiles = tiles or {}
    subs = {}
    for s in expr.free_symbols:
        name = str(s)
        if name.startswith("T_"):
            rank = name[2:].rstrip("'")
            subs[s] = sympy.Integer(tiles.get(rank, cascade.rank_size(rank) if rank in cascade.rank_sizes else 1))
    value = substitute(sympy.sympify(expr).xreplace(subs), cascade.values, f"buffer {expr}")
    return int(value)
