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

Speed (a mapper analyses thousands of groups, each one Einsum larger than one
before): the union-find runs over integer node ids and starts from the loops of
the group one Einsum smaller when no union was refused (:meth:`_GroupModel._edge_loops`),
convexity likewise (:meth:`GroupAnalyzer._structure`), per-edge rule-3 words and
buffer factors and terms are built once and shared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

import sympy

from mambalaya.analysis.candidates import EinsumDag
from mambalaya.analysis.edges import Edge, classify_edges, tile_symbol
from mambalaya.analysis.kinds import iterative_rank
from mambalaya.analysis.matching import MERGE_KINDS, SAME_LOOP_KINDS, SPLIT_KINDS, PositionMatch, Signature
from mambalaya.ir.cascade import Cascade

Node = tuple[str, str]  # (einsum, rank)


class _lazy:  # noqa: N801  (a decorator, named like the property it replaces)
    """``functools.cached_property`` without its lock (Python 3.11 takes it on every first access,
    which thousands of group analyses feel); computed once, then a plain instance attribute."""

    def __init__(self, fn: Callable) -> None:
        self.fn, self.name = fn, fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, owner: type | None = None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value
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

    @_lazy
    def compiled(self) -> tuple[int, tuple[tuple[str, int, int], ...]]:
        """(bytes of the full-extent positions, (tile rank, full size, halo size) of the tiled ones):
        the term is ``bytes * prod(min(tile, full) + halo)``."""
        const, var = self.element_bytes, []
        for f in self.factors:
            if f.tile is None:
                const *= f.full_size
            else:
                var.append((f.tile, f.full_size, f.halo_size))
        return const, tuple(var)


@dataclass(frozen=True)
class GroupRank:
    """A loop of the fused nest: ranks of several Einsums that move together."""

    name: str
    members: tuple[Node, ...]
    size: int  # full extent (of its first member)
    tiled: bool
    iterative: bool


@dataclass(frozen=True)
class Binding:
    """How one rank of one member follows the group's loops: its loop's name (``loop``; None for a
    private loop), and, for the parent of split pieces (``l`` read as ``c*chunk+q``), each piece's loop
    with its signature ``(offset, divisor, modulus)``: the piece is ``((x - offset) // divisor) % modulus``."""

    loop: str | None
    pieces: tuple[tuple[str, Signature], ...] = ()


