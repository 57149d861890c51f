"""Fusion groups: is a set of Einsums legal to fuse, in which loop order, with what buffer.

The model of a fused group (what a fused executor runs):

* **Group ranks.** Ranks of the group's Einsums matched through an internal
  tensor (same rank, offset, slice or halo window) are one loop of the fused
  nest (a *group rank*). Split and merge index expressions (``c*chunk+q`` vs
  ``l``, ``l//chunk``) *link* loops instead: the pieces of one loop with one piece
  signature are one loop, so ``c`` of every Einsum that reads ``l`` as
  ``c*chunk+q`` is one loop and ``l`` is re-tiled as (``c``, ``q``). A union that
  would put two ranks of one Einsum into one loop (``YD`` reads the inner piece
  of ``l`` as both ``q`` and ``s``) is not made. Group ranks of two or more
  Einsums (or linked, or iterative) are *fused loops*, tiled by ``T_<name>``;
  every other rank is private to its Einsum and runs to full extent per tile.
* **Iterative rank.** A recurrence's rank is the outermost, sequential fused
  loop; its state stays on chip across steps.

Legality rules (:func:`check_group` returns the broken ones, worded for a user):

1. The group is non-empty, names known Einsums, is connected through tensors
   and is convex (no path leaves the group and re-enters it).
2. All recurrences of the group recur along one group rank: two iterative
   ranks cannot both be the outermost sequential loop.
3. No internal edge needs the whole iterative loop before its consumer's step:
   when a producer reduces, or its consumer reads at a pinned index or at two
   steps, a rank of the iterative loop (or of a rank it is a piece of) and the
   consumer iterates that loop too, the consumer would need every step first.
4. (Only with a capacity) the buffer need at tile 1 fits the capacity.

Legal but costly, and reported in the notes: a fused loop that an internal
consumer needs whole (its producer reduces it, or a pinned or crossed read) is
*untiled*: its whole extent in every tile (the RD "buffer the mismatched rank"
case); a producer that does not iterate an outer fused loop its consumer
iterates (an RSp broadcast, e.g. ``A[d,n]`` under ``l``) is held whole, or recomputed.

The loop order puts the iterative loop first, then the tiled fused loops by
first appearance in the cascade (outer pieces before inner ones; a re-tiled
rank is replaced by its pieces), then the untiled ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import sympy

from mambalaya.analysis.candidates import EinsumDag
from mambalaya.analysis.edges import Edge, classify_edges, tile_symbol
from mambalaya.analysis.kinds import iterative_rank
from mambalaya.analysis.matching import MERGE_KINDS, SAME_LOOP_KINDS, SPLIT_KINDS, Signature
from mambalaya.ir.cascade import Cascade

Node = tuple[str, str]  # (einsum, rank)
_ZERO = sympy.Integer(0)


@dataclass(frozen=True)
class BufferFactor:
    """One position of a buffered tensor: a fused loop's tile (plus halo) or a full extent."""

    tile: str | None  # the group rank whose tile this position follows; None: full extent
    full: sympy.Expr  # full extent, over params
    full_size: int
    halo: sympy.Expr = _ZERO
    halo_size: int = 0

    def expr(self) -> sympy.Expr:
        return self.full if self.tile is None else tile_symbol(self.tile) + self.halo

    def size(self, tiles: Mapping[str, int]) -> int:
        if self.tile is None:
            return self.full_size
        return min(tiles.get(self.tile, self.full_size), self.full_size) + self.halo_size


@dataclass(frozen=True)
class BufferTerm:
    """One on-chip buffer of a group: an internal tensor's tile, a recurrence state or partial sums."""

    tensor: str
    role: str  # "tile", "state" or "partial"
    factors: tuple[BufferFactor, ...]
    element_bytes: int

    def expr(self) -> sympy.Expr:
        return sympy.Mul(*(f.expr() for f in self.factors))

    def elems(self, tiles: Mapping[str, int]) -> int:
        n = 1
        for f in self.factors:
            n *= f.size(tiles)
        return n


