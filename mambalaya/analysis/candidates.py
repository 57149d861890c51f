"""Candidate fusion groups: the connected, convex sub-graphs of a cascade's Einsum graph.

A group is *convex* when no path leaves it and re-enters (otherwise the group
would wait on an Einsum outside it that waits on the group). Groups are
enumerated lazily (a generator), smallest first, each exactly once, by growing
convex connected sets one neighbouring Einsum at a time. That reaches every
convex connected set: any such set of two or more Einsums has a source or sink
whose removal leaves it convex and connected, so it grows from a smaller one.
Sets are Python-int bitsets over the cascade order, so the convexity test is
two ORs and an AND (descendants and ancestors of the set meet only inside it).

Pruning, because a chain of layers has exponentially many groups:
``max_size`` caps the number of Einsums per group; ``max_candidates`` stops
before starting a larger group size once that many groups were produced (so
the sizes produced are complete); ``keep`` (a predicate on a group) stops growth
from groups it rejects (the analyzer passes a buffer-capacity test: a group
whose smallest-tile buffer does not fit is not grown).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from mambalaya.ir.cascade import Cascade


class EinsumDag:
    """Bitset view of the Einsum graph: neighbours, descendants and ancestors per Einsum."""

    def __init__(self, cascade: Cascade) -> None:
        self.names = cascade.einsum_names
        self.index = {n: i for i, n in enumerate(self.names)}
        g = cascade.einsum_graph
        n = len(self.names)
        self.succ = [0] * n
        self.pred = [0] * n
        for u, v in g.edges:
            self.succ[self.index[u]] |= 1 << self.index[v]
            self.pred[self.index[v]] |= 1 << self.index[u]
        self.nbr = [self.succ[i] | self.pred[i] for i in range(n)]
        self.desc = [0] * n
        for i in reversed(range(n)):  # cascade order is a topological order
            d = self.succ[i]
            for j in _bits(self.succ[i]):
                d |= self.desc[j]
            self.desc[i] = d
        self.anc = [0] * n
        for i in range(n):
            a = self.pred[i]
            for j in _bits(self.pred[i]):
                a |= self.anc[j]
            self.anc[i] = a

    def bits(self, names) -> int:
        out = 0
        for name in names:
            out |= 1 << self.index[name]
        return out

    def members(self, bits: int) -> tuple[str, ...]:
        return tuple(self.names[i] for i in _bits(bits))

    def descendants(self, bits: int) -> int:
        out = 0
        for i in _bits(bits):
            out |= self.desc[i]
        return out

    def ancestors(self, bits: int) -> int:
        out = 0
        for i in _bits(bits):
            out |= self.anc[i]
        return out

    def outside_between(self, bits: int) -> int:
        """Einsums outside the set on a path between two members (empty iff convex)."""
        return self.descendants(bits) & self.ancestors(bits) & ~bits

    def connected(self, bits: int) -> bool:
        if not bits:
            return False
        seen = bits & -bits
        frontier = seen
        while frontier:
            grow = 0
            for i in _bits(frontier):
                grow |= self.nbr[i]
            frontier = grow & bits & ~seen
            seen |= frontier
        return seen == bits


def _bits(x: int) -> Iterator[int]:
    while x:
        low = x & -x
        yield low.bit_length() - 1
        x ^= low


class GroupEnumeration:
    """Lazy enumeration of the connected convex groups, smallest first, each exactly once.

    ``max_size`` caps the group size; ``max_candidates`` stops before a new group size once that
    many groups were yielded (so every size up to :attr:`complete_size` is complete);
    ``keep(group)`` returning False stops growth from that group (the group itself is yielded).
    ``prepare(groups)`` is told each size's groups before the first of them is yielded (a caller that judges
    them can do so all at once: they do not depend on each other). After iterating, :attr:`truncated` tells
    whether a cap cut larger groups off.
    """

    def __init__(self, cascade: Cascade, max_size: int | None = None, max_candidates: int | None = None,
                 keep: Callable[[tuple[str, ...]], bool] | None = None, dag: EinsumDag | None = None,
                 prepare: Callable[[list[tuple[str, ...]]], None] | None = None) -> None:
        self.dag = dag or EinsumDag(cascade)
        self.max_size = max_size
        self.max_candidates = max_candidates
        self.keep = keep
        self.prepare = prepare
        self.complete_size = 0
        self.truncated = False
        self.count = 0

    def _level(self, entries: list[tuple[tuple[str, ...], tuple]]) -> Iterator[tuple[str, ...]]:
        """Yield one size's groups; returns the growth states of those ``keep`` keeps."""
        if self.prepare is not None:
            self.prepare([g for g, _ in entries])
        kept = []
        for group, state in entries:
            self.count += 1
            yield group
            if self.keep is None or self.keep(group):
                kept.append(state)
        return kept

    def __iter__(self) -> Iterator[tuple[str, ...]]:
        dag = self.dag
        n = len(dag.names)
        limit = n if self.max_size is None else min(self.max_size, n)
        # a level holds (members, neighbours, descendants, ancestors) bitsets of groups of one size
        level = yield from self._level([((dag.names[i],), (1 << i, dag.nbr[i] & ~(1 << i), dag.desc[i], dag.anc[i]))
                                        for i in range(n)])
        size = 1
        self.complete_size = min(1, n)
        while level:
            if size >= limit or (self.max_candidates is not None and self.count >= self.max_candidates):
                self.truncated = any(nbr for _, nbr, _, _ in level)
                return
            seen: set[int] = set()
            entries = []
            for bits, nbr, desc, anc in level:
                for j in _bits(nbr):
                    grown = bits | (1 << j)
                    if grown in seen:
                        continue
                    seen.add(grown)
                    d, a = desc | dag.desc[j], anc | dag.anc[j]
                    if d & a & ~grown:
                        continue  # not convex
                    entries.append((dag.members(grown), (grown, (nbr | dag.nbr[j]) & ~grown, d, a)))
            level = yield from self._level(entries)
            size += 1
            self.complete_size = size


def candidate_groups(cascade: Cascade, max_size: int | None = None, max_candidates: int | None = None,
                     keep: Callable[[tuple[str, ...]], bool] | None = None,
                     dag: EinsumDag | None = None) -> Iterator[tuple[str, ...]]:
    """Every connected convex group of Einsums (names in cascade order), smallest first, each once."""
    return iter(GroupEnumeration(cascade, max_size, max_candidates, keep, dag))