@dataclass(frozen=True)
class LoopModel:
    """How a group's loops fit together: loop order, untiled loops, notes, the analysis's buffer terms, and
    how every member rank follows the loops (what the schedule stage lowers from)."""

    loop_order: tuple[str, ...]  # fused loops, outer to inner (iterative first, untiled last)
    untiled: tuple[str, ...]  # fused loops that hold their whole extent per tile
    ranks: tuple[GroupRank, ...]
    notes: tuple[str, ...]  # re-tilings, held tiles, prefix sums walked in order
    terms: tuple[BufferTerm, ...]
    bindings: Mapping[Node, Binding]  # (einsum, rank) -> its loop, or the loops of its pieces

    def renamed(self, names: Mapping[str, str]) -> LoopModel:
        """The same model with Einsums and tensors renamed (a chained layer's copy of a one-layer group)."""
        def node(n: Node) -> Node:
            return names.get(n[0], n[0]), n[1]

        return replace(self, ranks=tuple(replace(r, members=tuple(node(m) for m in r.members)) for r in self.ranks),
                       terms=tuple(replace(t, tensor=names.get(t.tensor, t.tensor)) for t in self.terms),
                       bindings={node(k): b for k, b in self.bindings.items()})


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
    #: what makes it illegal: "structure" (not a connected convex set of known Einsums), "legality" (its loops),
    #: "capacity" (its least buffer over the capacity the analysis was given); "" when legal
    fault: str = ""

    @_lazy
    def loops(self) -> LoopModel:
        if self._analyzer is None or not self.einsums or self.fault == "structure":
            return LoopModel((), (), (), (), (), {})
        model = self._model or self._analyzer.model(self.einsums)
        object.__setattr__(self, "_model", None)  # the loop model built for legality, used once
        return model.loop_model()

    @property
    def loop_order(self) -> tuple[str, ...]:
        return self.loops.loop_order

    @property
    def untiled(self) -> tuple[str, ...]:
        return self.loops.untiled

    @property
    def notes(self) -> tuple[str, ...]:
        return self.loops.notes

    @property
    def terms(self) -> tuple[BufferTerm, ...]:
        return self.loops.terms

    @_lazy
    def buffer(self) -> sympy.Expr:
        """On-chip elements as a sympy expression in tile symbols ``T_<group rank>``."""
        return sympy.Add(*(t.expr() for t in self.terms))

    def buffer_elems(self, tiles: Mapping[str, int] | None = None) -> int:
        """Elements on chip with the given tiles (a fused loop not given: its full extent)."""
        return sum(t.elems(tiles or {}) for t in self.terms)

    def buffer_bytes(self, tiles: Mapping[str, int] | None = None) -> int:
        return sum(t.elems(tiles or {}) * t.element_bytes for t in self.terms)

    @_lazy
    def buffer_full_bytes(self) -> int:
        """Bytes on chip with every fused loop at full extent (nothing tiled)."""
        return self.buffer_bytes({})

    @_lazy
    def buffer_min_bytes(self) -> int:
        """Bytes on chip with every tiled fused loop at tile 1 (the least this group can need)."""
        return self.buffer_bytes({r.name: 1 for r in self.loops.ranks if r.tiled})

    def buffer_min_exceeds(self, limit: int) -> int | None:
        """A lower bound on :attr:`buffer_min_bytes` above ``limit`` when the loop model alone shows one
        (before the loop model is worked out: cheap rejection of groups that cannot fit), else None."""
        if self._model is None or "loops" in self.__dict__:
            return None
        bound = self._model.least_bound(limit)
        return bound if bound > limit else None

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
    """Union-find over the integer ids of (einsum, rank) nodes that refuses to give one Einsum two
    ranks in one loop: ``mask[root]`` is its loop's Einsums as bits, and loops sharing one never merge."""

    __slots__ = ("parent", "mask")

    def __init__(self, parent: list[int], mask: list[int]) -> None:
        self.parent, self.mask = parent, mask

    def copy(self) -> _Loops:
        return _Loops(self.parent.copy(), self.mask.copy())

    def find(self, i: int) -> int:
        parent = self.parent
        r = i
        while parent[r] != r:
            r = parent[r]
        while parent[i] != r:
            parent[i], i = r, parent[i]
        return r

    def union(self, a: int, b: int) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return True
        mask = self.mask
        ma, mb = mask[ra], mask[rb]
        if ma & mb:
            return False
        if ma.bit_count() < mb.bit_count():  # the larger loop's root stays the root
            ra, rb = rb, ra
        self.parent[rb] = ra
        mask[ra] = ma | mb
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
        self.out_of: dict[str, list[Edge]] = {n: [] for n in cascade.einsum_names}
        for e in self.edges:
            self.into[e.consumer].append(e)
            self.out_of[e.producer].append(e)
        #: group (Einsums as bits) -> its loops after its edges' unions, when none was refused (see
        #: _GroupModel._edge_loops)
        self.unions_done: dict[int, _Loops] = {}
        #: connected convex groups (as bits) -> their (descendants, ancestors), to check one Einsum more
        self._convex: dict[int, tuple[int, int]] = {}
        self.iter_rank = {e.name: iterative_rank(e) for e in cascade.einsums}
        self.prefix_sums = {n for n, it in self.iter_rank.items() if it and it[1] == "prefix_sum"}
        self.ranks = {e.name: e.ranks for e in cascade.einsums}
        self.rank_pos = {e.name: {r: i for i, r in enumerate(e.ranks)} for e in cascade.einsums}
        self.rank_bits: dict[str, int] = {}  # rank name -> the Einsums that have a rank of that name
        for e in cascade.einsums:
            for r in e.ranks:
                self.rank_bits[r] = self.rank_bits.get(r, 0) | 1 << self.order[e.name]
        self.out_ranks = {e.name: e.out_ranks for e in cascade.einsums}
        self.reduced = {e.name: e.reduced_ranks for e in cascade.einsums}
        self.full = {r: (cascade.rank_exprs[r], cascade.rank_size(r)) for r in cascade.rank_exprs}
        self.consumers = {t: tuple(cascade.consumers(t)) for t in cascade.tensors}
        self.consumer_bits = {n: sum(1 << self.order[c] for c in set(self.consumers[n])) for n in cascade.einsum_names}
        self.einsum_reads = {e.name: tuple(e.reads) for e in cascade.einsums}
        self.nodes = {e.name: tuple((e.name, r) for r in e.ranks) for e in cascade.einsums}
        self.is_output = {t: cascade.tensors[t].role == "output" for t in cascade.tensors}
        self.element_bytes = {e.name: cascade.tensors[e.name].element_bytes for e in cascade.einsums}
        self.recurrence_pos = {e.name: None if e.recurrence is None else e.recurrence.position
                               for e in cascade.einsums}
        self._factors: dict[tuple, BufferFactor] = {}
        self._terms: dict[tuple, BufferTerm] = {}
        #: per edge: position -> the halos of its matches there (in match order)
        self.edge_halos: dict[int, dict[int, list]] = {}
        for e in self.edges:
            halos: dict[int, list] = {}
            for m in e.positions:
                if m.halo:
                    halos.setdefault(m.position, []).append(m.halo)
            self.edge_halos[id(e)] = halos
        #: integer ids of the (einsum, rank) nodes: each group's loop model is a union-find over them
        self.node_list: list[Node] = [nd for e in cascade.einsums for nd in self.nodes[e.name]]
        node_id = {nd: i for i, nd in enumerate(self.node_list)}
        self.node_bit = [1 << self.order[nd[0]] for nd in self.node_list]  # its Einsum, as a bit
        self.node_ids = {n: tuple(node_id[nd] for nd in self.nodes[n]) for n in self.nodes}
        #: per Einsum, the positions of its output ranks among its ranks
        self.out_pos = {e.name: tuple(e.ranks.index(r) for r in e.out_ranks) for e in cascade.einsums}
        self.out_sizes = {e.name: tuple((e.ranks.index(r), self.full[r][1]) for r in e.out_ranks)
                          for e in cascade.einsums}
        self.union_ids: dict[int, list[tuple[int, int]]] = {}
        self.link_ids: dict[int, list[tuple[int, list[tuple[int, Signature | None]]]]] = {}
        self.unions: dict[int, list[tuple[Node, Node]]] = {}
        self.links: dict[int, list[tuple[Node, list[tuple[Node, Signature | None]]]]] = {}
        #: per edge: (producer node, why) of the ranks its consumer needs whole, and (consumer node, why,
        #: match) of the split pieces it reads twice (rule 3; the words are the group's notes)
        self.needs: dict[int, tuple[tuple[Node, str], ...]] = {}
        self.crossed: dict[int, tuple[tuple[Node, str, PositionMatch], ...]] = {}
        for e in self.edges:
            self.unions[id(e)], self.links[id(e)] = _edge_loops(e)
            self.union_ids[id(e)] = [(node_id[a], node_id[b]) for a, b in self.unions[id(e)]]
            self.link_ids[id(e)] = [(node_id[p], [(node_id[c], sig) for c, sig in kids]) for p, kids in self.links[id(e)]]
            self.needs[id(e)] = tuple(((e.producer, p), f"{e.consumer} needs all of {e.producer}'s {p} ({_how(e, p)})")
                                      for p in e.needs_complete)
            self.crossed[id(e)] = tuple(
                ((e.consumer, rk), f"{e.consumer} reads the piece {rk} of {e.producer}'s {m.producer_rank} twice "
                                   f"({' and '.join(m.indices)})", m)
                for m in e.positions if m.kind in SPLIT_KINDS for rk in m.crossed)

    def term(self, tensor: str, role: str, factors: tuple[BufferFactor, ...], element_bytes: int) -> BufferTerm:
        """The (immutable, shared) buffer term of these factors: groups repeat the same terms."""
        key = (tensor, role, *map(id, factors))  # factors are the shared objects of :meth:`factor`
        got = self._terms.get(key)
        if got is None:
            got = self._terms[key] = BufferTerm(tensor, role, factors, element_bytes)
        return got

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

    def analyze(self, group: Iterable[str], convex: bool = True) -> CandidateGroup:
        """The group's analysis; ``convex=False`` leaves out the convexity rule (a group that recomputes a
        producer: the path through the producer's other readers runs in other groups)."""
        names = list(dict.fromkeys(group))
        unknown = [n for n in names if n not in self.order]
        if not names or unknown:
            why = f"unknown Einsum(s) {', '.join(unknown)}" if unknown else "empty group"
            return CandidateGroup(tuple(names), False, (why,), None, (), (), (), self, fault="structure")
        names.sort(key=self.order.__getitem__)
        members = set(names)
        reads, writes, internal = self._boundary(names, members)
        structural = [why for rule, why in self._structure(names) if convex or rule != "convex"]
        if structural:
            return CandidateGroup(tuple(names), False, tuple(structural), None, internal, reads, writes, self,
                                  fault="structure")
        model = self.model(names)
        reasons, iterative = model.legality()
        cand = CandidateGroup(tuple(names), not reasons, tuple(reasons), iterative, internal, reads, writes, self,
                              model, fault="legality" if reasons else "")
        cap = self.capacity_bytes
        if cap is not None and cand.legal and cand.buffer_min_bytes > cap:
            why = (f"needs {cand.buffer_min_bytes} bytes on chip even at tile 1, more than the capacity "
                   f"{cap} bytes",)
            cand = CandidateGroup(cand.einsums, False, why, iterative, internal, reads, writes, self, fault="capacity")
        return cand

    def model(self, names: Iterable[str]) -> _GroupModel:
        names = sorted(dict.fromkeys(names), key=self.order.__getitem__)
        members = set(names)
        return _GroupModel(self, names, [e for n in names for e in self.into[n] if e.producer in members])

    # ---- structure and boundary -------------------------------------------------
    def _structure(self, names: list[str]) -> list[tuple[str, str]]:
        """The structural rules the group breaks, as (rule: ``connected`` or ``convex``, why)."""
        dag = self.dag
        bits = dag.bits(names)
        for n in reversed(names):  # a connected convex group plus a neighbour: only convexity to check
            i = dag.index[n]
            known = self._convex.get(bits ^ (1 << i))
            if known is not None and dag.nbr[i] & bits:
                desc, anc = known[0] | dag.desc[i], known[1] | dag.anc[i]
                if not desc & anc & ~bits:
                    self._convex[bits] = (desc, anc)
                    return []
                break
        reasons = []
        if not dag.connected(bits):
            parts = self._components(bits)
            reasons.append(("connected", "not connected: " + " and ".join("{" + ", ".join(p) + "}" for p in parts)
                            + " share no tensor"))
        between = dag.outside_between(bits)
        if between:
            w = dag.members(between)[0]
            wi = dag.index[w]
            src = dag.members(dag.anc[wi] & bits)[-1]
            dst = dag.members(dag.desc[wi] & bits)[0]
            reasons.append(("convex", f"not convex: the path {src} -> ... -> {w} -> ... -> {dst} leaves the group "
                                      f"at {w} and re-enters it (add {w} or split the group)"))
        if not reasons:
            self._convex[bits] = (dag.descendants(bits), dag.ancestors(bits))
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
        bits = 0
        for n in names:
            bits |= 1 << self.order[n]
        writes, internal = [], []
        for n in names:
            consumers = self.consumer_bits[n]  # the Einsums reading n, as bits
            if consumers & bits:
                internal.append(n)
            if self.is_output[n] or not consumers or consumers & ~bits:
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
        loops, self.conflicts = self._edge_loops()
        find, union = loops.find, loops.union
        self.links = [link for e in edges for link in an.links[id(e)]]
        links = [link for e in edges for link in an.link_ids[id(e)]]
        changed = bool(links)
        while changed:  # pieces of one loop with one signature are one loop
            changed = False
            first: dict[tuple[int, Signature | None], int] = {}
            for p, children in links:
                r = find(p)
                for child, sig in children:
                    key = (r, sig)
                    f = first.get(key)
                    if f is None:
                        first[key] = child
                    elif find(f) != find(child) and union(f, child):
                        changed = True
        parent, mask, node_list = loops.parent, loops.mask, an.node_list
        self.root = root = {}
        self.members: dict[Node, list[Node]] = {}
        members = self.members
        #: per Einsum, the loop of each of its ranks (in rank order); per loop, its Einsums as bits
        self.loops_of: dict[str, list[Node]] = {}
        self.loop_bits: dict[Node, int] = {}
        for n in names:  # nodes in (cascade order, rank position) order
            self.loops_of[n] = mine = []
            for i in an.node_ids[n]:
                ri = parent[i]
                if parent[ri] != ri:
                    ri = find(i)
                node, r = node_list[i], node_list[ri]
                root[node] = r
                mine.append(r)
                got = members.get(r)
                if got is None:
                    members[r] = [node]
                    self.loop_bits[r] = mask[ri]
                else:
                    got.append(node)
        self.parents: dict[Node, set[Node]] = {}
        self.children: dict[Node, set[Node]] = {}
        self.linked: set[Node] = set()
        for par, kids in self.links:
            pr = self.root[par]
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

    def _edge_loops(self) -> tuple[_Loops, list[str]]:
        """The loops the group's edges make (same loop kinds), and the unions refused, in words.

        Without a refusal the loops are the connected components whatever the order of the unions,
        so a group one Einsum larger than an analysed one (the enumeration grows groups so) starts
        from that one's loops and adds its new edges; a refusal makes the order matter: from scratch,
        in cascade order.
        """
        an, names = self.an, self.names
        inside = set(names)
        bits = 0
        for n in names:
            bits |= 1 << an.order[n]
        for x in reversed(names):
            done = an.unions_done.get(bits ^ (1 << an.order[x]))
            if done is not None:
                loops = done.copy()
                new = [e for e in an.into[x] if e.producer in inside]
                new += [e for e in an.out_of[x] if e.consumer in inside and e.consumer != x]
                if all(loops.union(a, b) for e in new for a, b in an.union_ids[id(e)]):
                    an.unions_done[bits] = loops.copy()
                    return loops, []
                break
        node_list = an.node_list
        loops, refused = _Loops(list(range(len(node_list))), an.node_bit.copy()), []
        for e in self.edges:
            for a, b in an.union_ids[id(e)]:
                if not loops.union(a, b):
                    (a0, a1), (b0, b1) = node_list[a], node_list[b]
                    refused.append(f"{a0}.{a1} and {b0}.{b1} kept as separate loops")
        if not refused:
            an.unions_done[bits] = loops.copy()
        return loops, refused

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

    @_lazy
    def _untiled_memo(self) -> tuple[list[str], dict[Node, str]]:
        reasons, untiled = self._untiled()
        return list(reasons), dict(untiled)

    def _untiled(self) -> tuple[list[str], dict[Node, str]]:
        """Rule 3's breaches, and the fused loops an internal consumer needs whole (with why)."""
        reasons: list[str] = []
        untiled: dict[Node, str] = {}
        family, root, an = self.family, self.root, self.an
        for e in self.edges:
            needs, crossed = an.needs[id(e)], an.crossed[id(e)]
            if not needs and not crossed:
                continue
            cons_roots = set(self.loops_of[e.consumer])  # the consumer's loops
            for node, why in needs:
                r = root[node]
                if r in family and not cons_roots.isdisjoint(family):
                    p = node[1]
                    reasons.append(f"iterative rank {self._label()} cannot stay the outermost sequential loop: "
                                   f"{e.consumer} needs all of {p} from {e.producer} ({_how(e, p)}) before its "
                                   f"own step")
                elif r in cons_roots and r not in untiled:
                    untiled[r] = why
            for node, why, m in crossed:
                r = root[node]
                if r in family:
                    reasons.append(f"iterative rank {self._label()} cannot stay the outermost sequential "
                                   f"loop: {e.consumer} reads {e.tensor} at two steps ({' and '.join(m.indices)})")
                elif r not in untiled:
                    untiled[r] = why
        return reasons, untiled

    @_lazy
    def _clashes(self) -> dict[Node, str]:
        return self._name_clashes(self._loop_names)

    def _name_clashes(self, names: dict[Node, str]) -> dict[Node, str]:
        """Fused loops a mapping could not tile unambiguously, with why.

        A mapping keys its tiles by rank name and the executors and the cost model apply a tile to
        every Einsum rank of that name; so a loop is tileable only when every rank of its name in
        the group belongs to it (a diagonal read such as ``T0[i,i,i]`` can put ``T0``'s ``j`` in the
        loop of ``T1``'s ``i`` while ``T1`` has a ``j`` of its own).
        """
        an, members = self.an, self.members
        bits = 0
        for n in self.names:
            bits |= 1 << an.order[n]
        out: dict[Node, str] = {}
        for r, name in names.items():
            if r == self.iter_root:
                continue  # the iterative loop stays first and sequential (rule 2 and 3 govern it)
            base = name.rstrip("'")
            inside = 0  # the Einsums whose rank `base` is this loop's (a loop has one rank per Einsum)
            for e, rk in members[r]:
                if rk == base:
                    inside |= 1 << an.order[e]
            if an.rank_bits.get(base, 0) & bits != inside:
                stray = sorted(e for e in self.names if base in an.rank_pos[e] and self.root[(e, base)] != r)
                out[r] = (f"{', '.join(stray)} also has a rank {base} outside this loop: a tile keyed by name "
                          f"is ambiguous")
        return out

    def _label(self) -> str:
        for n, r in self.recs:
            if self.root[(n, r)] == self.iter_root:
                return f"{r} of {n}"
        return "?"

    # ---- loops ------------------------------------------------------------
    @_lazy
    def fused(self) -> list[Node]:
        single = len(self.names) == 1
        linked, it = self.linked, self.iter_root
        # members are in cascade order: two Einsums or more iff the first and last differ
        return [r for r, ms in self.members.items()
                if single or ms[0][0] != ms[-1][0] or r in linked or r == it]

    @_lazy
    def first(self) -> dict[Node, tuple[int, int]]:
        an = self.an
        out = {}
        for r, ms in self.members.items():
            n, rk = ms[0]  # members are listed in (cascade order, rank position) order: the first is the least
            out[r] = (an.order[n], an.rank_pos[n][rk])
        return out

    def loop_names(self) -> dict[Node, str]:
        """A rank name per fused loop: its first member's, primed when two loops would share one."""
        return dict(self._loop_names)

    @_lazy
    def _loop_names(self) -> dict[Node, str]:
        names: dict[Node, str] = {}
        used: set[str] = set()
        for r in self.fused:  # already by first member (members are listed in the order first seen)
            name = self.members[r][0][1]
            while name in used:
                name += "'"
            used.add(name)
            names[r] = name
        return names

    def least_bound(self, limit: int | None = None) -> int:
        """A lower bound on the buffer need at tile 1 (see :meth:`loop_model` and :meth:`_terms`): every
        tile and state term, each position full unless its loop may be tiled (fused, not untiled by
        rule 3 or a name clash, not re-tiled into pieces, whose tiles replace its own); holds, halos and
        partial sums, which only add, are left out. Stops once past ``limit`` (still a lower bound)."""
        an, links, root = self.an, self.links, self.root
        untiled, clashes = self._untiled_memo[1], self._clashes
        replaced = {root[p] for p, kids in links if len({s for _, s in kids}) > 1} if links else ()
        it = self.iter_root
        small = {r for r in self.fused if r not in untiled and r not in clashes and (r not in replaced or r == it)}
        producers = {e.producer for e in self.edges}
        total = 0
        for n in self.names:
            rec = an.recurrence_pos[n]
            if rec is None and n not in producers:
                continue
            loops, tile, state = self.loops_of[n], an.element_bytes[n], an.element_bytes[n]
            for j, (i, size) in enumerate(an.out_sizes[n]):
                if loops[i] not in small:
                    tile *= size
                    if j != rec:
                        state *= size
            total += (tile if n in producers else 0) + (state if rec is not None else 0)
            if limit is not None and total > limit:
                break
        return total

    # ---- loop model ---------------------------------------------------------
    def loop_model(self) -> LoopModel:
        an = self.an
        names = self._loop_names
        fused, root, links = self.fused, self.root, self.links
        untiled = {r: why for r, why in self._untiled_memo[1].items() if r in names}
        untiled.update({r: why for r, why in self._clashes.items() if r not in untiled})
        inner_piece = {root[child] for _, kids in links for child, sig in kids
                       if sig is not None and sig[2] is not None} if links else set()
        replaced = {root[parent] for parent, kids in links if len({s for _, s in kids}) > 1} if links else set()
        iter_root = self.iter_root
        tiled = [r for r in fused if r not in untiled]
        # tiled is by first member: iterative loop first, then outer pieces, then inner ones (a stable sort)
        order = [r for r in tiled if r == iter_root]
        order += [r for r in tiled if r != iter_root and r not in inner_piece]
        order += [r for r in tiled if r != iter_root and r in inner_piece]
        if replaced:
            order = [r for r in order if r not in replaced or r == iter_root]
        if untiled:
            order += [r for r in fused if r in untiled and r != iter_root]
        pos = {r: i for i, r in enumerate(order)}
        for parent in replaced:  # a re-tiled rank sits where its outermost piece does
            pieces = [pos[k] for k in _closure(parent, self.children) if k in pos]
            if pieces and parent not in pos:
                pos[parent] = min(pieces)

        notes: list[str] = []
        for parent, kids in self.links:
            pr = root[parent]
            if pr in replaced and len(kids) > 1:
                note = f"{names[pr]} re-tiled as {' and '.join(names[root[k]] for k, _ in kids)}"
                if note not in notes:
                    notes.append(note)
        for r in sorted(untiled, key=self.first.__getitem__):
            notes.append(f"{names[r]} untiled: {untiled[r]}")
        for n in self.names:
            if n in an.prefix_sums:
                rk = an.iter_rank[n][0]
                notes.append(f"{names.get(root[(n, rk)], rk)} walked in order ({n} is a prefix sum)")
        notes += self.conflicts

        iterating: dict[Node, int] = {}  # the Einsums iterating a loop (its own, or linked to it), as bits
        parents, children, loop_bits = self.parents, self.children, self.loop_bits
        for r in order:
            if (parents or children) and (r in parents or r in children):
                it = 0
                for x in {r} | _closure(r, parents) | _closure(r, children):
                    it |= loop_bits[x]
                iterating[r] = it
            else:
                iterating[r] = loop_bits[r]

        terms = self._terms(set(tiled), names, pos, order, iterating, notes)
        full, members = an.full, self.members
        # a loop holds at most one rank per Einsum (see _Loops), listed in cascade order
        ranks = tuple(GroupRank(names[r], tuple(members[r]), full[members[r][0][1]][1], r not in untiled,
                                r == iter_root) for r in order)
        return LoopModel(tuple(names[r] for r in order), tuple(names[r] for r in order if r in untiled), ranks,
                         tuple(notes), terms, self._bindings(names))

    def _bindings(self, names: dict[Node, str]) -> dict[Node, Binding]:
        """Every member rank's loop (by name; None when private) and, for a parent of split pieces, the
        pieces' loops: a merge read (``YD[b,l//Q,l%Q,..]``) and a split read (``X[b,c*Q+q,..]``) alike."""
        pieces: dict[Node, list[tuple[str, Signature]]] = {}
        for parent, kids in self.links:
            pr = self.root[parent]
            for child, sig in kids:
                cr = self.root[child]
                if sig is None or cr == pr or cr not in names:
                    continue
                got = pieces.setdefault(pr, [])
                if (names[cr], sig) not in got:
                    got.append((names[cr], sig))
        out = {}
        for node, r in self.root.items():
            out[node] = Binding(names.get(r), tuple(pieces.get(r, ())))
        return out

    def _factor(self, einsum: str, rank: str, tiled: set[Node], names, pos, hold_from: int,
                halo=None) -> BufferFactor:
        """One position: the tile of its fused loop, or its full extent (private, untiled or held)."""
        root = self.root[(einsum, rank)]
        if root not in tiled or pos.get(root, len(pos)) > hold_from:
            return self.an.factor(rank, None, None)
        return self.an.factor(rank, names[root], halo)

    def _terms(self, tiled: set[Node], names, pos, order, iterating: dict[Node, int],
               notes: list[str]) -> tuple[BufferTerm, ...]:
        an = self.an
        factor, term, fget = an.factor, an.term, an._factors.get  # factors are cached by this key
        npos = len(pos)
        norder = len(order)
        terms: list[BufferTerm] = []
        by_producer: dict[str, list[Edge]] = {}
        for e in self.edges:
            got = by_producer.get(e.producer)
            if got is None:
                by_producer[e.producer] = [e]
            else:
                got.append(e)
        loops = [(i, iterating[outer]) for i, outer in enumerate(order)]
        bit = an.order
        for n in self.names:
            out_ranks = an.out_ranks[n]
            mine = self.loops_of[n]
            out_loops = [mine[i] for i in an.out_pos[n]]
            nbytes = an.element_bytes[n]
            out_edges = by_producer.get(n)
            # the first loop n does not iterate but a consumer does: n's tile is held across it
            hold_from = norder
            if out_edges:
                me, consumers = 1 << bit[n], 0
                for e in out_edges:
                    consumers |= 1 << bit[e.consumer]
                for i, it in loops:  # it: the Einsums iterating that loop
                    if not it & me and it & consumers:
                        hold_from = i
                        break
                halos = [h for e in out_edges if (h := an.edge_halos[id(e)])]
                factors = []
                held = []
                for j, rank in enumerate(out_ranks):
                    r = out_loops[j]
                    if r not in tiled:
                        factors.append(fget((rank, None, None)) or factor(rank, None, None))
                        continue
                    if pos.get(r, npos) > hold_from:
                        factors.append(fget((rank, None, None)) or factor(rank, None, None))
                        held.append(rank)
                        continue
                    halo = None
                    for by_pos in halos:
                        for h in by_pos.get(j, ()):
                            if halo is None or h.size > halo.size:
                                halo = h
                    name = names[r]
                    f = fget((rank, name, None)) if halo is None else None
                    factors.append(f or factor(rank, name, halo))
                if held:
                    notes.append(f"{n} held whole along {', '.join(held)} while the outer loop "
                                 f"{names[order[hold_from]]} sweeps (or recompute {n})")
                terms.append(term(n, "tile", tuple(factors), nbytes))
            rec = an.recurrence_pos[n]
            if rec is not None:
                factors = []
                for j, rank in enumerate(out_ranks):
                    if j == rec:
                        continue
                    r = out_loops[j]
                    if r not in tiled or pos.get(r, npos) > norder:
                        factors.append(factor(rank, None, None))
                    else:
                        factors.append(factor(rank, names[r], None))
                terms.append(term(n, "state", tuple(factors), nbytes))
            if not out_edges and any(self.root[(n, r)] in tiled for r in an.reduced[n]):
                factors = [self._factor(n, r, tiled, names, pos, norder) for r in out_ranks]
                terms.append(term(n, "partial", tuple(factors), nbytes))
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
