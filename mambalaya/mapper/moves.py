"""Mappings one move from a given one: two of its groups merged, or one split in two.

A reader's check of an optimum that does not trust the optimiser: every neighbour is tiled by its own tile
search, run in full (no dominance test cuts it short), and priced by :func:`evaluate` as a whole mapping. The
mapper's optimum must be no worse than any of them; a neighbour that is better is a group the space costed
wrong, dropped or never built (the mamba-1.4b optimum that left the scan alone, 3.2x slower than a known
grouping, is what this would have caught). ``benchmarks/local_moves.py`` runs it at published sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from mambalaya.arch import Arch, load_arch
from mambalaya.cost.context import CostContext
from mambalaya.errors import MappingError
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.mapping import FusionGroup, Mapping
from mambalaya.mapper.heuristics import evaluate
from mambalaya.mapper.space import shared_coster
from mambalaya.mapper.tiling import Tiled, best_tiling, score

#: Most splits of one group tried (its downsets, fewest members first); more are counted, not tried
MAX_SPLITS = 256


@dataclass(frozen=True)
class Move:
    """One neighbour: ``kind`` ("merge" or "split"), the groups it changes (``before``) and what replaces them
    (``after``), and the whole mapping's cost after it, or why it is no mapping (``reason``)."""

    kind: str
    before: tuple[tuple[str, ...], ...]
    after: tuple[tuple[str, ...], ...]
    latency_s: float | None = None
    traffic_bytes: int | None = None
    reason: str = ""

    def score(self, objective: str) -> tuple[float, float] | None:
        return None if self.latency_s is None else score(self, objective)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Neighbourhood:
    """Every move from ``mapping``: its own cost, the moves tried, and the splits left untried per group."""

    latency_s: float
    traffic_bytes: int
    objective: str
    moves: tuple[Move, ...]
    untried: dict[tuple[str, ...], int]

    @property
    def value(self) -> float:
        """The mapping's own cost by the objective."""
        return self.latency_s if self.objective == "latency" else float(self.traffic_bytes)

    def better(self, rel: float = 1e-9) -> list[Move]:
        """The moves that cost less than the mapping by the objective (beyond ``rel`` of it)."""
        return [m for m in self.moves if (s := m.score(self.objective)) is not None and s[0] < self.value * (1 - rel)]

    def best(self) -> Move | None:
        scored = [m for m in self.moves if m.score(self.objective) is not None]
        return min(scored, key=lambda m: m.score(self.objective)) if scored else None


def splits(cascade: Cascade, members: tuple[str, ...], limit: int = MAX_SPLITS) -> tuple[list[tuple], int]:
    """The ways to split a group in two that keep every dependency pointing forward: each proper, non-empty set
    of members closed under the producers inside the group (a downset) first, the rest after it. Fewest members
    in the first part first; (the first ``limit``, and how many more there are)."""
    inside = set(members)
    pos = {n: i for i, n in enumerate(cascade.einsum_names)}
    order = sorted(members, key=pos.__getitem__)
    preds = {n: {t for t in cascade.einsum(n).reads if t in inside and t != n} for n in order}
    found: set[frozenset] = set()
    frontier = [frozenset()]
    while frontier:  # breadth first: every downset, grown one member at a time
        nxt = []
        for d in frontier:
            for n in order:
                if n not in d and preds[n] <= d:
                    g = d | {n}
                    if g not in found and len(g) < len(order):
                        found.add(g)
                        nxt.append(g)
        frontier = nxt
    ranked = sorted(found, key=lambda d: (len(d), sorted(pos[n] for n in d)))
    out = [(tuple(n for n in order if n in d), tuple(n for n in order if n not in d)) for d in ranked[:limit]]
    return out, max(0, len(ranked) - limit)


def neighbours(cascade: Cascade, arch: Arch | str, mapping: Mapping, objective: str = "latency", *,
               ctx: CostContext | None = None, max_splits: int = MAX_SPLITS) -> Neighbourhood:
    """Every mapping one move from ``mapping`` (module docstring), each new group at the best tiling of a full
    search, priced as a whole mapping (in ``ctx``, by default the one the mapper searched this cascade in); a merge whose groups would run in a cycle, or a group that is illegal or
    fits nowhere, is a move with its ``reason``."""
    arch = load_arch(arch) if isinstance(arch, str) else arch
    ctx = ctx or shared_coster(cascade, arch, objective).ctx  # (the mapper's own searches, where it mapped this)
    own = evaluate(cascade, arch, mapping, ctx=ctx)
    groups = [g.einsums for g in mapping.groups]
    moves: list[Move] = []
    untried: dict[tuple[str, ...], int] = {}

    def priced(kind: str, before: tuple, after: tuple) -> Move:
        rest = [g for g in mapping.groups if g.einsums not in before]
        new = []
        for members in after:
            got = best_tiling(ctx, members, objective)
            if not isinstance(got, Tiled):
                return Move(kind, before, after, reason=f"[{', '.join(members)}]: {got.reason}")
            new.append(got.group)
        ordered = _in_order(cascade, [*rest, *new])
        if ordered is None:
            return Move(kind, before, after, reason="its groups would depend on each other both ways")
        try:
            report = evaluate(cascade, arch, Mapping(tuple(ordered), cascade.name, arch.name), ctx=ctx)
        except MappingError as err:
            return Move(kind, before, after, reason=str(err))
        return Move(kind, before, after, report.latency_s, report.traffic_bytes)

    for i, a in enumerate(groups):
        for b in groups[i + 1:]:
            moves.append(priced("merge", (a, b), (tuple(n for n in cascade.einsum_names if n in {*a, *b}),)))
    for g in groups:
        if len(g) > 1:
            parts, more = splits(cascade, g, max_splits)
            if more:
                untried[g] = more
            moves.extend(priced("split", (g,), p) for p in parts)
    return Neighbourhood(own.latency_s, own.traffic_bytes, objective, tuple(moves), untried)


def _in_order(cascade: Cascade, groups: list[FusionGroup]) -> list[FusionGroup] | None:
    """The groups with producers first (cascade order breaks ties), or None when two depend on each other."""
    owner = {e: i for i, g in enumerate(groups) for e in g.einsums}
    pos = {n: i for i, n in enumerate(cascade.einsum_names)}
    q = nx.DiGraph()
    q.add_nodes_from(range(len(groups)))
    q.add_edges_from((owner[t], owner[e.name]) for e in cascade.einsums for t in e.reads
                     if t in owner and owner[t] != owner[e.name])
    if not nx.is_directed_acyclic_graph(q):
        return None
    first = {i: min(pos[e] for e in g.einsums) for i, g in enumerate(groups)}
    return [groups[i] for i in nx.lexicographical_topological_sort(q, key=first.__getitem__)]


__all__ = ["MAX_SPLITS", "Move", "Neighbourhood", "neighbours", "splits"]