@dataclass(frozen=True)
class GroupRank:
    """A loop of the fused nest: ranks of several Einsums that move together."""

    name: str
    members: tuple[Node, ...]
    size: int  # full extent (of its first member)
    tiled: bool
    iterative: bool


@dataclass(frozen=True)
class GroupSchedule:
    """How a group runs: loop order, untiled loops, notes and on-chip buffers."""

    loop_order: tuple[str, ...]  # fused loops, outer to inner (iterative first, untiled last)
    untiled: tuple[str, ...]  # fused loops that hold their whole extent per tile
    ranks: tuple[GroupRank, ...]
    notes: tuple[str, ...]  # re-tilings, held tiles, prefix sums walked in order
    terms: tuple[BufferTerm, ...]


@dataclass(frozen=True)
class CandidateGroup:
    """A candidate fusion group, legal or not, with why, its loop order and its buffer need.

    Legality is decided when the group is analysed; the schedule (loop order, buffers) is worked
    out on first use, so enumerating thousands of candidates only pays for what is asked.
    """

    einsums: tuple[str, ...]  # in cascade order
    legal: bool
    reasons: tuple[str, ...]  # why not legal (empty when legal)
    iterative: str | None  # the group rank of the recurrence(s): outermost, sequential
    internal: tuple[str, ...]  # tensors kept on chip
    reads: tuple[str, ...]  # off-chip tensors read (inputs, weights, other groups' outputs)
    writes: tuple[str, ...]  # off-chip tensors written (read outside the group, or outputs)
    _analyzer: GroupAnalyzer | None = field(default=None, repr=False, compare=False, hash=False)
    _model: _GroupModel | None = field(default=None, repr=False, compare=False, hash=False)

    @cached_property
    def schedule(self) -> GroupSchedule:
        if self._analyzer is None or not self.einsums or self.reasons and self._structural:
            return GroupSchedule((), (), (), (), ())
        model = self._model or self._analyzer.model(self.einsums)
        object.__setattr__(self, "_model", None)  # the loop model built for legality, used once
        return model.schedule()

    @property
    def _structural(self) -> bool:
        return any(r.startswith(("not connected", "not convex", "unknown", "empty")) for r in self.reasons)

    @property
    def loop_order(self) -> tuple[str, ...]:
        return self.schedule.loop_order

    @property
    def untiled(self) -> tuple[str, ...]:
        return self.schedule.untiled

    @property
    def notes(self) -> tuple[str, ...]:
        return self.schedule.notes

    @property
    def terms(self) -> tuple[BufferTerm, ...]:
        return self.schedule.terms

    @cached_property
    def buffer(self) -> sympy.Expr:
        """On-chip elements as a sympy expression in tile symbols ``T_<group rank>``."""
        return sympy.Add(*(t.expr() for t in self.terms))

    def buffer_elems(self, tiles: Mapping[str, int] | None = None) -> int:
        """Elements on chip with the given tiles (a fused loop not given: its full extent)."""
        return sum(t.elems(tiles or {}) for t in self.terms)

    def buffer_bytes(self, tiles: Mapping[str, int] | None = None) -> int:
        return sum(t.elems(tiles or {}) * t.element_bytes for t in self.terms)

    @cached_property
    def buffer_full_bytes(self) -> int:
        """Bytes on chip with every fused loop at full extent (nothing tiled)."""
        return self.buffer_bytes({})

    @cached_property
    def buffer_min_bytes(self) -> int:
        """Bytes on chip with every tiled fused loop at tile 1 (the least this group can need)."""
        return self.buffer_bytes({r.name: 1 for r in self.schedule.ranks if r.tiled})

    def to_dict(self) -> dict:
        return {
            "einsums": list(self.einsums),
            "legal": self.legal,
            "reasons": list(self.reasons),
            "iterative": self.iterative,
            "loop_order": list(self.loop_order),
            "untiled": list(self.untiled),
            "notes": list(self.notes),
            "internal": list(self.internal),
            "reads": list(self.reads),
            "writes": list(self.writes),
            "buffer": str(self.buffer),
            "buffer_full_bytes": self.buffer_full_bytes,
            "buffer_min_bytes": self.buffer_min_bytes,
        }


