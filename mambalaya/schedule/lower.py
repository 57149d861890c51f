"""Lowering: a fusion group (Einsums, loop order, tiles) to its :class:`~mambalaya.schedule.ir.GroupSchedule`.

The steps, in :meth:`_Lowering.run`:

1. **Ranges**: every rank of every member follows one tile loop (its own loop, tiled), is the
   parent of a tiled outer piece (``l`` follows ``c``'s tile times the chunk), is a piece of a tiled
   loop (``c = l // chunk`` follows ``l``'s tile; the tile must align with the piece), or is swept
   whole. Two related loops tiled at once (``d`` and its piece ``h``) are refused.
2. **Placement**: per loop, outer to inner, the members that iterate it go inside; the others run
   before it (what the inside reads) or after it (what reads the inside: a pinned read of the last
   step, a final state). A member that both reads and feeds the inside would need the loop split
   and is refused. A member runs over the whole extent of every loop that does not enclose it. On a
   GPU the leading parallel loops are the program grid: members that do not iterate them still run
   inside, in every program (replicated), and only the first program stores what they write.
3. **Skews**: a consumer reading its producer ahead along a tiled loop (``X[l+1]``, ``X[l+2k-6]``, the
   slice ``X[h+3]``) makes the producer run ahead by the largest forward offset, so every row is
   computed before it is read (forward halos are scheduled, not wrong). Strided or crossed reads
   along a tiled loop are refused.
4. **Buffers**: every intermediate gets one, allocated where its producer and readers meet: a tile, a
   sliding window along a loop (the rows a later tile reads again: a backward halo, a recurrence's
   previous step, a pinned read after the loop), or the whole extent of the loops it persists across;
   partial sums persist across their reduction loop. Off-chip operands are loaded in *streams* (reads
   of one tensor by the members of one block whose boxes overlap share one box), each hoisted out of
   every loop its box does not move with: a weight read under a token loop is loaded once. A stream
   whose box overlaps the previous tile's along its innermost loop slides (only new rows are loaded;
   not on a GPU, whose programs are independent). Stores go from the member's buffer, or a staging
   buffer for an output nothing in the group reads.
5. **Sizes** (:mod:`~mambalaya.schedule.extent`): a buffer holds the most its box ever spans; a load or
   store carries its elements over every execution.

The joint occupancy (all buffers at once) is checked by :func:`mambalaya.schedule.lower_mapping`;
what cannot be lowered raises :class:`ScheduleError` with the reason.
"""

from __future__ import annotations

import functools
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field, replace

from mambalaya.errors import MappingError
from mambalaya.ir.cascade import Cascade, Einsum
from mambalaya.ir.expr import Access, Reduce, accesses, walk
from mambalaya.ir.mapping import FusionGroup
from mambalaya.schedule import extent
from mambalaya.schedule.compute import EffectiveRead, choose_inline, effective_reads, pointwise, scan_consumers
from mambalaya.schedule.intervals import IndexForm, Term, compile_index, length
from mambalaya.schedule.ir import (
    AxisBox,
    Buffer,
    BufferAxis,
    Compute,
    GroupSchedule,
    Load,
    Loop,
    LoopBlock,
    Range,
    Shift,
    Statement,
    Store,
    register_block_bytes,
)


class ScheduleError(MappingError):
    """A group (at these tiles) has no schedule: the message says why."""


@dataclass(frozen=True)
class Policy:
    """What an architecture decides about lowering: on a GPU, programs of the grid are independent."""

    gpu: bool = False


#: the policy of every architecture that is not a GPU
SEQUENTIAL = Policy()


@dataclass
class Forms:
    """Every access of every Einsum of a cascade, compiled once."""

    cascade: Cascade
    _forms: dict[tuple[str, int], tuple[IndexForm, ...]] = field(default_factory=dict)
    _accesses: dict[str, tuple[Access, ...]] = field(default_factory=dict)
    _full: dict[str, dict[str, Range]] = field(default_factory=dict)
    _boxes: dict[tuple, list[tuple[int, int]]] = field(default_factory=dict)
    extents: dict = field(default_factory=dict)  # box lengths and totals, by what they depend on (extent's memo)
    _fns: dict = field(default_factory=dict)  # (box, the ranges its reads see) -> AxisFn, across groups
    _inline: dict = field(default_factory=dict)
    #: a group's placement by what decides it (:meth:`_Lowering.placed`): every tiling of the same loops shares it
    placements: OrderedDict = field(default_factory=OrderedDict)
    members: dict = field(default_factory=dict)  # (einsums, recompute, stored) -> what :func:`_members` finds
    pieces: dict = field(default_factory=dict)  # (einsums, recompute, loop) -> :func:`pieces_of`
    #: a member's output box per (member, axis, loop) (:meth:`_Builder._out_axis`)
    out_boxes: dict[tuple, AxisBox] = field(default_factory=dict)
    #: (einsums, recompute, stored) -> :meth:`_Lowering.rank_table`
    rank_tables: dict[tuple, tuple] = field(default_factory=dict)
    #: per member set, step 1's verdict on one or two tiled loops alone (:meth:`_Lowering._refused_part`)
    refused_parts: OrderedDict = field(default_factory=OrderedDict)

    def inline(self, members: list[str], candidates: list[str]) -> dict[str, int]:
        """:func:`~.compute.choose_inline`, once per member set (every tiling of a group asks)."""
        key = (tuple(members), tuple(candidates))
        got = self._inline.get(key)
        if got is None:
            got = self._inline[key] = choose_inline(self.cascade, members, candidates) if candidates else {}
        return got

    def axis_fn(self, axis: AxisBox, ranges: dict[str, dict[str, Range]]) -> extent.AxisFn:
        """The box compiled against the ranges its reads see (shared by every group that sees the same)."""
        key = (axis, tuple(ranges[m][r] for f, m in axis.reads for r in f.ranks))
        got = self._fns.get(key)
        if got is None:
            got = self._fns[key] = extent.AxisFn(axis, ranges, self.extents)
        return got
    _effective: dict[tuple, tuple] = field(default_factory=dict)
    _reductions: dict[str, tuple] = field(default_factory=dict)

    def reductions(self, einsum: str) -> tuple[tuple[str, str], ...]:
        """(rank, op) of every reduction in the Einsum's expression, in walk order (every placement asks)."""
        got = self._reductions.get(einsum)
        if got is None:
            expr = self.cascade.einsum(einsum).expr
            got = self._reductions[einsum] = tuple((node.rank, node.op) for node in walk(expr) if isinstance(node, Reduce))
        return got

    def full_ranges(self, einsum: str) -> dict[str, Range]:
        """Every rank of the Einsum over its whole extent (do not mutate: shared)."""
        got = self._full.get(einsum)
        if got is None:
            got = self._full[einsum] = {r: Range(r, self.cascade.rank_size(r)) for r in self.cascade.einsum(einsum).ranks}
        return got

    def whole_box(self, einsum: str, k: int, forms: tuple[IndexForm, ...], tensor: str) -> list[tuple[int, int]]:
        """The box a read covers over the Einsum's whole iteration space (clipped to the tensor)."""
        key = (einsum, k, tensor, len(forms))
        got = self._boxes.get(key)
        if got is None:
            out = []
            for f, size in zip(forms, self.cascade.shape(tensor), strict=True):
                lo, hi = f.interval({r: (0, self.cascade.rank_size(r) - 1) for r in f.ranks})
                out.append((max(lo, 0), min(hi, size - 1)))
            got = self._boxes[key] = out
        return got

    def accesses(self, einsum: str) -> tuple[Access, ...]:
        """The Einsum's distinct reads, in reading order (a recurrence's read of itself included)."""
        got = self._accesses.get(einsum)
        if got is None:
            got = self._accesses[einsum] = tuple(dict.fromkeys(accesses(self.cascade.einsum(einsum).expr)))
        return got

    def effective(self, einsum: str, inline: frozenset[str]) -> tuple[tuple[EffectiveRead, tuple[IndexForm, ...]], ...]:
        """The Einsum's reads with its inlined producers expanded (:func:`~.compute.effective_reads`), compiled."""
        relevant = frozenset(self._inlined_under(einsum, inline)) if inline else inline
        key = (einsum, relevant)
        got = self._effective.get(key)
        if got is None:
            ranks = set(self.cascade.einsum(einsum).ranks)
            got = self._effective[key] = tuple(
                (er, tuple(compile_index(ix, self.cascade.values, ranks, self.cascade.rank_sizes) for ix in er.indices))
                for er in effective_reads(self.cascade, einsum, inline))
        return got

    def _inlined_under(self, einsum: str, inline: frozenset[str]):
        """The inlined producers an Einsum reads through (directly or through other inlined ones)."""
        for t in self.cascade.einsum(einsum).reads:
            if t in inline and t != einsum:
                yield t
                yield from self._inlined_under(t, inline)

    def of(self, einsum: str, k: int) -> tuple[IndexForm, ...]:
        """The index forms of the Einsum's ``k``-th distinct read."""
        key = (einsum, k)
        got = self._forms.get(key)
        if got is None:
            acc = self.accesses(einsum)[k]
            ranks = set(self.cascade.einsum(einsum).ranks)
            got = self._forms[key] = tuple(compile_index(ix, self.cascade.values, ranks, self.cascade.rank_sizes)
                                           for ix in acc.indices)
        return got


@dataclass
class _Member:
    name: str
    einsum: Einsum
    ranges: dict[str, Range]
    loops: frozenset[int]  # tile loops it iterates
    depth: int = 0  # loops enclosing it (always the outermost ``depth`` loops: the tree is a chain)
    replicas: frozenset[int] = frozenset()  # grid loops it runs in without iterating them
    accumulate: int | None = None  # the tiled reduction loop it accumulates over


