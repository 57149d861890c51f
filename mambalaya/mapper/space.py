"""The mapper's search space: legal candidate groups, each with its best tiling and its cost.

Per-group cost is a function of the group alone (the cost model's traffic rule
looks only at which Einsums are inside a group, and roofline latency is summed
over groups), so the mapper costs every candidate once, here, and the solver only
picks an exact cover. Per candidate the tiling is chosen by a small enumeration
before the solve, so the solver sees one cost per candidate:

- untiled, when the group's intermediates fit the fusion buffer whole: no operand
  is ever re-read, so nothing tiled can beat it;
- else powers of two (and the full extent) for up to two *tileable* ranks (the
  output ranks every member shares: batch and tokens in a Mamba layer), outermost
  in the loop order, keeping for each tile of the first rank the largest fitting
  tile of the second (bigger tiles, fewer re-reads of what does not fit).

Growth is pruned (a group that is illegal, or whose smallest tiling does not fit,
is not grown; both only get worse as members are added), and a whole model's
candidates are costed once per *shape*: groups of chained layers that differ only
by their layer (``X0_L3`` vs ``X0_L7``) have the same cost, so they share one
evaluation (:func:`_shape_key`).

Speed (a cold mamba2 layer analyses about 2000 groups; every result is the same as without):
a group whose buffer at tile 1 provably exceeds the buffer is rejected from its loop model alone
(:meth:`CandidateGroup.buffer_min_exceeds`, a lower bound) before its schedule is worked out; the
tiling search reads the need from per-group tables (:class:`_Step`, :class:`_Pair`: a staircase
walk instead of a grid), cached arch-independently with the analysis.

Exact dominance pruning (:meth:`_Coster._split`): a legal group costing at least the best
split of it into a source (or sink) Einsum and the rest is left out; it is still grown from.
Roofline latency is subadditive, so on these archs this only removes tiled groups whose
re-reads cost more than the split (about 7% of mamba2's groups on h200). Costs are compared as
(objective, other objective) pairs, lexicographically (the mapper breaks ties by the other
objective), and a group within float noise (:data:`TIE`) of its split on the objective is kept
unless the split is no worse on the other one too: a fused group tying a split on latency but
moving less data must stay a candidate.

Recomputation variants (a group re-running a cheap element-wise producer instead of reading its
off-chip copy) are not built here: the write rule for a recomputed tensor depends on *all* its
consumers' groups, which breaks per-group additivity; :mod:`.recompute` adds them on request, with
the linear rows that keep the cover exact.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

from mambalaya.analysis.candidates import EinsumDag, candidate_groups
from mambalaya.analysis.groups import CandidateGroup
from mambalaya.arch import Arch
from mambalaya.cost.context import CostContext
from mambalaya.cost.latency import compute_seconds, group_latency
from mambalaya.cost.legality import GroupAnalysis, plain_loop_order
from mambalaya.cost.traffic import group_traffic
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.chain import split_layer_name
from mambalaya.ir.mapping import FusionGroup

OBJECTIVES = ("latency", "traffic")
#: Capacities a group's tiling is searched for: the buffer, then the buffer less the smallest operands.
MAX_TARGETS = 3
#: Relative float noise under which two objective values count as tied for dominance (summation order).
TIE = 1e-9
Score = tuple[float, float]  # (objective, the other objective): compared lexicographically


@dataclass(frozen=True)
class Candidate:
    """A legal fusion group at its best tiling under the buffer capacity, with its cost."""

    einsums: tuple[str, ...]  # cascade order
    group: FusionGroup
    traffic_bytes: int
    latency_s: float
    buffer_bytes: int
    compute_s: tuple[float, ...] = ()  # per member (cascade order): the compute part of latency_s
    transfers: int = 0  # off-chip transfers (per-transfer overhead)
    unwritten: tuple[str, ...] = ()  # tensors whose write is left out: every outside reader recomputes them

    def cost(self, objective: str) -> float:
        return self.latency_s if objective == "latency" else float(self.traffic_bytes)


@dataclass(frozen=True)
class Rejected:
    """A group left out of the space, and why (for explaining infeasibility)."""

    einsums: tuple[str, ...]
    reason: str
    need_bytes: int | None = None  # smallest buffer need over the tilings tried, when that is the reason


@dataclass
class Space:
    """All candidates of one cascade on one arch for one objective."""

    cascade: Cascade
    arch: Arch
    objective: str
    candidates: list[Candidate]
    rejected_singletons: dict[str, Rejected]
    enumerated: int  # groups looked at (legal or not)
    evaluations: int  # distinct group shapes costed
    max_size: int | None
    ctx: CostContext = field(repr=False, default=None)  # type: ignore[assignment]
    best: dict[tuple[str, ...], float] = field(repr=False, default_factory=dict)  # least cover cost per group
    grown: set[tuple[str, ...]] = field(repr=False, default_factory=set)  # groups the enumeration grew from
    dominated: int = 0  # legal groups left out because a split of them costs no more
    coster: object = field(repr=False, default=None)  # the _Coster that built it (its compiled buffer needs)


@dataclass(frozen=True)
class _Choice:
    loop_order: tuple[str, ...]
    tiles: tuple[tuple[str, int], ...]
    traffic_bytes: int
    latency_s: float
    buffer_bytes: int
    compute_s: tuple[float, ...] = ()
    transfers: int = 0


@dataclass(frozen=True)
class _Dominated:
    """A legal group some split into two smaller candidates (a source or sink Einsum and the rest)
    costs no more than, even at its cheapest conceivable tiling: never needed for the optimum."""

    einsums: tuple[str, ...]
    lower_bound: Score
    split_cost: Score


@cache
def _tile_options(size: int) -> list[int]:
    """The full extent, then powers of two below it, largest first."""
    opts = [size]
    p = 1 << (size.bit_length() - 1)
    if p == size:
        p >>= 1
    while p >= 1:
        opts.append(p)
        p >>= 1
    return opts


@dataclass
class _Shared:
    """What the space of a cascade needs that no architecture changes: the group analyses (legality,
    loop model, buffer need), compiled buffer needs, op counts, read footprints. Shared by every
    arch and objective mapped on a cascade of the same structure and sizes (:func:`shared_analysis`)."""

    analysis: GroupAnalysis
    needs: dict = field(default_factory=dict)
    ops: dict = field(default_factory=dict)
    reads: dict = field(default_factory=dict)
    footprints: dict = field(default_factory=dict)
    buffers: dict = field(default_factory=dict)
    plans: dict = field(default_factory=dict)
    readers: dict = field(default_factory=dict)


@dataclass(frozen=True)
class _TrafficPlan:
    """A group's traffic as a function of its tiles: per off-chip read (footprint bytes, the tiled loops
    outside every rank indexing it, with their extents), plus its writes (bytes, count)."""

    reads: tuple[tuple[int, tuple[tuple[str, int], ...]], ...]
    write_bytes: int
    writes: int


#: Arch-independent analyses of the last few cascades, keyed by :func:`fingerprint`.
_SHARED: OrderedDict[str, _Shared] = OrderedDict()
SHARED_MAX = 4


def fingerprint(cascade: Cascade) -> str:
    """A digest of everything the analysis reads: params, rank extents, tensors, Einsums (not the name)."""
    text = repr((sorted(cascade.params.items()), cascade.rank_exprs, cascade.tensors, cascade.einsums,
                 cascade.meta.get("layers")))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def shared_analysis(cascade: Cascade) -> _Shared:
    """The arch-independent analysis of ``cascade`` (cached for the last :data:`SHARED_MAX` cascades)."""
    key = fingerprint(cascade)
    got = _SHARED.get(key)
    if got is None:
        got = _SHARED[key] = _Shared(GroupAnalysis(cascade))
        while len(_SHARED) > SHARED_MAX:
            _SHARED.popitem(last=False)
    else:
        _SHARED.move_to_end(key)
    return got


class _Coster:
    """Chooses each group's tiling and costs it, caching by layer-relative shape."""

    def __init__(self, cascade: Cascade, arch: Arch, objective: str, ctx: CostContext | None) -> None:
        self.cascade, self.arch, self.objective = cascade, arch, objective
        # the buffer need of a group at given tiles, compiled once per group (same numbers as the analysis)
        self._needs: dict[tuple[str, ...], _Need] = {}
        self._plans: dict = {}
        self._reader_maps: dict[tuple[str, ...], dict[str, tuple[str, ...]]] = {}
        self._group_compute: dict[tuple[str, ...], float] = {}
        self._consumers: dict[str, list[str]] | None = None
        self._nbytes: dict[str, int] = {}
        self._fast = ctx is None  # the context's buffer need is this coster's (so precomputed plans agree)
        if ctx is None:
            sh = shared_analysis(cascade)
            self._needs, self._plans, self._reader_maps = sh.needs, sh.plans, sh.readers
            ctx = CostContext(cascade, arch, buffer_need=self._buffer_need, _ops=sh.ops, _reads=sh.reads,
                              _footprints=sh.footprints, _buffers=sh.buffers, _analysis=sh.analysis)
        self.ctx = ctx
        self.cap = arch.fusion_buffer_bytes
        self.layers = int(cascade.meta.get("layers", 1))
        self.shapes: dict[tuple, _Choice | Rejected | _Dominated] = {}
        self.evaluations = 0
        self.dag = EinsumDag(cascade)
        self._order = {n: i for i, n in enumerate(cascade.einsum_names)}
        self._compute: dict[str, float] = {}
        #: best[g]: the least (lexicographic) cost of covering g by candidates (its own or a split's); see :meth:`_split`
        self.best: dict[tuple[str, ...], Score] = {}
        #: for groups this coster does not cost itself (a chain's within-layer groups): their best, or None
        self.best_elsewhere: Callable[[tuple[str, ...]], Score | None] | None = None
        self.dominated = 0
        self._splits: dict[tuple[str, ...], Score] = {}  # _choose's split cost, until choose reads it
        self._member_compute: dict[tuple[str, ...], tuple[float, ...]] = {}

    def need(self, members: tuple[str, ...], cg: CandidateGroup | None = None) -> _Need:
        got = self._needs.get(members)
        if got is None:
            got = self._needs[members] = _Need(cg or self.analyse(members))
        return got

    def _buffer_need(self, group: FusionGroup) -> int:
        return self.need(tuple(group.einsums))(group.tiles)

    def analyse(self, members: tuple[str, ...]) -> CandidateGroup:
        """The analysis of a group (legality, loop order, buffer need), cached by the cost context."""
        return self.ctx.analysis.analyze(members)  # type: ignore[return-value]

    def _shape_key(self, members: tuple[str, ...]) -> tuple:
        """Members relative to their first layer, plus whether the group touches the first or last layer."""
        if self.layers <= 1:
            return (members,)
        split = [split_layer_name(m) for m in members]
        if any(k is None for _, k in split):
            return (members,)
        ks = [k for _, k in split if k is not None]
        lo, hi = min(ks), max(ks)
        return (tuple((b, k - lo) for b, k in split if k is not None), lo == 0, hi == self.layers - 1)

    def choose(self, members: tuple[str, ...]) -> _Choice | Rejected | _Dominated:
        key = self._shape_key(members)
        if key not in self.shapes:
            self.shapes[key] = self._choose(members)
            self.evaluations += 1
        ch = self.shapes[key]
        split = self._splits.pop(members, None)  # what _choose found, if it ran for these members
        if isinstance(ch, _Choice):
            self.best[members] = min(_score(ch, self.objective), self._split(members) if split is None else split)
        elif isinstance(ch, _Dominated):
            self.best[members] = ch.split_cost
        return ch

    def best_of(self, members: tuple[str, ...]) -> Score | None:
        got = self.best.get(members)
        if got is None and self.best_elsewhere is not None:
            got = self.best_elsewhere(members)
        return got

    def _split(self, members: tuple[str, ...]) -> Score:
        """The least cost of splitting ``members`` into a source or sink Einsum and the rest (inf: none).

        Exact dominance: removing a source (or sink) e of a convex group G leaves a convex rest, the two
        parts are schedulable (edges between them run one way), and replacing G in any cover by the
        parts' best covers creates no cycle (a cycle through an outside group would leave and re-enter
        G, which is convex). So a G costing at least this is in no optimal cover that its split is not.
        Groups are costed smallest first, so both parts' ``best`` are known when they are candidates.
        """
        inf = float("inf")
        if len(members) < 2:
            return inf, inf
        dag = self.dag
        bits = dag.bits(members)
        out = (inf, inf)
        for m in members:
            i = dag.index[m]
            if dag.pred[i] & bits and dag.succ[i] & bits:
                continue
            rest = self.best_of(tuple(x for x in members if x != m))
            alone = self.best_of((m,))
            if rest is not None and alone is not None:
                both = (rest[0] + alone[0], rest[1] + alone[1])
                if both < out:
                    out = both
        return out

    def _members_compute(self, members: tuple[str, ...]) -> tuple[float, ...]:
        got = self._member_compute.get(members)
        if got is None:
            got = self._member_compute[members] = tuple(
                self._compute_s(e) for e in sorted(members, key=self._order.__getitem__))
        return got

    def _compute_s(self, einsum: str) -> float:
        got = self._compute.get(einsum)
        if got is None:
            got = self._compute[einsum] = compute_seconds(self.arch, list(self.ctx.ops(einsum)))
        return got

    def _cost(self, members: tuple[str, ...], order: tuple[str, ...], tiles: dict[str, int]) -> _Choice:
        """``evaluate_group``'s traffic and latency, without building its per-Einsum rows (same sums,
        same order: the cost model's traffic rule, per-Einsum compute cached)."""
        if self._fast:
            return self._cost_fast(members, order, tiles)
        group = FusionGroup(members, order, tiles)
        rows = group_traffic(self.ctx, group)
        total = sum(r.bytes for r in rows)
        parts = self._members_compute(members)
        transfers = sum(r.reread for r in rows)
        latency, _ = group_latency(self.arch, sum(parts), total, transfers)
        return _Choice(order, tuple(tiles.items()), total, latency, self.ctx.group_buffer_bytes(group), parts,
                       transfers)

    def _traffic_plan(self, members: tuple[str, ...], order: tuple[str, ...]) -> _TrafficPlan:
        """The traffic rule of ``group_traffic`` for this group, with the tiles left free (arch-independent)."""
        key = (members, order)
        plan = self._plans.get(key)
        if plan is None:
            base = self._plans.get(members)
            if base is None:
                base = self._plans[members] = self._traffic_base(members)
            rd, writes, nwrites = base
            reads = []
            for fp, ranks in rd:
                outer = []
                for rk in order:  # reread_factor's loops: tiled loops outside every rank indexing it
                    if rk in ranks:
                        break
                    outer.append((rk, self.cascade.rank_size(rk)))
                reads.append((fp, tuple(outer)))
            plan = self._plans[key] = _TrafficPlan(tuple(reads), writes, nwrites)
        return plan

    def _readers(self, members: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
        """Per tensor the group reads from outside, its readers in cascade order (arch-independent)."""
        got = self._reader_maps.get(members)
        if got is None:
            produced = set(members)
            readers: dict[str, list[str]] = {}
            for e in sorted(members, key=self._order.__getitem__):
                for t in self.ctx.reads(e):
                    if t not in produced:
                        readers.setdefault(t, []).append(e)
            got = self._reader_maps[members] = {t: tuple(who) for t, who in readers.items()}
        return got

    def _traffic_base(self, members: tuple[str, ...]) -> tuple[tuple, int, int]:
        """``group_traffic``'s rows for ``members`` (no recomputation, no residency) with the tiles and
        loop order left free: per read (footprint bytes, ranks indexing it), write bytes and count."""
        ctx, cascade = self.ctx, self.cascade
        produced = set(members)
        reads = []
        for t, who in self._readers(members).items():
            fp = ctx.footprint_bytes(t, who)
            ranks = frozenset().union(*(ctx.reads(e)[t].ranks for e in who))
            reads.append((fp, ranks))
        writes, nwrites = 0, 0
        if self._consumers is None:
            self._consumers = {n: cascade.consumers(n) for n in cascade.einsum_names}
        for e in sorted(members, key=self._order.__getitem__):
            consumers = self._consumers[e]
            outside = [c for c in consumers if c not in produced]
            if outside or cascade.tensors[e].role == "output" or not consumers:
                nbytes = self._nbytes.get(e)
                if nbytes is None:
                    nbytes = self._nbytes[e] = cascade.nbytes(e)
                writes += nbytes
                nwrites += 1
        return tuple(reads), writes, nwrites

    def _cost_fast(self, members: tuple[str, ...], order: tuple[str, ...], tiles: dict[str, int]) -> _Choice:
        """:meth:`_cost` from a precomputed :class:`_TrafficPlan`: the same integers and float sums."""
        plan = self._traffic_plan(members, order)
        buf = self.need(members).at(tiles)
        total, transfers = 0, 0
        for fp, outer in plan.reads:
            factor = 1
            for rk, size in outer:
                t = tiles.get(rk)
                if t:
                    factor *= math.ceil(size / t)
            if factor > 1 and fp + buf <= self.cap:
                factor = 1
            total += fp * factor
            transfers += factor
        total += plan.write_bytes
        transfers += plan.writes
        compute = self._group_compute.get(members)
        if compute is None:
            compute = self._group_compute[members] = sum(self._members_compute(members))
        latency, _ = group_latency(self.arch, compute, total, transfers)
        return _Choice(order, tuple(tiles.items()), total, latency, buf, self._members_compute(members), transfers)

    def _choose(self, members: tuple[str, ...]) -> _Choice | Rejected | _Dominated:
        cg = self.analyse(members)
        if not cg.legal:
            return Rejected(members, "; ".join(cg.reasons))
        if len(members) > 1 and (bound := cg.buffer_min_exceeds(self.cap)) is not None:  # (also rejected below)
            return Rejected(members, f"needs at least {bound} bytes on chip even at tile 1", bound)
        order = plain_loop_order(cg.loop_order)
        split = self._splits[members] = self._split(members)
        need = self.need(members, cg)
        if need.at({}) <= self.cap:
            c = self._cost(members, order, {})
            return _Dominated(members, _score(c, self.objective), split) if _dominated(c, split, self.objective) else c
        least = need.at({r.name: 1 for r in cg.loops.ranks if r.tiled})
        if least > self.cap:
            return Rejected(members, _need_words(cg), least)
        size = {r.name: r.size for r in cg.loops.ranks}
        tiled = [r.name for r in cg.loops.ranks if r.tiled and r.size > 1 and r.name in self.cascade.rank_exprs]
        tiled.sort(key=order.index)
        options = {tuple(sorted(t.items())) for cap in self._targets(members, cg, least)
                   for t in _tilings(need, tiled, size, cap)}
        if not options:  # only loops a mapping cannot name (primed analysis loops) would have to shrink
            return Rejected(members, _need_words(cg), need({r: 1 for r in tiled}))
        best: _Choice | None = None
        for opt in sorted(options):
            tiles = {r: t for r, t in opt if t < size[r]}
            c = self._cost(members, order, tiles)
            if best is None or _score(c, self.objective) < _score(best, self.objective):
                best = c
        assert best is not None
        if _dominated(best, split, self.objective):
            return _Dominated(members, _score(best, self.objective), split)
        return best

    def _targets(self, members: tuple[str, ...], cg: CandidateGroup, least: int) -> list[int]:
        """Capacities to tile for: the buffer, and the buffer less each operand (so that operand stays on chip)."""
        out = [self.cap]
        readers_of = self._readers(members)
        for t in cg.reads:
            readers = readers_of.get(t)
            if readers:
                left = self.cap - self.ctx.footprint_bytes(t, readers)
                if left >= least:
                    out.append(left)
        return sorted(set(out), reverse=True)[:MAX_TARGETS]


class _Step:
    """One rank of the inner-first shrink of a group's tiled loops (outer ones full, inner ones at 1),
    with the need at each of its tile options, computed when first asked (for every capacity and arch)."""

    def __init__(self, need: _Need, tiles: dict[str, int], rank: str, size: int) -> None:
        self.need, self.tiles, self.rank = need, tiles, rank
        self.options = _tile_options(size)
        self._at: list[int | None] = [None] * len(self.options)

    def need_at(self, i: int) -> int:
        got = self._at[i]
        if got is None:
            got = self._at[i] = self.need({**self.tiles, self.rank: self.options[i]})
        return got


class _Pair:
    """A group's need over the tile options of two ranks (``o0``, ``o1``, descending), the others fixed:
    per term its constant, a factor per option of each rank; a need is then a few multiplications."""

    def __init__(self, need: _Need, tiles: dict[str, int], r0: str, o0: list[int], r1: str, o1: list[int]) -> None:
        # per term: its constant times its r0 factors per option of r0, and its r1 factors per option of r1
        self.rows: list[list[int]] = [[0] * len(o0)]  # (a zero term: no term at all needs nothing)
        self.cols: list[list[int]] = [[0] * len(o1)]
        for const, var in need.terms:
            f0, f1 = [], []
            for r, full, halo in var:
                if r == r0:
                    f0.append((full, halo))
                elif r == r1:
                    f1.append((full, halo))
                else:
                    t = tiles.get(r, full)
                    const *= (t if t < full else full) + halo
            row, col = [const] * len(o0), [1] * len(o1)
            for full, halo in f0:
                row = [x * ((t if t < full else full) + halo) for x, t in zip(row, o0, strict=True)]
            for full, halo in f1:
                col = [x * ((t if t < full else full) + halo) for x, t in zip(col, o1, strict=True)]
            self.rows.append(row)
            self.cols.append(col)
        self._at: dict[tuple[int, int], int] = {}

    def at(self, i: int, j: int) -> int:
        got = self._at.get((i, j))
        if got is None:
            got = self._at[(i, j)] = sum(row[i] * col[j] for row, col in zip(self.rows, self.cols, strict=True))
        return got

    def largest(self, cap: int) -> list[int | None]:
        """Per option of r0, the first (largest) option of r1 fitting ``cap`` (None: none fits). The need
        falls along both axes, so that index only moves left row by row: a staircase walk."""
        n1 = len(self.cols[0])
        out: list[int | None] = []
        j = n1
        for i in range(len(self.rows[0])):
            while j > 0 and self.at(i, j - 1) <= cap:
                j -= 1
            out.append(j if j < n1 else None)
        return out


class _Need:
    """A group's buffer need compiled to plain arithmetic (the tiling search evaluates it thousands of times)."""

    def __init__(self, cg: CandidateGroup) -> None:
        merged: dict[tuple, int] = {}  # terms with the same tiled factors share one constant (exact: ints)
        for t in cg.terms:
            const, var = t.compiled
            merged[var] = merged.get(var, 0) + const
        self.terms = [(const, var) for var, const in merged.items()]
        # the distinct (tile rank, extent) pairs, each capped once per evaluation
        index: dict[tuple[str, int], int] = {}
        for _, var in self.terms:
            for r, full, _ in var:
                index.setdefault((r, full), len(index))
        self.ranks = tuple(index)
        self._indexed = [(const, tuple((index[(r, full)], halo) for r, full, halo in var)) for const, var in self.terms]
        self._memo: dict[tuple, int] = {}
        self._pairs: dict[tuple, _Pair] = {}
        self._steps: dict[tuple[str, ...], list[_Step]] = {}

    def at(self, tiles: dict[str, int]) -> int:
        """``self(tiles)``, memoised (the tiling search asks the same tilings for every capacity and arch)."""
        key = tuple(sorted(tiles.items()))
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self(tiles)
        return got

    def steps(self, tiled: tuple[str, ...], size: dict[str, int]) -> list[_Step]:
        """The inner-first shrink of ``tiled`` (outer first), one :class:`_Step` per rank, cached."""
        got = self._steps.get(tiled)
        if got is None:
            got, tiles = [], {r: size[r] for r in tiled}
            for r in reversed(tiled):
                got.append(_Step(self, dict(tiles), r, size[r]))
                tiles[r] = 1
            self._steps[tiled] = got
        return got

    def pair(self, tiles: dict[str, int], r0: str, o0: list[int], r1: str, o1: list[int]) -> _Pair:
        """The need over the tile options of ``r0`` and ``r1``, the others fixed (cached)."""
        key = (tuple(sorted(tiles.items())), r0, r1)
        got = self._pairs.get(key)
        if got is None:
            got = self._pairs[key] = _Pair(self, tiles, r0, o0, r1, o1)
        return got

    def __call__(self, tiles: dict[str, int]) -> int:
        get = tiles.get
        size = [full if (t := get(r)) is None or t >= full else t for r, full in self.ranks]  # capped tiles
        total = 0
        for const, var in self._indexed:
            for i, halo in var:
                const *= size[i] + halo
            total += const
        return total


def _largest_fit(step: _Step, cap: int) -> int | None:
    """The largest tile of the step's rank (full extent or a power of two) fitting ``cap``, the other
    tiles fixed; binary search, as the need is monotone in the tile (options descend)."""
    opts = step.options
    lo, hi = 0, len(opts) - 1
    if step.need_at(hi) > cap:
        return None
    while lo < hi:  # first index that fits
        mid = (lo + hi) // 2
        if step.need_at(mid) <= cap:
            hi = mid
        else:
            lo = mid + 1
    return opts[lo]


def _tilings(cg: _Need, tiled: list[str], size: dict[str, int], cap: int) -> list[dict[str, int]]:
    """Tilings that fit ``cap``: shrink inner loops first (their tiles cause no re-reads of outer-indexed
    operands), and every tile of the outermost loop with the largest fitting tile of the next."""
    out: list[dict[str, int]] = []
    for step in cg.steps(tuple(tiled), size):  # innermost first; the inner ones already shrunk to 1
        if step.need_at(len(step.options) - 1) > cap:  # not even at tile 1 (as _largest_fit would find)
            continue
        t = _largest_fit(step, cap)
        if t is not None:
            out.append({**step.tiles, step.rank: t})
            break
    if len(tiled) >= 2:
        r0, r1 = tiled[0], tiled[1]
        rest = {r: size[r] for r in tiled[2:]}
        o0, o1 = _tile_options(size[r0]), _tile_options(size[r1])
        for t0, j in zip(o0, cg.pair(rest, r0, o0, r1, o1).largest(cap), strict=True):  # options descending
            if j is not None:
                out.append({**rest, r0: t0, r1: o1[j]})
    return out


def _need_words(cg: CandidateGroup) -> str:
    """What the smallest buffer holds, e.g. 'its recurrence state H[b,d,n]'."""
    parts = []
    for t in cg.terms:
        what = {"state": "recurrence state", "partial": "partial sums", "tile": "tile of"}.get(t.role, t.role)
        full = [f for f in t.factors if f.tile is None]
        if t.role == "tile" and not full:
            continue
        parts.append(f"{what} {t.tensor}" if t.role == "tile" else f"its {what} {t.tensor}")
    return ", ".join(parts) or "its tiles"


def _score(c: _Choice, objective: str) -> Score:
    return (c.latency_s, float(c.traffic_bytes)) if objective == "latency" else (float(c.traffic_bytes), c.latency_s)


def _dominated(c: _Choice, split: Score, objective: str) -> bool:
    """Whether the split covers the group no worse, lexicographically. The objective decides unless the
    two are within float noise (:data:`TIE`: a tie at the solver's resolution), where the other does."""
    own = _score(c, objective)
    if own[0] < split[0]:
        return False
    return own[0] > split[0] * (1 + TIE) or own[1] >= split[1]


def build_space(cascade: Cascade, arch: Arch, objective: str = "latency", *, max_size: int | None = None,
                ctx: CostContext | None = None) -> Space:
    """Enumerate legal candidate groups (connected, convex, fitting) with their best tiling and cost."""
    coster = _Coster(cascade, arch, objective, ctx)
    if not arch.can_fuse:
        max_size = 1
    kept: dict[tuple[str, ...], _Choice | Rejected | _Dominated] = {}

    def keep(members: tuple[str, ...]) -> bool:  # dominated groups are grown: a superset may pay
        ch = kept.get(members)
        if ch is None:  # (the loop below has usually chosen it already)
            ch = kept[members] = coster.choose(members)
        return not isinstance(ch, Rejected)

    enumerated = 0
    for members in candidate_groups(cascade, max_size=max_size, keep=keep, dag=coster.dag):
        enumerated += 1
        if members not in kept:  # groups at the size cap are yielded but not offered to keep()
            kept[members] = coster.choose(members)
    candidates, rejected = [], {}
    for members, ch in kept.items():
        if isinstance(ch, _Choice):
            group = FusionGroup(members, ch.loop_order, dict(ch.tiles))
            candidates.append(Candidate(members, group, ch.traffic_bytes, ch.latency_s, ch.buffer_bytes,
                                        ch.compute_s, ch.transfers))
        elif len(members) == 1:
            rejected[members[0]] = ch
    space = Space(cascade, arch, objective, candidates, rejected, enumerated, coster.evaluations, max_size, coster.ctx)
    space.best = coster.best
    space.grown = {m for m, ch in kept.items() if not isinstance(ch, Rejected)}
    space.dominated = sum(isinstance(ch, _Dominated) for ch in kept.values())
    space.coster = coster
    return space