class _Loops:
    """Union-find over (einsum, rank) nodes that refuses to give one Einsum two ranks in one loop."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        self.parent: dict[Node, Node] = {n: n for n in nodes}
        self.owners: dict[Node, dict[str, str]] = {n: {n[0]: n[1]} for n in self.parent}

    @classmethod
    def of(cls, groups: Iterable[tuple[Node, ...]]) -> _Loops:
        """The loops of the nodes of ``groups`` (tuples of nodes), each node alone."""
        self = cls.__new__(cls)
        parent: dict[Node, Node] = {}
        owners: dict[Node, dict[str, str]] = {}
        for nodes in groups:
            for n in nodes:
                parent[n] = n
                owners[n] = {n[0]: n[1]}
        self.parent, self.owners = parent, owners
        return self

    def find(self, node: Node) -> Node:
        parent = self.parent
        root = node
        while parent[root] != root:
            root = parent[root]
        while parent[node] != root:
            parent[node], node = root, parent[node]
        return root

    def union(self, a: Node, b: Node) -> bool:
        parent = self.parent
        ra = parent[a]  # a root, or a child of one (find would change nothing): no call
        if parent[ra] != ra:
            ra = self.find(a)
        rb = parent[b]
        if parent[rb] != rb:
            rb = self.find(b)
        if ra == rb:
            return True
        oa, ob = self.owners[ra], self.owners[rb]
        if len(oa) < len(ob):
            ra, rb, oa, ob = rb, ra, ob, oa
        for e, r in ob.items():
            if oa.get(e, r) != r:
                return False
        self.parent[rb] = ra
        oa.update(ob)
        del self.owners[rb]
        return True


class GroupAnalyzer:
    """Analyses groups of one cascade; builds the per-edge and per-Einsum tables once."""

    def __init__(self, cascade: Cascade, edges: Iterable[Edge] | None = None,
                 capacity_bytes: int | None = None) -> None:
        self.cascade = cascade
        self.edges = tuple(edges) if edges is not None else classify_edges(cascade)
        self.capacity_bytes = capacity_bytes
        self.dag = EinsumDag(cascade)
        self.order = {n: i for i, n in enumerate(cascade.einsum_names)}
        self.into: dict[str, list[Edge]] = {n: [] for n in cascade.einsum_names}
        for e in self.edges:
            self.into[e.consumer].append(e)
        self.iter_rank = {e.name: iterative_rank(e) for e in cascade.einsums}
        self.ranks = {e.name: e.ranks for e in cascade.einsums}
        self.rank_pos = {e.name: {r: i for i, r in enumerate(e.ranks)} for e in cascade.einsums}
        self.out_ranks = {e.name: e.out_ranks for e in cascade.einsums}
        self.reduced = {e.name: e.reduced_ranks for e in cascade.einsums}
        self.full = {r: (cascade.rank_exprs[r], cascade.rank_size(r)) for r in cascade.rank_exprs}
        self.consumers = {t: tuple(cascade.consumers(t)) for t in cascade.tensors}
        self.einsum_reads = {e.name: tuple(e.reads) for e in cascade.einsums}
        self.nodes = {e.name: tuple((e.name, r) for r in e.ranks) for e in cascade.einsums}
        self.is_output = {t: cascade.tensors[t].role == "output" for t in cascade.tensors}
        self.element_bytes = {e.name: cascade.tensors[e.name].element_bytes for e in cascade.einsums}
        self.recurrence_pos = {e.name: None if e.recurrence is None else e.recurrence.position
                               for e in cascade.einsums}
        self._factors: dict[tuple, BufferFactor] = {}
        #: per edge: position -> the halos of its matches there (in match order)
        self.edge_halos: dict[int, dict[int, list]] = {}
        for e in self.edges:
            halos: dict[int, list] = {}
            for m in e.positions:
                if m.halo:
                    halos.setdefault(m.position, []).append(m.halo)
            self.edge_halos[id(e)] = halos
        self.unions: dict[int, list[tuple[Node, Node]]] = {}
        self.links: dict[int, list[tuple[Node, list[tuple[Node, Signature | None]]]]] = {}
        for e in self.edges:
            self.unions[id(e)], self.links[id(e)] = _edge_loops(e)

    def factor(self, rank: str, tile: str | None, halo) -> BufferFactor:
        """The (immutable, shared) buffer factor of a position of ``rank``: its full extent (``tile``
        None) or the tile of loop ``tile`` plus ``halo``'s window."""
        key = (rank, tile, None if halo is None else (halo.window, halo.size))
        got = self._factors.get(key)
        if got is None:
            full, full_size = self.full[rank]
            if tile is None:
                got = BufferFactor(None, full, full_size)
            elif halo is not None:
                got = BufferFactor(tile, full, full_size, halo.window, halo.size)
            else:
                got = BufferFactor(tile, full, full_size)
            self._factors[key] = got
        return got

    # ---- public ---------------------------------------------------------------
    def check(self, group: Iterable[str]) -> list[str]:
        """Why the group is not a legal fusion group (empty list: legal)."""
        return list(self.analyze(group).reasons)

    def analyze(self, group: Iterable[str]) -> CandidateGroup:
        names = list(dict.fromkeys(group))
        unknown = [n for n in names if n not in self.order]
        if not names or unknown:
            why = f"unknown Einsum(s) {', '.join(unknown)}" if unknown else "empty group"
            return CandidateGroup(tuple(names), False, (why,), None, (), (), (), self)
        names.sort(key=self.order.__getitem__)
        members = set(names)
        reads, writes, internal = self._boundary(names, members)
        structural = self._structure(names)
        if structural:
            return CandidateGroup(tuple(names), False, tuple(structural), None, internal, reads, writes, self)
        model = self.model(names)
        reasons, iterative = model.legality()
        cand = CandidateGroup(tuple(names), not reasons, tuple(reasons), iterative, internal, reads, writes, self,
                              model)
        cap = self.capacity_bytes
        if cap is not None and cand.legal and cand.buffer_min_bytes > cap:
            why = (f"needs {cand.buffer_min_bytes} bytes on chip even at tile 1, more than the capacity "
                   f"{cap} bytes",)
            cand = CandidateGroup(cand.einsums, False, why, iterative, internal, reads, writes, self)
        return cand

    def model(self, names: Iterable[str]) -> _GroupModel:
        names = sorted(dict.fromkeys(names), key=self.order.__getitem__)
        members = set(names)
        return _GroupModel(self, names, [e for n in names for e in self.into[n] if e.producer in members])

    # ---- structure and boundary -------------------------------------------------
    def _structure(self, names: list[str]) -> list[str]:
        dag = self.dag
        bits = dag.bits(names)
        reasons = []
        if not dag.connected(bits):
            parts = self._components(bits)
            reasons.append("not connected: " + " and ".join("{" + ", ".join(p) + "}" for p in parts)
                           + " share no tensor")
        between = dag.outside_between(bits)
        if between:
            w = dag.members(between)[0]
            wi = dag.index[w]
            src = dag.members(dag.anc[wi] & bits)[-1]
            dst = dag.members(dag.desc[wi] & bits)[0]
            reasons.append(f"not convex: the path {src} -> ... -> {w} -> ... -> {dst} leaves the group at {w} "
                           f"and re-enters it (add {w} or split the group)")
        return reasons

    def _components(self, bits: int) -> list[tuple[str, ...]]:
        dag = self.dag
        parts = []
        rest = bits
        while rest:
            seen = rest & -rest
            frontier = seen
            while frontier:
                grow = 0
                for i in range(len(dag.names)):
                    if frontier >> i & 1:
                        grow |= dag.nbr[i]
                frontier = grow & bits & ~seen
                seen |= frontier
            parts.append(dag.members(seen))
            rest &= ~seen
        return parts

    def _boundary(self, names: list[str], members: set[str]):
        er = self.einsum_reads
        reads = tuple(dict.fromkeys(t for n in names for t in er[n] if t not in members))
        writes, internal = [], []
        for n in names:
            consumers = self.consumers[n]
            if any(x in members for x in consumers):
                internal.append(n)
            if self.is_output[n] or not consumers or any(x not in members for x in consumers):
                writes.append(n)
        return reads, tuple(writes), tuple(internal)