@dataclass
class _Stream:
    """Reads of one off-chip tensor served by one buffer (sized by :meth:`_Builder._size_stream`)."""

    tensor: str
    depth: int  # the block it is loaded in
    reads: list[tuple[str, int, tuple[IndexForm, ...]]]  # (member, access index, forms)
    init_of: str | None = None  # the recurrence whose step -1 this stream is (an initial state)
    init_axis: int | None = None
    first_of: int | None = None  # loaded only on this loop's first tile (an initial state read at step -1)
    first: list[tuple[int, int]] = field(default_factory=list)  # its box at the first tile of every loop
    buffer: str = ""
    box: tuple[AxisBox, ...] = ()
    slides: int | None = None
    axes: tuple[BufferAxis, ...] = ()
    elements: int = 0
    executions: int = 0
    nbytes: int = 0
    boxes: tuple[AxisBox, ...] | None = None  # its box per axis, once asked (:meth:`_Builder._axes`)


def _abuts(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    """Two boxes whose hull is no bigger than the two apart (they overlap or touch)."""

    def vol(box):
        n = 1
        for iv in box:
            n *= length(iv)
        return n

    hull = [(min(x[0], y[0]), max(x[1], y[1])) for x, y in zip(a, b, strict=True)]
    return vol(hull) <= vol(a) + vol(b)


def _reduces_all(term, ranks: set[str]) -> bool:
    """The term is one explicit sum over exactly these ranks."""
    return isinstance(term, Reduce) and term.op == "sum" and {term.rank} == ranks


#: Most placements :class:`Forms` keeps (least recently used go first): a group's tile search reuses its own (one per
#: set of tiled loops); 8,192 kept the default Mamba-2 on h200 at 577 MB against 319 MB, in the same time.
PLACEMENTS_MAX = 1024


@dataclass(frozen=True)
class GridShape:
    """What the placement of a set of tiled loops fixes of the program grid of each of its tilings (tiles of the same
    :func:`piece_class` es), for a bound that prices them before lowering any (:meth:`_Lowering.grid_shape`); without
    a GPU, no grid: only the placed loops, the members' ranges and plain stores (what the runs a tiling adds are
    counted from)."""

    loops: tuple[str, ...]  # the grid's loops at most, outer first
    certain: int  # how many leading ones are the grid's at every such tiling
    replicas: tuple[tuple[str, tuple[str, ...]], ...]  # per member, the certain loops it does not iterate: it runs in
    # every program along them
    rereads: tuple[tuple[str, tuple[str, ...]], ...]  # per operand read off chip, the certain loops none of its reads
    # moves with: every program along them loads what it reads
    placed: tuple[str, ...] = ()  # the placement's loops (what a range's ``loop`` indexes)
    ranges: tuple[tuple[str, tuple[Range, ...]], ...] = ()  # per live member, its ranges (how many indices of each
    # rank an execution spans: its matrix unit's waste, :func:`~mambalaya.cost.price.member_waste`)
    stores: tuple[str, ...] = ()  # the stored members that accumulate across no loop (placed without the grid)


@dataclass(frozen=True)
class _Placed:
    """Steps 1-3 of a group at one set of tiled loops, which do not depend on the tiles' sizes (only on which
    loops are tiled and on how each tile meets the pieces of its rank, :meth:`_Lowering.piece_signature`): the
    loops that stay, every member's ranges and place, the statement tree, the fused scans, the read offsets and
    skews, and the windows. Shared by every tiling with the same key; read-only."""

    ranks: tuple[str, ...]
    ms: dict[str, _Member]
    tree: list
    scans: dict[str, list[str]]
    offsets: dict
    tails: dict
    skew: dict
    halos: dict
    notes: tuple[str, ...]
    dropped: int  # the first notes: the loops found dead
    wins: dict
    own: dict[str, dict[str, Range]]  # every member's ranges before step 2 (which the grid's loops keep, GridShape)
    fns: dict = field(default_factory=dict)  # each box compiled against these ranges, each output's box
    #: what steps 4-5 decide from the placement alone (:meth:`_Builder.buffer_plans`, :meth:`_Builder.read_plans`)
    plans: dict = field(default_factory=dict)


def _members(cascade: Cascade, group: FusionGroup, forms: Forms, stored: frozenset[str]) -> tuple:
    """What a group's members read of each other (every tiling of it asks): its members in cascade order, the
    point-wise ones inlined into their readers, the others (live), each live member's effective reads, readers
    and producers in the group. Read-only."""
    order = {n: i for i, n in enumerate(cascade.einsum_names)}
    members = sorted({*group.einsums, *group.recompute}, key=order.__getitem__)
    cands = [m for m in members if m not in stored and pointwise(cascade.einsum(m))]
    inline = forms.inline(members, cands)
    inline_set = frozenset(inline)
    live = [m for m in members if m not in inline_set]
    live_set = frozenset(live)
    #: per live member: (index, effective read, its forms)
    reads = {n: tuple((i, er, f) for i, (er, f) in enumerate(forms.effective(n, inline_set))) for n in live}
    readers: dict[str, list[str]] = {n: [] for n in live}
    for n in live:
        for _, er, _ in reads[n]:
            t = er.tensor
            if t in live_set and t != n and n not in readers[t]:
                readers[t].append(n)
    deps = {n: {er.tensor for _, er, _ in reads[n] if er.tensor in live_set and er.tensor != n} for n in live}
    return members, frozenset(members), inline, inline_set, live, live_set, reads, readers, deps


@dataclass(frozen=True)
class _Refused:
    """A placement the schedule refuses (:meth:`_Lowering.placed` keeps it like a placement)."""

    reason: str


class _DeadLoop(Exception):
    """No member inside the enclosing loops iterates this tiled loop: its tile changes nothing."""

    def __init__(self, loop: int) -> None:
        self.loop = loop


def pieces_of(model, rank: str) -> tuple[tuple[int, int | None], ...]:
    """The pieces (divisor, modulus) of loop ``rank``'s rank that a group's members read (``g = h // 4``: (4, None));
    ``model`` is the analysis's loop model of the group."""
    return tuple(sorted({(div, mod) for b in model.bindings.values() if b.loop == rank for _, (_, div, mod) in b.pieces},
                        key=repr))


@functools.cache
def piece_class(pieces: tuple[tuple[int, int | None], ...], rank: str, tile: int) -> frozenset[tuple]:
    """How a tile of loop ``rank`` meets the ``pieces`` of its rank (:func:`pieces_of`): per piece, whether the tile
    is a coarser piece's divisor (then the piece's members run outside the loop, :meth:`_Lowering.ranges`) and
    whether it aligns with the piece (else the tiling is refused, :meth:`_Lowering._check_tiling`). Tilings whose
    loops' tiles fall in the same classes share steps 1-3 (:meth:`_Lowering.placed`)."""
    out = set()
    for div, mod in pieces:
        period = div * (mod or 1)
        out.add((rank, div, mod, mod is None and div % tile == 0 and div > tile,
                 tile % div == 0 and (mod is None or tile % period == 0 or period % tile == 0)))
    return frozenset(out)


def _carried(ms: dict[str, _Member], j: int) -> tuple[list[str], list[str], list[tuple[str, int]]]:
    """What a placement carries across loop ``j``, whatever its tiles: the recurrences that step along it, the members
    that accumulate partial sums across it, and those that run ahead along it (reader's rows computed a tile
    before)."""
    rec = [m.name for m in ms.values() if m.einsum.recurrence is not None and m.ranges[m.einsum.recurrence.rank].loop == j]
    acc = [m.name for m in ms.values() if m.accumulate == j]
    ahead = [(m.name, x.skew) for m in ms.values() for x in m.ranges.values()
             if x.loop == j and x.kind == "tile" and x.skew > 0]
    return rec, acc, ahead


class _Lowering:
    """One group's lowering (see the module docstring)."""

    def __init__(self, cascade: Cascade, group: FusionGroup, model, forms: Forms, stored: frozenset[str],
                 policy: Policy, index: int, capacity: int | None) -> None:
        self.c = cascade
        self.capacity = capacity
        self.group = group
        self.model = model
        self.forms = forms
        self.policy = policy
        self.index = index
        self.stored = stored
        self.notes: list[str] = []
        key = self.lowering_key = (group.einsums, group.recompute, stored)
        got = forms.members.get(key)
        if got is None:
            got = forms.members[key] = _members(cascade, group, forms, stored)
        (self.members, self.produced, self.inline, self.inline_set, self.live, self.live_set, self.reads,
         self.readers, self.deps) = got
        self.scans: dict[str, list[str]] = {}  # a fused recurrence -> the readers it computes step by step

    # ---- 1. loops and ranges ---------------------------------------------------------
    def loops(self) -> list[Loop]:
        sizes = {r.name: r.size for r in self.model.ranks}
        tileable = {r.name for r in self.model.ranks if r.tiled}
        wanted = [r for r, t in self.group.tiles.items() if 0 < t < self.c.rank_size(r)]
        for r in wanted:
            if r not in tileable:
                raise ScheduleError(f"group [{', '.join(self.group.einsums)}] tiles {r}, which the analysis keeps "
                                    f"untiled (tileable: {', '.join(sorted(tileable)) or 'none'})")
        given = list(self.group.loop_order)
        model = [r.rstrip("'") for r in self.model.loop_order]
        key = {r: (given.index(r) if r in given else len(given) + model.index(r)) for r in wanted}
        return [Loop(r, sizes[r], self.group.tiles[r]) for r in sorted(wanted, key=key.__getitem__)]

    def rank_table(self) -> tuple:
        """Per live member, how each of its ranks follows the group's loops, from the group's bindings (every
        placement of the group reads it, so it is kept with the member set): (name, Einsum, per rank (rank, size,
        its loop's rank or None, the pieces it is the parent of as (their loop, offset, divisor), the pieces of
        other ranks its loop is as (their parent's loop, offset, divisor, modulus)))."""
        key = self.lowering_key
        got = self.forms.rank_tables.get(key)
        if got is None:
            bindings = self.model.bindings
            piece_of: dict[str, list[tuple[str, tuple]]] = {}
            for b in bindings.values():
                for child, sig in b.pieces:
                    seen = piece_of.setdefault(child, [])
                    if b.loop is not None and (b.loop, sig) not in seen:
                        seen.append((b.loop, sig))
            rows = []
            for name in self.live:
                e = self.c.einsum(name)
                ranks = []
                for r in e.ranks:
                    b = bindings.get((name, r))
                    loop = b.loop if b is not None else None
                    children = tuple((child, off, div) for child, (off, div, mod) in b.pieces if mod is None) \
                        if loop is not None else ()
                    parents = tuple((parent, off, div, mod) for parent, (off, div, mod) in piece_of.get(loop, ())) \
                        if loop is not None else ()
                    ranks.append((r, self.c.rank_size(r), loop, children, parents))
                rows.append((name, e, tuple(ranks)))
            got = self.forms.rank_tables[key] = tuple(rows)
        return got

    def ranges(self, loops: list[Loop]) -> dict[str, _Member]:
        if not loops:  # nothing tiled: every rank over its whole extent
            return {n: _Member(n, self.c.einsum(n), self.forms.full_ranges(n), frozenset()) for n in self.live}
        index = {lp.rank: j for j, lp in enumerate(loops)}
        out: dict[str, _Member] = {}
        for name, e, table in self.rank_table():
            full = self.forms.full_ranges(name)
            ranges: dict[str, Range] = {}
            for r, size, loop, children, parents in table:
                if loop is None:
                    ranges[r] = full[r]
                    continue
                related: list[Range] = []
                j = index.get(loop)
                if j is not None:
                    related.append(Range(r, size, "tile", j))
                for child, off, div in children:
                    j = index.get(child)
                    if j is not None:
                        related.append(Range(r, size, "parent", j, scale=div, offset=off))
                for parent, off, div, mod in parents:
                    j = index.get(parent)
                    if j is not None and not (mod is None and div % loops[j].tile == 0 and div > loops[j].tile):
                        # (a coarse piece of a finer tile, ``g = h // 4`` under tiles of one head, does not
                        # follow the loop: the member runs outside it, once for all its tiles)
                        related.append(Range(r, size, "piece", j, offset=off, divisor=div, modulus=mod))
                if not related:
                    ranges[r] = full[r]
                    continue
                if len(related) > 1:
                    if len({x.loop for x in related}) > 1:
                        which = ", ".join(sorted({loops[x.loop].rank for x in related if x.loop is not None}))
                        raise ScheduleError(f"{name}'s rank {r} follows several tiled loops ({which}): tile one of "
                                            "them")
                    if len({(x.kind, x.scale, x.offset, x.divisor, x.modulus) for x in related}) > 1:
                        # (Mamba-2's B and C channels of x are both pieces of the groups g, at two offsets: a
                        # tile of g would compute one of them, and none of the channels before it)
                        raise ScheduleError(f"{name}'s rank {r} is read as several pieces of the tiles of "
                                            f"{loops[related[0].loop].rank}: a tile of it would compute one of them; "
                                            "tile another loop")
                ranges[r] = related[0]
            out[name] = _Member(name, e, ranges, frozenset(x.loop for x in ranges.values() if x.loop is not None))
        for m in out.values():
            m.ranges = dict(m.ranges)
            self._detach_tails(m, out, loops)
        for m in out.values():
            m.loops = frozenset(x.loop for x in m.ranges.values() if x.loop is not None)
            self._check_tiling(m, loops)
            for r, x in m.ranges.items():
                if x.kind == "parent" and x.offset > 0:
                    raise ScheduleError(f"{m.name}'s rank {r} follows the tiles of {loops[x.loop].rank} from "
                                        f"{x.offset} on: its first indices would never run; tile another loop")
                if x.kind in ("tile", "parent") and x.size > (span := loops[x.loop].extent * x.scale + x.offset):
                    # (Mamba-2's XBC channels x follow heads h as x = 16*h + p, but B and C lie past the heads)
                    raise ScheduleError(f"{m.name}'s rank {r} ({x.size}) is longer than the tiles of "
                                        f"{loops[x.loop].rank} reach ({span}): its last indices would never run; "
                                        f"tile another loop")
        return out

    def _detach_tails(self, m: _Member, ms: dict[str, _Member], loops: list[Loop]) -> None:
        """A rank shorter than its loop that reads its producers entirely past its own extent (``CSF[k] =
        X[seqlen-4+k]``, the last rows) does not follow the loop: following it would make the producer run
        the whole offset ahead; the member runs after the loop instead, reading a tail the window keeps."""
        for r, x in list(m.ranges.items()):
            # (a tile of the loop, or the parent of its pieces: ``k`` of ``X[seqlen-4+k]`` under chunks ``c``)
            if x.kind not in ("tile", "parent") or x.size >= loops[x.loop].extent * x.scale + x.offset:
                continue
            far = []
            for _, er, forms in self.reads[m.name]:
                if er.tensor not in self.live_set or er.tensor == m.name:
                    continue
                for f in forms:
                    if r in f.ranks:
                        off = f.offset_of(r)
                        far.append(off is not None and off >= x.size)
            if far and all(far):
                m.ranges[r] = Range(r, x.size)

    def _check_tiling(self, m: _Member, loops: list[Loop]) -> None:
        e = m.einsum
        for rank, op in self.forms.reductions(m.name):
            if op == "cumsum" and m.ranges[rank].loop is not None:
                raise ScheduleError(f"{m.name} is a prefix sum along {rank}: its loop "
                                    f"{loops[m.ranges[rank].loop].rank} cannot be tiled")
        for r, x in m.ranges.items():
            if x.kind == "piece":
                tile, lp = loops[x.loop].tile, loops[x.loop].rank
                period = x.divisor * (x.modulus or 1)
                if x.offset or tile % x.divisor or (x.modulus is not None and tile % period and period % tile):
                    raise ScheduleError(f"a tile of {lp} that is not a multiple or a divisor of {period} does not "
                                        f"align with {m.name}'s {r} (a piece of {lp} every {x.divisor}"
                                        f"{f' of period {period}' if x.modulus else ''}): tile {lp} by one")
        reduced = sorted(r for r in e.reduced_ranks if m.ranges[r].loop is not None)
        if not reduced:
            return
        loops_of = {m.ranges[r].loop for r in reduced}
        if len(loops_of) > 1:
            raise ScheduleError(f"{m.name} reduces ranks of two tiled loops: tile one of {', '.join(reduced)}")
        if e.recurrence is not None:
            raise ScheduleError(f"{m.name} reduces the tiled rank(s) {', '.join(reduced)} inside a recurrence")
        for rank, op in self.forms.reductions(m.name):
            if op != "sum" and rank in reduced:
                raise ScheduleError(f"{m.name}: a {op} over the tiled rank {rank} (only sums accumulate)")
        for _, term, summed in e.terms():
            if not set(reduced) <= set(summed) and not _reduces_all(term, set(reduced)):
                raise ScheduleError(f"{m.name} reduces the tiled rank(s) {', '.join(reduced)} in only some of its "
                                    f"terms: partial sums need every term summed over them")
        if e.where and {r for cmp in e.where for r in cmp.ranks()} & set(reduced):
            raise ScheduleError(f"{m.name} masks its tiled reduced rank(s) {', '.join(reduced)}")
        m.accumulate = loops_of.pop()

    # ---- 2. placement ---------------------------------------------------------------
    def place(self, loops: list[Loop], ms: dict[str, _Member], grid: int) -> list:
        """The statement tree as nested lists of member names and ``("loop", j, items)``."""

        def rec(names: list[str], depth: int) -> list:
            if depth == len(loops) or not names:
                for n in names:
                    ms[n].depth = depth
                return list(names)
            if depth < grid:
                for n in names:
                    if depth not in ms[n].loops:
                        ms[n].replicas |= {depth}
                return [("loop", depth, rec(names, depth + 1))]
            inside = [n for n in names if depth in ms[n].loops]
            if not inside:
                raise _DeadLoop(depth)
            before, after = [], []
            tainted = set(inside)
            for n in names:
                if n in tainted:
                    continue
                if self.deps[n] & tainted:
                    after.append(n)
                    tainted.add(n)
                else:
                    before.append(n)
            for n in after:
                feeds = [x for x in self.readers[n] if x in inside]
                if feeds:
                    raise ScheduleError(f"{n} reads what the {loops[depth].rank} loop computes and feeds "
                                        f"{', '.join(feeds)} inside it: the loop would have to be split in two")
            for n in (*before, *after):
                ms[n].depth = depth
            return [*before, ("loop", depth, rec(inside, depth + 1)), *after]

        for m in ms.values():
            m.replicas = frozenset()
        if not loops:
            for m in ms.values():
                m.depth = 0
            return list(self.live)
        tree = rec(list(self.live), 0)
        for m in ms.values():  # a member runs over the whole extent of every loop that does not enclose it
            m.ranges = {r: (x if x.loop is None or x.loop < m.depth else Range(r, x.size)) for r, x in m.ranges.items()}
            m.loops = frozenset(x.loop for x in m.ranges.values() if x.loop is not None)
            if m.accumulate is not None and m.accumulate >= m.depth:
                m.accumulate = None
        return tree

    # ---- 3. skews ---------------------------------------------------------------------
    def skews(self, loops: list[Loop], ms: dict[str, _Member]) -> None:
        """Offsets of every internal read along the loops (tile-tile pairs) in ``self.offsets``; each
        producer's tile ranges run ahead by its readers' largest forward offset."""
        offsets: dict[tuple[str, str, int], tuple[int, int]] = {}
        tails: dict[tuple[str, int], int] = {}  # (producer, axis) -> least index read there after its loop
        halos: dict[tuple[str, int], tuple[str, IndexForm]] = {}  # (producer, parent axis) -> a read past its tile
        for cname in self.live:
            cm = ms[cname]
            for _, acc, forms in self.reads[cname]:
                if acc.tensor not in self.live_set:
                    continue
                pm = ms[acc.tensor]
                for pos, f in enumerate(forms):
                    pr = pm.ranges[pm.einsum.out_ranks[pos]]
                    if pr.loop is None:
                        continue
                    j = pr.loop
                    if cname == acc.tensor:  # a recurrence's read of its previous step
                        off = f.offset_of(pm.einsum.out_ranks[pos])
                        if off is not None:
                            offsets[(cname, cname, j)] = (off, off)
                        continue
                    if cm.depth <= j:  # read after the loop: a tail the buffer keeps
                        lo, _ = f.interval({r: extent.rank_interval(cm.ranges[r], {}) for r in f.ranks})
                        key = (acc.tensor, pos)
                        tails[key] = min(tails.get(key, lo), lo)
                        continue
                    if pr.kind == "parent" and self._past_the_tile(f, cm, pr):
                        halos.setdefault((acc.tensor, pos), (cname, f))
                    if pr.kind != "tile":
                        continue  # a parent or piece range: aligned tiles, checked when sized
                    on = [r for r in f.ranks if cm.ranges[r].loop == j]
                    if len(on) == 1 and cm.ranges[on[0]].kind != "tile":
                        continue  # the consumer's rank follows the loop re-tiled: aligned tiles, checked when sized
                    if len(on) != 1:
                        raise ScheduleError(f"{cname} reads {acc.tensor} at {f} along the tiled loop {loops[j].rank}: "
                                            f"it needs more than one tile of it (leave {loops[j].rank} untiled)")
                    r = on[0]
                    coef = next((t.coef for t in f.terms if t.rank == r), None)
                    if coef is None:  # (the rank only inside a floor or remainder: several rows per tile, unaligned)
                        raise ScheduleError(f"{cname} reads {acc.tensor} at {f}, a floor or remainder of {r}, along "
                                            f"the tiled loop {loops[j].rank}: leave {loops[j].rank} untiled")
                    if coef != 1 or f.den != 1:
                        raise ScheduleError(f"{cname} reads {acc.tensor} at {f} along the tiled loop {loops[j].rank}:"
                                            f" a strided read needs {loops[j].rank} untiled")
                    rest = IndexForm(f.const, tuple(t for t in f.terms if t.rank != r))
                    if any(t.rank is None or cm.ranges[t.rank].loop is not None for t in rest.terms):
                        raise ScheduleError(f"{cname} reads {acc.tensor} at {f} along the tiled loop {loops[j].rank} "
                                            f"with another tiled rank in the index")
                    a, b = rest.interval({t.rank: (0, cm.ranges[t.rank].size - 1) for t in rest.terms})
                    old = offsets.get((cname, acc.tensor, j))
                    offsets[(cname, acc.tensor, j)] = (a, b) if old is None else (min(a, old[0]), max(b, old[1]))
        ahead: dict[tuple[str, int], list[tuple[str, int]]] = {}  # (producer, loop) -> (reader, its furthest offset)
        for (cn, t, jj), (_, b) in offsets.items():
            if cn != t:
                ahead.setdefault((t, jj), []).append((cn, b))
        skew: dict[tuple[str, int], int] = {}
        for pname in reversed(self.live):
            for j in range(len(loops)):
                s = max((skew.get((cn, j), 0) + b for cn, b in ahead.get((pname, j), ())), default=0)
                if s > 0:
                    skew[(pname, j)] = s
        for (name, j), s in skew.items():
            m = ms[name]
            m.ranges = {r: (replace(x, skew=s) if x.kind == "tile" and x.loop == j else x) for r, x in m.ranges.items()}
            self.notes.append(f"{name} runs {s} ahead along {loops[j].rank} (read forward)")
        self.offsets, self.tails, self.skew, self.parent_halos = offsets, tails, skew, halos

    @staticmethod
    def _past_the_tile(f: IndexForm, cm: _Member, pr: Range) -> bool:
        """Whether a read of a rank that follows loop ``pr.loop`` as its parent (``l`` under tiles of chunks
        ``c``: rows ``[scale*c + offset, ...)``) reaches rows of another step of the loop (the conv's
        ``X[l+k-3]``; ``X[8*c+q]`` stays in its chunk): the windows of step 4 slide along a rank's own tiles
        only, so only a buffer holding the whole rank, in one program, has those rows."""
        on = [r for r in f.ranks if cm.ranges[r].loop == pr.loop]
        if len(on) != 1:
            return False  # several ranks on the loop: refused by the tile-tile checks or sized as pieces
        cr = cm.ranges[on[0]]
        if cr.kind not in ("tile", "parent"):
            return False
        coef = next(t.coef for t in f.terms if t.rank == on[0])
        rest = IndexForm(f.const, tuple(t for t in f.terms if t.rank != on[0]))
        if f.den != 1 or any(t.rank is None for t in rest.terms):
            return False
        lo, hi = rest.interval({t.rank: (0, cm.ranges[t.rank].size - 1) for t in rest.terms})
        scale, offset = (cr.scale, cr.offset) if cr.kind == "parent" else (1, 0)
        # one step of the loop reads rows coef*(scale*t + offset) + [lo, hi]; it computes [pr.scale*t + pr.offset, +pr.scale)
        if coef * scale != pr.scale:
            return True
        first = coef * offset + lo
        last = coef * (offset + scale - 1) + hi
        return first < pr.offset or last > pr.offset + pr.scale - 1

    def windows(self, loops: list[Loop], ms: dict[str, _Member]) -> dict[tuple[str, int], tuple[int | None, int | None]]:
        """Per (producer, axis) whose buffer persists along its tile loop: (least skew + offset its readers read
        at behind the new rows, least index read after the loop)."""
        out = {}
        for pname in self.live:
            pm = ms[pname]
            for pos, r in enumerate(pm.einsum.out_ranks):
                pr = pm.ranges[r]
                if pr.kind != "tile":
                    continue
                j, s = pr.loop, pr.skew
                behind = [self.skew.get((cn, j), 0) + a for (cn, t, jj), (a, _) in self.offsets.items()
                          if t == pname and jj == j and cn != pname]
                if (pname, pname, j) in self.offsets and pm.einsum.recurrence is not None:
                    behind.append(s + self.offsets[(pname, pname, j)][0])
                tail = self.tails.get((pname, pos))
                least = min(behind) if behind else None
                if (least is not None and least < s) or tail is not None:
                    out[(pname, pos)] = (least, tail)
        return out

    # ---- 4. the whole lowering ---------------------------------------------------------
    def run(self, probe: bool = False) -> GroupSchedule | int:
        loops, ms, tree, wins = self.placed(self.loops(), 0)
        if probe:
            return _Builder(self, loops, ms, tree, wins).occupancy()
        if self.policy.gpu:  # the leading parallel loops become the program grid
            # (a loop's role needs only the members and their own buffers, not the operands' streams)
            probe = _Builder(self, loops, ms, tree, wins)
            probe.internal_buffers()
            roles = probe.roles()
            grid = 0
            while grid < len(loops) and roles[grid].role == "parallel" and not self._after_at(tree, grid) and \
                    self.grid_stop(self.own, grid, loops[grid].rank) is None:
                grid += 1
            if grid:
                dropped = self.notes[:self.dropped]  # (the loops the first placement found dead stay dropped)
                loops, ms, tree, wins = self.placed(loops, grid)
                self.notes[:0] = dropped
                return replace(_Builder(self, loops, ms, tree, wins, grid).build(), grid=grid)
        return _Builder(self, loops, ms, tree, wins).build()

    def piece_signature(self, loops: list[Loop]) -> frozenset:
        """What steps 1-3 read of the tiles' sizes (:func:`piece_class` of every tiled loop)."""
        return frozenset().union(*(piece_class(self.pieces(lp.rank), lp.rank, lp.tile) for lp in loops))

    def pieces(self, rank: str) -> tuple[tuple[int, int | None], ...]:
        """The pieces (divisor, modulus) the members read of loop ``rank``'s rank (``g = h // 4``: (4, None))."""
        key = (self.group.einsums, self.group.recompute, rank)
        got = self.forms.pieces.get(key)
        if got is None:
            got = self.forms.pieces[key] = pieces_of(self.model, rank)
        return got

    def grid_shape(self) -> GridShape:
        """What the placement of these tiled loops fixes of every such tiling's program grid (:class:`GridShape`):
        its loops at most are the placement's leading loops that no member carries anything across
        (:func:`_carried`) and after which no member runs in their block; a window sliding along one of them ends
        the grid at some tiles only (:meth:`_Builder.roles`), so the loops before the first such are the grid's at
        every tiling. Every member runs over the whole grid (step 2), so its own ranges say which of those loops it
        iterates and which of them its off-chip reads move with."""
        loops, ms, tree, wins = self.placed(self.loops(), 0)
        n = 0
        while n < len(loops) and not any(_carried(ms, n)) and not self._after_at(tree, n) and \
                self.grid_stop(self.own, n, loops[n].rank) is None:
            n += 1
        windows = {p[2] for _, _, plans in _Builder(self, loops, ms, tree, wins).buffer_plans() if plans
                   for p in plans if p[0] == "window"}
        certain = next((j for j in range(n) if j in windows), n)
        replicas, moves = [], {}
        for name, ranges in (self.own.items() if certain else ()):
            iterates = {x.loop for x in ranges.values()}
            replicas.append((name, tuple(loops[j].rank for j in range(certain) if j not in iterates)))
            for _, acc, forms in self.reads[name]:
                if acc.tensor not in self.live_set:
                    moves.setdefault(acc.tensor, set()).update(
                        ranges[r].loop for f in forms for r in f.ranks if ranges[r].loop is not None)
        rereads = tuple((t, tuple(loops[j].rank for j in range(certain) if j not in mv)) for t, mv in moves.items())
        ranges = tuple((n, tuple(m.ranges[r] for r in m.einsum.ranks)) for n, m in ms.items())
        return GridShape(tuple(lp.rank for lp in loops[:n]), certain, tuple(replicas), rereads,
                         tuple(lp.rank for lp in loops), ranges, self.plain_stores(ms))

    def plain_stores(self, ms: dict[str, _Member]) -> tuple[str, ...]:
        """The stored members that accumulate across no loop: each is stored inside every loop it follows."""
        return tuple(n for n, m in ms.items() if n in self.stored and m.accumulate is None)

    def placed(self, loops: list[Loop], grid: int) -> tuple[list[Loop], dict[str, _Member], list, dict]:
        """Steps 1-3 for these loops (``grid``: its leading loops the program grid), from :class:`Forms`'s cache
        when a tiling of the same loops with the same :meth:`piece_signature` was placed or refused before (a
        refusal's message names no tile size: every tiling with the key gets it)."""
        key = (self.group.einsums, self.group.recompute, self.stored, self.policy, tuple(lp.rank for lp in loops),
               self.piece_signature(loops), grid)
        cache = self.forms.placements
        got = cache.get(key)
        if got is None:
            why = self._refused_part(loops)
            try:
                got = _Refused(why) if why is not None else self._place(loops, grid)
            except ScheduleError as err:  # (refused by which loops are tiled, not by their sizes: kept too)
                got = _Refused(str(err))
            cache[key] = got
            if len(cache) > PLACEMENTS_MAX:
                cache.popitem(last=False)
        else:
            cache.move_to_end(key)
        if isinstance(got, _Refused):
            raise ScheduleError(got.reason)
        self.scans, self.offsets, self.tails, self.skew, self.parent_halos = (got.scans, got.offsets, got.tails,
                                                                              got.skew, got.halos)
        self.notes = list(got.notes)
        self.dropped = got.dropped
        self.fns = got.fns
        self.plans = got.plans
        self.own = got.own
        return [lp for lp in loops if lp.rank in got.ranks], got.ms, got.tree, got.wins

    def _refused_part(self, loops: list[Loop]) -> str | None:
        """Why step 1 (:meth:`ranges`) refuses one or two of these loops tiled on their own, or None. Its refusals
        only grow with the tiled loops: how a rank follows a loop depends on that loop alone (whether it is tiled,
        its tile's piece class), as does a tail's detaching; so a set holding the part either relates some rank to
        two loops (refused) or gives the part's ranks the same ranges, and each later test fails as it did (the
        reduced ranks that follow loops are the same set, when not empty). Dead loops are dropped only after step
        1 has run on the whole set. So a part's refusal refuses every placement holding it at the same tile
        classes (with the part's message). Kept per member set: most placements a tile search asks for are
        refused by a pair (a rank following two tiled loops, a mean over a tiled rank)."""
        if len(loops) < 2:
            return None
        memo = self._part_memo()
        for part in itertools.chain(((lp,) for lp in loops), itertools.combinations(loops, 2)):
            why = self.part_refusal(part, memo)
            if why is not None:
                return why
        return None

    def _part_memo(self) -> dict:
        """The member set's refusals by part (:class:`Forms`, least recently used member sets dropped first)."""
        parts = self.forms.refused_parts
        memo = parts.get(self.lowering_key)
        if memo is None:
            memo = parts[self.lowering_key] = {}
            if len(parts) > PLACEMENTS_MAX:
                parts.popitem(last=False)
        else:
            parts.move_to_end(self.lowering_key)
        return memo

    def grid_exclusion(self) -> str | None:
        """Why the group's one tiled loop is in no program grid of any tiling holding it at this tile class, or None:
        step 1 refuses it alone (:meth:`part_refusal`: then every such tiling is refused), or :meth:`grid_stop` says
        so of its ranges. Which ranks follow a loop depends on that loop alone (step 1), so in every tiling holding
        it the same holds, and :meth:`run` ends the grid before it."""
        loops = self.loops()
        assert len(loops) == 1, "one tiled loop"
        why = self.part_refusal((loops[0],))
        if why is not None:
            return why
        return self.grid_stop({n: m.ranges for n, m in self.ranges(loops).items()}, 0, loops[0].rank)

    def grid_stop(self, ranges: dict[str, dict[str, Range]], j: int, rank: str) -> str | None:
        """Why loop ``j`` of step 1's ``ranges`` (per live member) cannot be a program grid's, or None: no member
        iterates it, a member carries across it (a rank it sums over or scans along follows it), or a member that
        does not iterate it reads, through the group, one that does (it needs every iteration of the loop, and a
        program holds its own only). Decided on step 1's ranges: step 2 may place a member before an outer loop,
        whole, and placing the grid puts it back inside."""
        inside = {n for n, rr in ranges.items() if any(x.loop == j for x in rr.values())}
        if not inside:
            return f"no member iterates {rank}"
        for n in inside:
            e = self.c.einsum(n)
            carried = {*e.reduced_ranks, *((e.recurrence.rank,) if e.recurrence is not None else ())}
            if any(ranges[n][r].loop == j for r in carried if r in ranges[n]):
                return f"{n} carries across {rank}"
        reaches: dict[str, bool] = {}

        def reads_inside(n: str) -> bool:  # (through the members it reads, memoised)
            got = reaches.get(n)
            if got is None:
                got = reaches[n] = any(d in inside or reads_inside(d) for d in self.deps[n])
            return got

        for n in ranges:
            if n not in inside and reads_inside(n):
                return f"{n} reads what the {rank} loop computes without iterating it"
        return None

    def part_refusal(self, part: tuple[Loop, ...], memo: dict | None = None) -> str | None:
        """Why step 1 refuses these loops tiled on their own (kept per member set and tile classes), or None: every
        placement holding them at the same tile classes is refused too (:meth:`_refused_part`)."""
        if memo is None:
            memo = self._part_memo()
        key = tuple((lp.rank, piece_class(self.pieces(lp.rank), lp.rank, lp.tile)) for lp in part)
        if key not in memo:
            try:
                self.ranges(list(part))
                memo[key] = None
            except ScheduleError as err:
                memo[key] = str(err)
        return memo[key]

    def _place(self, loops: list[Loop], grid: int) -> _Placed:
        self.notes = []
        while True:
            ms = self.ranges(loops)
            own = {n: dict(m.ranges) for n, m in ms.items()}
            try:
                tree = self.place(loops, ms, grid)
                break
            except _DeadLoop as dead:  # a tile no member can follow inside the outer loops: dropped
                self.notes.append(f"the tile of {loops[dead.loop].rank} has no effect: no member inside the outer "
                                  f"loops iterates it")
                loops = [lp for j, lp in enumerate(loops) if j != dead.loop]
        dropped = len(self.notes)
        self.fuse_scans(tree)
        self.skews(loops, ms)
        wins = self.windows(loops, ms)
        return _Placed(tuple(lp.rank for lp in loops), ms, tree, self.scans, self.offsets, self.tails, self.skew,
                       self.parent_halos, tuple(self.notes), dropped, wins, own)

    def fuse_scans(self, tree: list) -> None:
        """Recurrences whose group readers it can compute step by step (:func:`~.compute.scan_consumers`),
        each reader placed right with it (its other inputs computed before the recurrence): their tensor is
        then held one step at a time. A recurrence whose output leaves the group is not fused."""
        self.scans = {}
        order: dict[str, tuple[int, int]] = {}

        def walk(items, depth):
            for x in items:
                if isinstance(x, str):
                    order[x] = (depth, len(order))
                else:
                    walk(x[2], depth + 1)

        walk(tree, 0)
        for r in self.live:
            e = self.c.einsum(r)
            if e.recurrence is None or r in self.stored:
                continue
            consumers = scan_consumers(self.c, r, self.readers[r], self.inline_set)
            if not consumers:
                continue
            ok = all(order[x][0] == order[r][0] and all(order[d][1] < order[r][1] for d in self.deps[x] - {r})
                     for x in consumers)
            finals = [x for x in self.readers[r] if x not in consumers]
            if ok and all(order[x][1] > order[r][1] for x in finals):
                self.scans[r] = consumers
                self.notes.append(f"{r} is scanned step by step with {', '.join(consumers)} (its state on chip)")

    @staticmethod
    def _after_at(tree: list, depth: int) -> bool:
        """Whether some member runs after loop ``depth`` in its enclosing block."""
        items = tree
        for _ in range(depth):
            nxt = [x for x in items if isinstance(x, tuple)]
            if not nxt:
                return False
            items = nxt[0][2]
        seen_loop = False
        for x in items:
            if isinstance(x, tuple):
                seen_loop = True
            elif seen_loop:
                return True
        return False


def _axis_extent(plan: tuple, fn: extent.AxisFn, loops: tuple[Loop, ...]) -> tuple[int, bool]:
    """(elements, whether it is a sliding window) of a ``"box"`` or ``"window"`` axis plan
    (:meth:`_Builder.buffer_plans`) at these loops' tiles: the one rule :meth:`_Builder.internal_buffers` and
    :class:`OccupancyForm` size an internal buffer's axis by."""
    if plan[0] == "box":
        return extent.max_length(fn, loops), False
    _, _, loop, skew, behind, tail, size, _ = plan
    rows = extent.window_rows(loops[loop].tile, skew, behind, tail, size)
    return (size, False) if rows >= size else (rows, True)


@dataclass(frozen=True)
class OccupancyForm:
    """A placement's occupancy (:meth:`_Builder.occupancy`) as a function of its tiles, compiled once: every
    tiling of the placement has the same buffers and reads, so what it holds is a sum over them of element bytes
    times the product of their axes' lengths, each a constant or a box's :func:`~.extent.max_length` or a window's
    rows at the tiles. Which reads of a tensor share a stream depends on the tiles (their first boxes must touch),
    so those are grouped at each tiling and the compiled boxes of each grouping kept."""

    #: per internal buffer: (element bytes, whether it holds partial sums, per axis an extent or (plan, AxisFn))
    buffers: tuple[tuple[int, bool, tuple], ...]
    streams: tuple[tuple[int, tuple[extent.AxisFn, ...]], ...]  # (element bytes, box) of every read alone in its key
    shared: tuple[tuple[int, ...], ...]  # read plans sharing a key: grouped into streams at each tiling
    groupings: dict  # (per shared key, its streams' reads) -> their (element bytes, box)s

    def at(self, b: _Builder) -> tuple[int, int]:
        """(bytes held at once, the largest partial-sum buffer padded to powers of two) at ``b``'s tiles."""
        loops = b.loops
        total = acc = 0
        for eb, partial, axes in self.buffers:
            n, window, extents = eb, False, []
            for a in axes:
                if type(a) is int:
                    x = a
                else:
                    x, w = _axis_extent(a[0], a[1], loops)
                    window = window or w
                n *= x
                extents.append(x)
            total += n
            if partial and not window:  # (a window's buffer is not partial sums: internal_buffers' kind)
                acc = max(acc, register_block_bytes(eb, extents))
        streams = self.streams
        if self.shared:
            key = tuple(tuple(tuple(reads) for reads, _ in b._merge(idx)) for idx in self.shared)
            more = self.groupings.get(key)
            if more is None:
                plans = b.read_plans()
                more = self.groupings[key] = tuple((b.c.tensors[plans[reads[0]][0]].element_bytes, b._stream_fns(list(reads)))
                                                   for merged in key for reads in merged)
            streams = streams + more
        for eb, fns in streams:
            n = eb
            for fn in fns:
                n *= extent.max_length(fn, loops)
            total += n
        return total, acc


class _Builder:
    """Buffers, statements and sizes of a placed group (step 4 and 5)."""

    def __init__(self, lw: _Lowering, loops: list[Loop], ms: dict[str, _Member], tree: list, wins,
                 grid: int = 0) -> None:
        self.lw, self.c, self.forms = lw, lw.c, lw.forms
        self.grid = grid  # leading loops that are the program grid: nothing is hoisted out of them
        self.loops = tuple(loops)
        self.ms = ms
        self.tree = tree
        self.wins = wins
        self.ranges = {n: m.ranges for n, m in ms.items()}
        self.buffers: list[Buffer] = []
        self.by_tensor: dict[str, str] = {}  # member -> its output buffer
        self.streams: list[_Stream] = []
        self.stream_of: dict[tuple[str, int], _Stream] = {}
        self.inits: dict[tuple[str, int], _Stream] = {}
        self.notes = list(lw.notes)
        self.fns: dict[AxisBox, extent.AxisFn] = lw.fns  # (its placement's: shared by every tiling of it)
        self.plans: dict = lw.plans  # (its placement's too: :meth:`buffer_plans`, :meth:`read_plans`)
        self._first_tiles: dict | None = None  # every loop's first tile (:meth:`_first_box`)
        self.absorbed = {c: r for r, cs in lw.scans.items() for c in cs}  # scan consumer -> its recurrence

    def _fn(self, axis: AxisBox) -> extent.AxisFn:
        """The axis compiled against this group's ranges (shared by equal boxes, and across groups whose
        members see the same ranges)."""
        got = self.fns.get(axis)
        if got is None:
            got = self.fns[axis] = self.forms.axis_fn(axis, self.ranges)
        return got

    # -- names --
    def _name(self, tensor: str, kind: str) -> str:
        return f"{kind}_{tensor}" if not any(b.name == f"{kind}_{tensor}" for b in self.buffers) else \
            f"{kind}_{tensor}_{len(self.buffers)}"

    def _out_axis(self, m: _Member, pos: int) -> AxisBox:
        """The box of the member's output along one axis (kept with the placement, which decides it)."""
        got = self.fns.get((m.name, pos))
        if got is None:
            r = m.einsum.out_ranks[pos]
            loop = m.ranges[r].loop
            key = ("out", m.name, pos, loop)  # (the same box in every placement where it follows that loop)
            got = self.forms.out_boxes.get(key)
            if got is None:
                got = self.forms.out_boxes[key] = AxisBox(self.c.rank_size(r), ((IndexForm(0, (Term(1, r),)), m.name),),
                                                      frozenset({loop}) if loop is not None else frozenset())
            self.fns[(m.name, pos)] = got
        return got

    # -- internal buffers --
    def buffer_plans(self) -> tuple:
        """Per live member, its output buffer as the placement decides it (every tiling of the placement shares
        this; :meth:`internal_buffers` sizes it at the tiles): (member, kind, its axes' plans, or None for the whole
        tensor). An axis plan is ``("size", n)``, ``("state", box, loop)``, ``("box", box)`` (the most its box spans
        at a tile) or ``("window", box, loop, skew, behind, tail, size, rank)`` (:func:`~.extent.window_rows`)."""
        got = self.plans.get("buffers")
        if got is None:
            got = self.plans["buffers"] = tuple(self._buffer_plan(name) for name in self.lw.live)
        return got

    def _buffer_plan(self, name: str) -> tuple:
        m = self.ms[name]
        readers = self.lw.readers[name]
        kind = "partial" if m.accumulate is not None else "staging" if not readers else "tile"
        alloc = m.depth
        for cn in readers:
            alloc = min(alloc, self.ms[cn].depth)
        if m.accumulate is not None:
            alloc = min(alloc, m.accumulate)
        slide: dict[int, tuple[int | None, int | None]] = {}
        for pos in range(len(m.einsum.out_ranks)):
            if (name, pos) in self.wins:
                j = m.ranges[m.einsum.out_ranks[pos]].loop
                alloc = min(alloc, j)
                slide[pos] = self.wins[(name, pos)]
        rec = m.einsum.recurrence
        state = rec.position if rec is not None and name in self.lw.scans else None
        if not self.loops and state is None:  # nothing tiled: the whole tensor
            return name, kind, None
        axes: list[tuple] = []
        for pos, r in enumerate(m.einsum.out_ranks):
            x = m.ranges[r]
            size = self.c.rank_size(r)
            box = self._out_axis(m, pos)
            if pos == state:  # a scanned recurrence: one step, the latest computed
                axes.append(("state", box, x.loop))
                continue
            halo = self.lw.parent_halos.get((name, pos)) if x.kind == "parent" else None
            if halo is not None and (x.loop < alloc or x.loop < self.grid):
                # (a tile's box, or one program's copy: the rows of the other tiles are not there)
                raise ScheduleError(f"{halo[0]} reads {name} at {halo[1]}, past the tile of {r} that follows "
                                    f"{self.loops[x.loop].rank}: no buffer keeps the other tiles' rows; tile "
                                    f"{r} itself or another loop")
            if x.loop is None or x.loop > alloc:
                axes.append(("size", size))
            elif x.loop < alloc:
                axes.append(("box", box))
            elif pos in slide and x.kind == "tile":
                behind, tail = slide[pos]
                axes.append(("window", box, x.loop, x.skew, behind, tail, size, r))
            else:
                axes.append(("size", size))
        return name, "state" if state is not None else kind, tuple(axes)

    def _buffer_axis(self, plan: tuple) -> BufferAxis:
        """An axis plan (:meth:`buffer_plans`) at these tiles."""
        what = plan[0]
        if what == "size":
            return BufferAxis(plan[1])
        if what == "state":
            return BufferAxis(1, "state", plan[1], plan[2])
        n, window = _axis_extent(plan, self._fn(plan[1]), self.loops)
        if what == "box":
            return BufferAxis(n, "box", plan[1])
        return BufferAxis(n, "window", plan[1], plan[2]) if window else BufferAxis(n)

    def internal_buffers(self) -> None:
        for name, kind, plans in self.buffer_plans():
            if plans is None:
                axes = tuple(BufferAxis(n) for n in self.c.shape(name))
            else:
                axes = tuple(self._buffer_axis(p) for p in plans)
                for p, a in zip(plans, axes, strict=True):
                    if a.base == "window":
                        self.notes.append(f"{name} keeps a window of {a.extent} along {p[7]} "
                                          f"(loop {self.loops[p[2]].rank})")
                if kind != "state" and any(a.base == "window" for a in axes):
                    kind = "window"
            b = Buffer(self._name(name, kind), name, kind, axes, self.c.tensors[name].element_bytes)
            self.buffers.append(b)
            self.by_tensor[name] = b.name

    # -- streams of off-chip reads --
    def read_plans(self) -> tuple:
        """Every off-chip read as the placement decides it (every tiling of the placement shares this): (tensor,
        member, access index, forms, the recurrence whose initial state it is, that state's axis, the loop on whose
        first tile alone it is loaded, its depth), in the order :meth:`collect_streams` groups them."""
        got = self.plans.get("reads")
        if got is None:
            out: list[tuple] = []
            for name in self.lw.live:
                m = self.ms[name]
                for k, acc, forms in self.lw.reads[name]:
                    if acc.tensor not in self.lw.live_set:
                        out.append(self._read_plan(acc.tensor, name, k, forms))
                    self._init_read(out, name, k, acc, forms)
                rec = m.einsum.recurrence
                if rec is not None and rec.init is not None:  # the state before the first step
                    forms = tuple(IndexForm(0, (Term(1, r),)) for p, r in enumerate(m.einsum.out_ranks)
                                  if p != rec.position)
                    out.append(self._read_plan(rec.init, name, -1, forms, name, rec.position,
                                               m.ranges[rec.rank].loop))
            got = self.plans["reads"] = tuple(out)
        return got

    def collect_streams(self) -> None:
        """Every off-chip read, grouped into streams: reads of one tensor loaded in one block whose boxes
        overlap or abut at the first tile (conv taps, ``X[l]`` and ``X[l-1]``, adjacent rows of a packed
        weight) share one box; disjoint parts of a tensor get streams of their own."""
        plans = self.read_plans()
        for _, idx in self._stream_keys():
            for reads, first in self._merge(idx):
                tensor, _, _, _, init_of, init_axis, first_of, depth = plans[reads[0]]
                self.streams.append(_Stream(tensor, depth, [(plans[i][1], plans[i][2], plans[i][3]) for i in reads],
                                            init_of, init_axis, first_of, first))

    def _stream_keys(self) -> tuple[tuple[tuple, tuple[int, ...]], ...]:
        """The read plans (their indices) by what a stream shares: tensor, block, initial state, first tile only
        (kept with the placement)."""
        got = self.plans.get("stream keys")
        if got is None:
            by_key: dict[tuple, list[int]] = {}
            for i, (tensor, _, _, _, init_of, _, first_of, depth) in enumerate(self.read_plans()):
                by_key.setdefault((tensor, depth, init_of, first_of), []).append(i)
            got = self.plans["stream keys"] = tuple((k, tuple(v)) for k, v in by_key.items())
        return got

    def _merge(self, idx: tuple[int, ...]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """Reads of one key grouped into streams, in order: a read joins the first stream whose box at the first
        tile of every loop overlaps or abuts its own (the hull is the stream's), else starts one. Which reads
        merge depends on the tiles (``Win[d]`` and ``Win[D+d]`` abut only when ``d`` is whole)."""
        plans = self.read_plans()
        out: list[tuple[list[int], list[tuple[int, int]]]] = []
        for i in idx:
            tensor, member, k, forms = plans[i][:4]
            box = self._first_box(member, forms, tensor, k)
            for j, (reads, first) in enumerate(out):
                if _abuts(first, box):
                    reads.append(i)
                    out[j] = (reads, [(min(a[0], b[0]), max(a[1], b[1])) for a, b in zip(first, box, strict=True)])
                    break
            else:
                out.append(([i], box))
        return out

    def _init_read(self, out: list[tuple], name: str, k: int, acc: EffectiveRead, forms: tuple[IndexForm, ...]) -> None:
        """A read of a recurrence's tensor that can reach index -1 of its iterative position reads its initial
        state there (on the first tile of the loop that position moves with)."""
        prod = self.c.einsum(acc.tensor) if self.c.producer(acc.tensor) else None
        rec = prod.recurrence if prod is not None else None
        if rec is None or rec.init is None or acc.tensor == name or acc.via:
            return
        m = self.ms[name]
        f = forms[rec.position]
        lo, hi = f.interval({r: extent.rank_interval(m.ranges[r], {}) for r in f.ranks})
        if not lo <= -1 <= hi:
            return
        on = {m.ranges[r].loop for r in f.ranks if m.ranges[r].loop is not None}
        first = on.pop() if len(on) == 1 else None
        rest = tuple(x for p, x in enumerate(forms) if p != rec.position)
        out.append(self._read_plan(rec.init, name, k, rest, acc.tensor, rec.position, first))

    def _read_plan(self, tensor: str, member: str, k: int, forms: tuple[IndexForm, ...], init_of: str | None = None,
                   init_axis: int | None = None, first_of: int | None = None) -> tuple:
        m = self.ms[member]
        moves = {m.ranges[r].loop for f in forms for r in f.ranks if m.ranges[r].loop is not None}
        depth = max(1 + max(moves) if moves else 0, self.grid)  # every program of a grid loads its own
        if first_of is not None and first_of >= depth:
            first_of = None  # loaded outside that loop anyway
        return tensor, member, k, forms, init_of, init_axis, first_of, depth

    def _first_box(self, member: str, forms, tensor: str, k: int = -2) -> list[tuple[int, int]]:
        """The read's box at the first tile of every loop."""
        if not self.loops:
            return self.forms.whole_box(member, k, forms, tensor)
        state = self._first_tiles
        if state is None:
            state = self._first_tiles = {j: extent.tile_of(lp, 0) for j, lp in enumerate(self.loops)}
        rr = self.ms[member].ranges
        out = []
        for f, size in zip(forms, self.c.shape(tensor), strict=True):
            lo, hi = f.interval({r: extent.rank_interval(rr[r], state) for r in f.ranks})
            out.append((max(lo, 0), min(hi, size - 1)))
        return out

    def _axes(self, st: _Stream) -> tuple[AxisBox, ...]:
        """The stream's box, per axis (kept with the placement: its reads and depth decide it)."""
        if st.boxes is not None:
            return st.boxes
        key = (st.tensor, st.init_of, st.depth, tuple((mb, k) for mb, k, _ in st.reads))
        got = self.fns.get(key)
        if got is None:
            out = []
            for i, size in enumerate(self.c.shape(st.tensor)):
                reads = tuple((forms[i], mb) for mb, _, forms in st.reads)
                moves = frozenset(j for f, mb in reads for r in f.ranks
                                  if (j := self.ms[mb].ranges[r].loop) is not None and j < st.depth)
                out.append(AxisBox(size, reads, moves))
            got = self.fns[key] = tuple(out)
        st.boxes = got
        return got

    def _size_stream(self, st: _Stream, totals: bool = True) -> None:
        """The stream's box, whether it slides, its buffer's axes and (``totals``) its elements over the group."""
        box = self._axes(st)
        slides = None
        inner = st.depth - 1
        if not self.lw.policy.gpu and inner >= 0 and st.first_of is None:
            on = [i for i, a in enumerate(box) if inner in a.loops]
            if (len(on) == 1 and box[on[0]].loops == {inner} and extent.rises_with(box[on[0]], self.ranges, inner)
                    and self._overlaps(box[on[0]], inner)):
                slides = on[0]
        axes = []
        for i, a in enumerate(box):
            n = extent.max_length(self._fn(a), self.loops)
            if not a.loops:
                lo, _ = self._fn(a).interval({})
                axes.append(BufferAxis(n, "zero", None) if lo == 0 else BufferAxis(n, "box", a))
            elif i == slides:
                axes.append(BufferAxis(n, "window", a, inner))
            else:
                axes.append(BufferAxis(n, "box", a))
        st.box, st.slides, st.axes = box, slides, tuple(axes)
        st.nbytes = self.c.tensors[st.tensor].element_bytes
        for a in axes:
            st.nbytes *= a.extent
        if not totals:
            return
        st.elements, st.executions = extent.box_total(
            tuple(self._fn(a) for a in box), tuple(range(st.depth)), self.loops, slides=slides,
            slide_loop=inner if slides is not None else None, first_of=st.first_of)

    def _overlaps(self, axis: AxisBox, j: int) -> bool:
        lp = self.loops[j]
        if lp.trips < 2:
            return False
        fn = self._fn(axis)
        a = fn.interval({j: extent.tile_of(lp, 0)})
        b = fn.interval({j: extent.tile_of(lp, 1)})
        return b[0] <= a[1]

    def hoist(self) -> None:
        """Keep re-read operands on chip: a stream loaded inside loops it does not move with is loaded again at
        each of their iterations; hoisted to an outer block its box covers every tile of the loops between (and
        it merges with a stream of the same tensor already loaded there whose box it overlaps, such as the
        B and C channels two members read in different blocks). Streams are hoisted greedily, most elements
        saved first, while every buffer of the group still fits the capacity together."""
        cap = self.lw.capacity
        for st in self.streams:
            self._size_stream(st)
        if cap is None or not self.loops:
            return
        used = sum(b.nbytes for b in self.buffers) + sum(st.nbytes for st in self.streams)
        options: dict[int, tuple | None] = {}
        while True:
            for st in self.streams:
                if id(st) not in options:
                    options[id(st)] = self._hoist_option(st)
            live = [o for st in self.streams if (o := options[id(st)]) is not None and used + o[1] <= cap]
            if not live:
                return
            _, extra, st, host, up = max(live, key=lambda o: o[0])
            self.streams = [up if x is st else x for x in self.streams if x is not host]
            used += extra
            for x in self.streams:  # what it could merge with has changed
                if x.tensor == st.tensor:
                    options.pop(id(x), None)

    def _hoist_option(self, st: _Stream) -> tuple | None:
        """(elements saved, bytes added, stream, host it merges into, hoisted stream) of the best block to load
        ``st`` in instead, or None when no outer block saves anything."""
        if st.first_of is not None or st.depth <= self.grid:
            return None
        moves = set().union(*(a.loops for a in st.box)) if st.box else set()
        rereads = any(j not in moves for j in range(st.depth))
        hosts = [h for h in self.streams if h is not st and h.depth < st.depth and h.tensor == st.tensor
                 and h.init_of == st.init_of and h.first_of is None]
        if not rereads and not hosts:
            return None
        best = None
        for depth in range(self.grid, st.depth):
            up = _Stream(st.tensor, depth, list(st.reads), st.init_of, st.init_axis, None, st.first)
            self._size_stream(up)
            host = next((h for h in hosts if h.depth == depth and _abuts(h.first, up.first)), None)
            if host is not None:
                up = _Stream(st.tensor, depth, [*host.reads, *st.reads], st.init_of, st.init_axis, None,
                             [(min(a[0], b[0]), max(a[1], b[1])) for a, b in zip(host.first, up.first, strict=True)])
                self._size_stream(up)
                saved, extra = st.elements + host.elements - up.elements, up.nbytes - st.nbytes - host.nbytes
            elif rereads:
                saved, extra = st.elements - up.elements, up.nbytes - st.nbytes
            else:
                continue
            if saved > 0 and (best is None or saved > best[0]):
                best = (saved, extra, st, host, up)
        return best

    def stream_buffers(self) -> None:
        for st in self.streams:
            b = Buffer(self._name(st.tensor, "in"), st.tensor, "operand", st.axes,
                       self.c.tensors[st.tensor].element_bytes)
            self.buffers.append(b)
            st.buffer = b.name
            for member, k, _ in st.reads:
                if st.init_of is None:
                    self.stream_of[(member, k)] = st
                else:
                    self.inits[(member, k)] = st

    # -- statements --
    def statements(self) -> tuple[Statement, ...]:
        loads_at: dict[int, list[_Stream]] = {}
        for s in self.streams:
            loads_at.setdefault(s.depth, []).append(s)
        done: set[int] = set()

        def members_in(item) -> set[str]:
            if isinstance(item, str):
                return {item, *self.lw.scans.get(item, ())}
            out = set()
            for x in item[2]:
                out |= members_in(x)
            return out

        def emit(items: list, depth: int) -> tuple[Statement, ...]:
            out: list[Statement] = []
            if depth > 0:
                for b in self.buffers:
                    for i, ax in enumerate(b.axes):
                        if ax.base == "window" and ax.loop == depth - 1:
                            out.append(Shift(b.name, i, depth - 1))
            for item in items:
                inside = members_in(item)
                for s in loads_at.get(depth, ()):
                    if id(s) in done or not inside & {mb for mb, _, _ in s.reads}:
                        continue
                    done.add(id(s))
                    out.append(self._load(s))
                if isinstance(item, str):
                    if item in self.absorbed:
                        continue
                    fused = self.lw.scans.get(item, ())
                    out.append(self._compute(item, tuple(self._compute(c) for c in fused)))
                    for x in (item, *fused):
                        if x in self.lw.stored and self.ms[x].accumulate is None:
                            out.append(self._store(x, depth))
                else:
                    _, j, sub = item
                    out.append(LoopBlock(j, emit(sub, depth + 1)))
                    for n in sorted(inside, key=self.lw.live.index):
                        if n in self.lw.stored and self.ms[n].accumulate == j:
                            out.append(self._store(n, depth))
            return tuple(out)

        return emit(self.tree, 0)

    def _load(self, st: _Stream) -> Load:
        return Load(st.tensor, st.buffer, st.box, st.slides, st.depth - 1 if st.slides is not None else None,
                    st.init_of, st.init_axis, st.first_of, st.elements, st.executions)

    def _compute(self, name: str, scan: tuple[Compute, ...] = ()) -> Compute:
        m = self.ms[name]
        reads, inits = [], []
        for k, acc, _ in self.lw.reads[name]:
            if acc.tensor in self.lw.live_set:
                reads.append((acc.path, self.by_tensor[acc.tensor]))
            else:
                reads.append((acc.path, self.stream_of[(name, k)].buffer))
            if (name, k) in self.inits:
                inits.append((acc.path, self.inits[(name, k)].buffer))
        rec = m.einsum.recurrence
        if rec is not None and rec.init is not None:
            inits.append(((-1,), self.inits[(name, -1)].buffer))
        execs = 1
        for j in range(m.depth):
            execs *= self.loops[j].trips
        replicas = 1
        for j in m.replicas:
            replicas *= self.loops[j].trips
        ranges = tuple(m.ranges[r] for r in m.einsum.ranks)
        return Compute(name, self.by_tensor[name], ranges, tuple(reads), tuple(inits), scan, m.accumulate, replicas,
                       execs)

    def _store(self, name: str, depth: int) -> Store:
        m = self.ms[name]
        # (only the enclosing loops move it: a member that accumulates over an outer loop is stored after it,
        # whole along the inner loops it was computed in)
        box = self.fns.get(("store", name, depth))  # (kept with the placement, which decides it)
        if box is None:
            box = self.fns[("store", name, depth)] = tuple(
                replace(a, loops=frozenset(j for j in a.loops if j < depth))
                for a in (self._out_axis(m, pos) for pos in range(len(m.einsum.out_ranks))))
        n, execs = extent.box_total(tuple(self._fn(a) for a in box), tuple(range(depth)), self.loops,
                                    guard=m.replicas)
        return Store(name, self.by_tensor[name], box, tuple(sorted(m.replicas)), n, execs)

    def roles(self) -> tuple[Loop, ...]:
        """Each loop's role: a recurrence's rank, a reduction (partial sums), a sliding window, or parallel."""
        out = []
        for j, lp in enumerate(self.loops):
            role, why = "parallel", ""
            rec, acc, ahead = _carried(self.ms, j)
            slide = [b.tensor for b in self.buffers if b.kind != "operand"
                     and any(a.base == "window" and a.loop == j for a in b.axes)]
            if rec:
                role, why = "recurrence", f"{rec[0]}'s state carries across it"
            elif acc:
                role, why = "reduction", f"{acc[0]} accumulates partial sums across it"
            elif slide:
                role, why = "sequential", f"a window of {slide[0]} slides along it"
            elif ahead:  # rows it computed a tile ahead are read at the next tile
                role, why = "sequential", f"{ahead[0][0]} runs {ahead[0][1]} ahead along it"
            out.append(replace(lp, role=role, why=why))
        return tuple(out)

    # -- the whole group --
    def occupancy(self) -> tuple[int, int]:
        """(the bytes every buffer holds at once, before operands are hoisted: what decides whether the tiles
        fit, hoisting only uses what is left; its accumulator's bytes, :func:`~.ir.accumulator_bytes`), from the
        placement's :class:`OccupancyForm` (the buffers and streams :meth:`build` makes, not built)."""
        return self.occupancy_form().at(self)

    def occupancy_form(self) -> OccupancyForm:
        """The placement's occupancy as a function of its tiles (kept with the placement)."""
        got = self.plans.get("occupancy")
        if got is None:
            terms = []
            for name, kind, plans in self.buffer_plans():
                eb = self.c.tensors[name].element_bytes
                if plans is None:
                    terms.append((eb, kind == "partial", tuple(self.c.shape(name))))
                else:
                    terms.append((eb, kind == "partial", tuple(
                        1 if p[0] == "state" else p[1] if p[0] == "size" else (p, self._fn(p[1])) for p in plans)))
            keys = self._stream_keys()
            fixed = []  # the streams of reads that share their key with no other: one stream each, at every tiling
            for (tensor, *_), idx in keys:
                if len(idx) == 1:
                    fixed.append((self.c.tensors[tensor].element_bytes, self._stream_fns([idx[0]])))
            got = self.plans["occupancy"] = OccupancyForm(tuple(terms), tuple(fixed),
                                                          tuple(idx for _, idx in keys if len(idx) > 1), {})
        return got

    def _stream_fns(self, reads: list[int]) -> tuple[extent.AxisFn, ...]:
        """The compiled box, per axis, of the stream serving these read plans."""
        plans = self.read_plans()
        tensor, _, _, _, init_of, init_axis, first_of, depth = plans[reads[0]]
        st = _Stream(tensor, depth, [(plans[i][1], plans[i][2], plans[i][3]) for i in reads], init_of, init_axis,
                     first_of)
        return tuple(self._fn(a) for a in self._axes(st))

    def build(self) -> GroupSchedule:
        self.internal_buffers()
        self.collect_streams()
        self.hoist()
        self.stream_buffers()
        body = self.statements()
        offset, placed = 0, []
        for b in self.buffers:
            placed.append(replace(b, offset=offset))
            offset += b.elements
        self.buffers = placed
        lw = self.lw
        loops = self.roles()
        reads = tuple(dict.fromkeys(s.tensor for s in self.streams))
        writes = tuple(n for n in lw.members if n in lw.stored)
        return GroupSchedule(lw.index, tuple(sorted(lw.group.einsums, key=lw.members.index)), tuple(lw.members),
                             loops, tuple(placed), body, reads, writes, tuple(lw.inline.items()),
                             {n: tuple(m.ranges[r] for r in m.einsum.ranks) for n, m in self.ms.items()},
                             tuple(self.notes))


def lower_group(cascade: Cascade, group: FusionGroup, model, forms: Forms, stored: frozenset[str],
                policy: Policy = SEQUENTIAL, index: int = 0, capacity: int | None = None) -> GroupSchedule:
    """The schedule of one group; ``model`` is the analysis's loop model of its members (recomputed
    producers included), ``stored`` the members whose output leaves the group, ``capacity`` the bytes on
    chip re-read operands may be kept resident in (None: none kept beyond what their boxes allow)."""
    return _Lowering(cascade, group, model, forms, stored, policy, index, capacity).run()  # type: ignore[return-value]


def group_grid(cascade: Cascade, group: FusionGroup, model, forms: Forms, stored: frozenset[str],
               policy: Policy = SEQUENTIAL) -> GridShape:
    """What the placement of the group's tiled loops fixes of the program grid of every tiling of them whose tiles
    fall in the same :func:`piece_class` es as its own (:meth:`_Lowering.grid_shape`; without a GPU's, no grid, only
    the placed loops and the members' ranges).
    Raises :class:`ScheduleError` when that placement is refused."""
    lw = _Lowering(cascade, group, model, forms, stored, policy, 0, None)
    if policy.gpu:
        return lw.grid_shape()
    loops, ms, _, _ = lw.placed(lw.loops(), 0)  # (refused or not)
    return GridShape((), 0, (), (), tuple(lp.rank for lp in loops),
                     tuple((n, tuple(m.ranges[r] for r in m.einsum.ranks)) for n, m in ms.items()), lw.plain_stores(ms))


def outside_grid(cascade: Cascade, group: FusionGroup, model, forms: Forms, stored: frozenset[str],
                 policy: Policy = SEQUENTIAL) -> str | None:
    """Why the group's one tiled loop is in no program grid of any tiling that tiles it at a tile of the same
    :func:`piece_class` (:meth:`_Lowering.grid_exclusion`), or None."""
    return _Lowering(cascade, group, model, forms, stored, policy, 0, None).grid_exclusion()


def group_occupancy(cascade: Cascade, group: FusionGroup, model, forms: Forms, stored: frozenset[str],
                    policy: Policy = SEQUENTIAL) -> tuple[int, int]:
    """(the bytes the group's buffers hold at once at its tiles: the fit test, what :func:`lower_group`'s
    schedule needs before hoisting operands into what is left; its accumulator's bytes), without building
    the statements."""
    return _Lowering(cascade, group, model, forms, stored, policy, 0, None).run(probe=True)  # type: ignore[return-value]


__all__ = ["SEQUENTIAL", "Forms", "GridShape", "OccupancyForm", "Policy", "ScheduleError", "group_grid", "group_occupancy", "lower_group", "outside_grid",
           "piece_class", "pieces_of"]