def _edge_loops(e: Edge):
    """An edge's loop unions (same loop) and links (split / merge pieces), from its position matches."""
    unions: list[tuple[Node, Node]] = []
    links: list[tuple[Node, list[tuple[Node, Signature | None]]]] = []
    for m in e.positions:
        if not m.shared:
            continue
        pnode = (e.producer, m.producer_rank)
        if m.kind in SAME_LOOP_KINDS:
            unions.append((pnode, (e.consumer, m.shared[0])))
        elif m.kind in SPLIT_KINDS:
            links.append((pnode, [((e.consumer, r), s) for r, s in zip(m.shared, m.signatures, strict=True)]))
        elif m.kind in MERGE_KINDS:
            links.append(((e.consumer, m.shared[0]), [(pnode, m.signatures[0])]))
    return unions, links


def _closure(start: Node, graph: dict[Node, set[Node]]) -> set[Node]:
    out: set[Node] = set()
    todo = [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in out:
                out.add(nxt)
                todo.append(nxt)
    return out


class _GroupModel:
    """The loop model of one group (see the module docstring)."""

    def __init__(self, an: GroupAnalyzer, names: list[str], edges: list[Edge]) -> None:
        self.an = an
        self.names = names
        self.edges = edges
        nodes = an.nodes
        loops = _Loops.of(nodes[n] for n in names)
        self.conflicts: list[str] = []
        for e in edges:
            for a, b in an.unions[id(e)]:
                if not loops.union(a, b):
                    self.conflicts.append(f"{a[0]}.{a[1]} and {b[0]}.{b[1]} kept as separate loops")
        self.links = [link for e in edges for link in an.links[id(e)]]
        changed = bool(self.links)
        while changed:  # pieces of one loop with one signature are one loop
            changed = False
            first: dict[tuple[Node, Signature | None], Node] = {}
            for parent, children in self.links:
                root = loops.find(parent)
                for child, sig in children:
                    key = (root, sig)
                    if key not in first:
                        first[key] = child
                    elif loops.find(first[key]) != loops.find(child) and loops.union(first[key], child):
                        changed = True
        self.root = {node: loops.find(node) for node in loops.parent}
        self.members: dict[Node, list[Node]] = {}
        self.roots_of: dict[str, set[Node]] = {n: set() for n in names}
        for node, root in self.root.items():
            self.members.setdefault(root, []).append(node)
            self.roots_of[node[0]].add(root)
        self.parents: dict[Node, set[Node]] = {}
        self.children: dict[Node, set[Node]] = {}
        self.linked: set[Node] = set()
        for parent, kids in self.links:
            pr = self.root[parent]
            self.linked.add(pr)
            for child, _ in kids:
                cr = self.root[child]
                self.linked.add(cr)
                if cr != pr:
                    self.parents.setdefault(cr, set()).add(pr)
                    self.children.setdefault(pr, set()).add(cr)
        self.recs = [(n, an.iter_rank[n][0]) for n in names
                     if an.iter_rank[n] and an.iter_rank[n][1] == "recurrence"]
        iter_roots = list(dict.fromkeys(self.root[node] for node in self.recs))
        self.iter_roots = iter_roots
        self.iter_root = iter_roots[0] if len(iter_roots) == 1 else None
        self.family = {self.iter_root} | _closure(self.iter_root, self.parents) if self.iter_root else set()

    # ---- legality -----------------------------------------------------------
    def legality(self) -> tuple[list[str], str | None]:
        """Broken rules 2 and 3, and the name of the iterative group rank."""
        reasons: list[str] = []
        if len(self.iter_roots) > 1:
            which = ", ".join(f"{r} ({n})" for n, r in self.recs)
            reasons.append(f"two iterative ranks: {which} recur along different loops, and only one can be the "
                           f"outermost sequential loop")
        reasons += self._untiled_memo[0]
        name = None
        if self.iter_root is not None:
            name = self.loop_names()[self.iter_root]
        return list(dict.fromkeys(reasons)), name

    @cached_property
    def _untiled_memo(self) -> tuple[list[str], dict[Node, str]]:
        reasons, untiled = self._untiled()
        return list(reasons), dict(untiled)

    def _untiled(self) -> tuple[list[str], dict[Node, str]]:
        """Rule 3's breaches, and the fused loops an internal consumer needs whole (with why)."""
        reasons: list[str] = []
        untiled: dict[Node, str] = {}
        family, root = self.family, self.root
        for e in self.edges:
            cons_roots = self.roots_of[e.consumer]
            for p in e.needs_complete:
                r = root[(e.producer, p)]
                if r in family and not cons_roots.isdisjoint(family):
                    reasons.append(f"iterative rank {self._label()} cannot stay the outermost sequential loop: "
                                   f"{e.consumer} needs all of {p} from {e.producer} ({_how(e, p)}) before its "
                                   f"own step")
                elif r in cons_roots:
                    untiled.setdefault(r, f"{e.consumer} needs all of {e.producer}'s {p} ({_how(e, p)})")
            for m in e.positions:
                if m.kind not in SPLIT_KINDS:
                    continue
                for rk in m.crossed:
                    r = root[(e.consumer, rk)]
                    if r in family:
                        reasons.append(f"iterative rank {self._label()} cannot stay the outermost sequential "
                                       f"loop: {e.consumer} reads {e.tensor} at two steps ({' and '.join(m.indices)})")
                    else:
                        untiled.setdefault(r, f"{e.consumer} reads the piece {rk} of {e.producer}'s "
                                              f"{m.producer_rank} twice ({' and '.join(m.indices)})")
        return reasons, untiled

    def _name_clashes(self, names: dict[Node, str]) -> dict[Node, str]:
        """Fused loops a mapping could not tile unambiguously, with why.

        A mapping keys its tiles by rank name and the executors and the cost model apply a tile to
        every Einsum rank of that name; so a loop is tileable only when every rank of its name in
        the group belongs to it (a diagonal read such as ``T0[i,i,i]`` can put ``T0``'s ``j`` in the
        loop of ``T1``'s ``i`` while ``T1`` has a ``j`` of its own).
        """
        an = self.an
        root = self.root
        out: dict[Node, str] = {}
        for r, name in names.items():
            if r == self.iter_root:
                continue  # the iterative loop stays first and sequential (rule 2 and 3 govern it)
            base = name.rstrip("'")
            stray = sorted(e for e in self.names if base in an.rank_pos[e] and root[(e, base)] != r)
            if stray:
                out[r] = (f"{', '.join(stray)} also has a rank {base} outside this loop: a tile keyed by name "
                          f"is ambiguous")
        return out

    def _label(self) -> str:
        for n, r in self.recs:
            if self.root[(n, r)] == self.iter_root:
                return f"{r} of {n}"
        return "?"

    # ---- loops ------------------------------------------------------------
    @cached_property
    def fused(self) -> list[Node]:
        single = len(self.names) == 1
        linked, it = self.linked, self.iter_root
        # members are in cascade order: two Einsums or more iff the first and last differ
        return [r for r, ms in self.members.items()
                if single or ms[0][0] != ms[-1][0] or r in linked or r == it]

    @cached_property
    def first(self) -> dict[Node, tuple[int, int]]:
        an = self.an
        out = {}
        for r, ms in self.members.items():
            n, rk = ms[0]  # members are listed in (cascade order, rank position) order: the first is the least
            out[r] = (an.order[n], an.rank_pos[n][rk])
        return out

    def _first_member(self, root: Node) -> Node:
        return self.members[root][0]  # members are in (cascade order, rank position) order

    def loop_names(self) -> dict[Node, str]:
        """A rank name per fused loop: its first member's, primed when two loops would share one."""
        return dict(self._loop_names)

    @cached_property
    def _loop_names(self) -> dict[Node, str]:
        names: dict[Node, str] = {}
        used: set[str] = set()
        for r in sorted(self.fused, key=self.first.__getitem__):
            name = self._first_member(r)[1]
            while name in used:
                name += "'"
            used.add(name)
            names[r] = name
        return names

    # ---- schedule -----------------------------------------------------------
    def schedule(self) -> GroupSchedule:
        an = self.an
        names = self.loop_names()
        fused = self.fused
        untiled = {r: why for r, why in self._untiled_memo[1].items() if r in names}
        untiled.update({r: why for r, why in self._name_clashes(names).items() if r not in untiled})
        inner_piece = {self.root[child] for _, kids in self.links for child, sig in kids
                       if sig is not None and sig[2] is not None}
        replaced = {self.root[parent] for parent, kids in self.links if len({s for _, s in kids}) > 1}
        iter_root = self.iter_root
        tiled = [r for r in fused if r not in untiled]
        order = sorted(tiled, key=lambda r: (r != iter_root, r in inner_piece, self.first[r]))
        order = [r for r in order if r not in replaced or r == iter_root]
        order += sorted((r for r in fused if r in untiled and r != iter_root), key=self.first.__getitem__)
        pos = {r: i for i, r in enumerate(order)}
        for parent in replaced:  # a re-tiled rank sits where its outermost piece does
            pieces = [pos[k] for k in _closure(parent, self.children) if k in pos]
            if pieces and parent not in pos:
                pos[parent] = min(pieces)

        notes: list[str] = []
        for parent, kids in self.links:
            pr = self.root[parent]
            if pr in replaced and len(kids) > 1:
                note = f"{names[pr]} re-tiled as {' and '.join(names[self.root[k]] for k, _ in kids)}"
                if note not in notes:
                    notes.append(note)
        for r in sorted(untiled, key=self.first.__getitem__):
            notes.append(f"{names[r]} untiled: {untiled[r]}")
        for n in self.names:
            it = an.iter_rank[n]
            if it and it[1] == "prefix_sum":
                notes.append(f"{names.get(self.root[(n, it[0])], it[0])} walked in order ({n} is a prefix sum)")
        notes += self.conflicts

        einsums_of: dict[Node, set[str]] = {}
        for n, roots in self.roots_of.items():
            for x in roots:
                einsums_of.setdefault(x, set()).add(n)
        iterating: dict[Node, set[str]] = {}
        linked = self.parents or self.children
        for r in order:
            if linked and (r in self.parents or r in self.children):
                rel = {r} | _closure(r, self.parents) | _closure(r, self.children)
                it: set[str] = set()
                for x in rel:
                    it |= einsums_of.get(x, set())
                iterating[r] = it
            else:
                iterating[r] = einsums_of.get(r, set())

        terms = self._terms(set(tiled), names, pos, order, iterating, notes)
        ranks = tuple(GroupRank(names[r], tuple(sorted(self.members[r], key=lambda nd: (an.order[nd[0]], nd[1]))),
                                an.full[self._first_member(r)[1]][1], r not in untiled, r == iter_root)
                      for r in order)
        return GroupSchedule(tuple(names[r] for r in order), tuple(names[r] for r in order if r in untiled), ranks,
                             tuple(notes), terms)

    def _factor(self, einsum: str, rank: str, tiled: set[Node], names, pos, hold_from: int,
                halo=None) -> BufferFactor:
        """One position: the tile of its fused loop, or its full extent (private, untiled or held)."""
        root = self.root[(einsum, rank)]
        if root not in tiled or pos.get(root, len(pos)) > hold_from:
            return self.an.factor(rank, None, None)
        return self.an.factor(rank, names[root], halo)

    def _terms(self, tiled: set[Node], names, pos, order, iterating: dict[Node, set[str]],
               notes: list[str]) -> tuple[BufferTerm, ...]:
        an = self.an
        root = self.root
        factor = an.factor
        npos = len(pos)
        norder = len(order)
        terms: list[BufferTerm] = []
        by_producer: dict[str, list[Edge]] = {}
        for e in self.edges:
            by_producer.setdefault(e.producer, []).append(e)
        for n in self.names:
            out_ranks = an.out_ranks[n]
            nbytes = an.element_bytes[n]
            out_edges = by_producer.get(n)
            # the first loop n does not iterate but a consumer does: n's tile is held across it
            hold_from = norder
            if out_edges:
                consumers = [e.consumer for e in out_edges]
                for i, outer in enumerate(order):
                    it = iterating[outer]  # the Einsums iterating loop `outer`
                    if n not in it and not it.isdisjoint(consumers):
                        hold_from = i
                        break
                factors = []
                held = []
                for j, rank in enumerate(out_ranks):
                    r = root[(n, rank)]
                    if r not in tiled:
                        factors.append(factor(rank, None, None))
                        continue
                    if pos.get(r, npos) > hold_from:
                        factors.append(factor(rank, None, None))
                        held.append(rank)
                        continue
                    halo = None
                    for e in out_edges:
                        for h in an.edge_halos[id(e)].get(j, ()):
                            if halo is None or h.size > halo.size:
                                halo = h
                    factors.append(factor(rank, names[r], halo))
                if held:
                    notes.append(f"{n} held whole along {', '.join(held)} while the outer loop "
                                 f"{names[order[hold_from]]} sweeps (or recompute {n})")
                terms.append(BufferTerm(n, "tile", tuple(factors), nbytes))
            rec = an.recurrence_pos[n]
            if rec is not None:
                factors = []
                for j, rank in enumerate(out_ranks):
                    if j == rec:
                        continue
                    r = root[(n, rank)]
                    if r not in tiled or pos.get(r, npos) > norder:
                        factors.append(factor(rank, None, None))
                    else:
                        factors.append(factor(rank, names[r], None))
                terms.append(BufferTerm(n, "state", tuple(factors), nbytes))
            if not out_edges and any(root[(n, r)] in tiled for r in an.reduced[n]):
                factors = [self._factor(n, r, tiled, names, pos, norder) for r in out_ranks]
                terms.append(BufferTerm(n, "partial", tuple(factors), nbytes))
        return tuple(terms)


def _how(e: Edge, p: str) -> str:
    """Why a consumer needs a producer rank whole, in words."""
    for m in e.positions:
        if m.producer_rank == p and m.pinned:
            return f"reads {e.tensor} at {p} = {', '.join(m.pinned)}"
        if m.producer_rank == p and m.cross:
            return f"reads {e.tensor} as {' and '.join(m.indices)}"
    if p not in {m.producer_rank for m in e.positions}:
        return f"{e.producer} reduces {p}"
    return f"reads all of {p} of {e.tensor}"


def check_group(cascade: Cascade, group: Iterable[str], edges: Iterable[Edge] | None = None) -> list[str]:
    """Why ``group`` (Einsum names) is not a legal fusion group; an empty list when it is legal."""
    return GroupAnalyzer(cascade, edges).check(group)


def analyze_group(cascade: Cascade, group: Iterable[str], edges: Iterable[Edge] | None = None) -> CandidateGroup:
    """The full analysis of one group: legality, loop order, buffer need, off-chip tensors."""
    return GroupAnalyzer(cascade, edges).analyze(group)
