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

Exact dominance pruning (:meth:`_Coster._split`): a legal group costing at least the best
split of it into a source (or sink) Einsum and the rest is left out; it is still grown from.
Roofline latency is subadditive, so on these archs this only removes tiled groups whose
re-reads cost more than the split (about 7% of mamba2's groups on h200).

Extension point, not enabled: recomputation variants (a group re-running a cheap
element-wise producer instead of reading its off-chip copy) would be extra
candidates with ``FusionGroup.recompute`` set; they are left out because the cost
model's write rule for a recomputed tensor depends on *all* its consumers' groups,
which breaks the per-group additivity the exact cover relies on (it would need
one extra boolean per skipped write, linked to the consumers' choices).
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from mambalaya.analysis.candidates import EinsumDag, candidate_groups
from mambalaya.analysis.groups import CandidateGroup
from mambalaya.arch import Arch
from mambalaya.cost.context import CostContext
from mambalaya.cost.latency import compute_seconds, group_latency
from mambalaya.cost.legality import GroupAnalysis, plain_loop_order
from mambalaya.cost.traffic import group_traffic
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.chain import chain_layers, layer_name, split_layer_name
from mambalaya.ir.mapping import FusionGroup

OBJECTIVES = ("latency", "traffic")
#: Capacities a group's tiling is searched for: the buffer, then the buffer less the smallest operands.
MAX_TARGETS = 3


@dataclass(frozen=True)
class Candidate:
    """A legal fusion group at its best tiling under the buffer capacity, with its cost."""

    einsums: tuple[str, ...]  # cascade order
    group: FusionGroup
    traffic_bytes: int
    latency_s: float
    buffer_bytes: int

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


@dataclass(frozen=True)
class _Dominated:
    """A legal group some split into two smaller candidates (a source or sink Einsum and the rest)
    costs no more than, even at its cheapest conceivable tiling: never needed for the optimum."""

    einsums: tuple[str, ...]
    lower_bound: float
    split_cost: float


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
        self._group_compute: dict[tuple[str, ...], float] = {}
        self._fast = ctx is None  # the context's buffer need is this coster's (so precomputed plans agree)
        if ctx is None:
            sh = shared_analysis(cascade)
            self._needs, self._plans = sh.needs, sh.plans
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
        #: best[g]: the least cost of covering g by candidates (its own or a split's); see :meth:`_split`
        self.best: dict[tuple[str, ...], float] = {}
        #: for groups this coster does not cost itself (a chain's within-layer groups): their best, or None
        self.best_elsewhere: Callable[[tuple[str, ...]], float | None] | None = None
        self.dominated = 0

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
        split = [split_layer_name(m) for m in members]
        if self.layers <= 1 or any(k is None for _, k in split):
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
        if isinstance(ch, _Choice):
            self.best[members] = min(_cost_of(ch, self.objective), self._split(members))
        elif isinstance(ch, _Dominated):
            self.best[members] = ch.split_cost
        return ch

    def best_of(self, members: tuple[str, ...]) -> float | None:
        got = self.best.get(members)
        if got is None and self.best_elsewhere is not None:
            got = self.best_elsewhere(members)
        return got

    def _split(self, members: tuple[str, ...]) -> float:
        """The least cost of splitting ``members`` into a source or sink Einsum and the rest (inf: none).

        Exact dominance: removing a source (or sink) e of a convex group G leaves a convex rest, the two
        parts are schedulable (edges between them run one way), and replacing G in any cover by the
        parts' best covers creates no cycle (a cycle through an outside group would leave and re-enter
        G, which is convex). So a G costing at least this is in no optimal cover that its split is not.
        Groups are costed smallest first, so both parts' ``best`` are known when they are candidates.
        """
        if len(members) < 2:
            return float("inf")
        dag = self.dag
        bits = dag.bits(members)
        out = float("inf")
        for m in members:
            i = dag.index[m]
            if dag.pred[i] & bits and dag.succ[i] & bits:
                continue
            rest = self.best_of(tuple(x for x in members if x != m))
            alone = self.best_of((m,))
            if rest is not None and alone is not None and rest + alone < out:
                out = rest + alone
        return out

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
        compute = sum(self._compute_s(e) for e in sorted(members, key=self._order.__getitem__))
        latency, _ = group_latency(self.arch, compute, total, sum(r.reread for r in rows))
        return _Choice(order, tuple(tiles.items()), total, latency, self.ctx.group_buffer_bytes(group))

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

    def _traffic_base(self, members: tuple[str, ...]) -> tuple[tuple, int, int]:
        """``group_traffic``'s rows for ``members`` (no recomputation, no residency) with the tiles and
        loop order left free: per read (footprint bytes, ranks indexing it), write bytes and count."""
        ctx, cascade = self.ctx, self.cascade
        produced = set(members)
        readers: dict[str, list[str]] = {}
        for e in sorted(members, key=self._order.__getitem__):
            for t in ctx.reads(e):
                if t not in produced:
                    readers.setdefault(t, []).append(e)
        reads = []
        for t, who in readers.items():
            fp = ctx.footprint_bytes(t, tuple(who))
            ranks = frozenset().union(*(ctx.reads(e)[t].ranks for e in who))
            reads.append((fp, ranks))
        writes, nwrites = 0, 0
        for e in sorted(members, key=self._order.__getitem__):
            consumers = cascade.consumers(e)
            outside = [c for c in consumers if c not in produced]
            if outside or cascade.tensors[e].role == "output" or not consumers:
                writes += cascade.nbytes(e)
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
            compute = self._group_compute[members] = sum(
                self._compute_s(e) for e in sorted(members, key=self._order.__getitem__))
        latency, _ = group_latency(self.arch, compute, total, transfers)
        return _Choice(order, tuple(tiles.items()), total, latency, buf)

    def _choose(self, members: tuple[str, ...]) -> _Choice | Rejected | _Dominated:
        cg = self.analyse(members)
        if not cg.legal:
            return Rejected(members, "; ".join(cg.reasons))
        order = plain_loop_order(cg.loop_order)
        split = self._split(members)
        need = self.need(members, cg)
        if need.at({}) <= self.cap:
            c = self._cost(members, order, {})
            return _Dominated(members, _cost_of(c, self.objective), split) if _cost_of(c, self.objective) >= split \
                else c
        least = need.at({r.name: 1 for r in cg.schedule.ranks if r.tiled})
        if least > self.cap:
            return Rejected(members, _need_words(cg), least)
        size = {r.name: r.size for r in cg.schedule.ranks}
        tiled = [r.name for r in cg.schedule.ranks if r.tiled and r.size > 1 and r.name in self.cascade.rank_exprs]
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
        if _cost_of(best, self.objective) >= split:
            return _Dominated(members, _cost_of(best, self.objective), split)
        return best

    def _targets(self, members: tuple[str, ...], cg: CandidateGroup, least: int) -> list[int]:
        """Capacities to tile for: the buffer, and the buffer less each operand (so that operand stays on chip)."""
        out = [self.cap]
        for t in cg.reads:
            readers = tuple(m for m in members if t in self.ctx.reads(m))
            if readers:
                left = self.cap - self.ctx.footprint_bytes(t, readers)
                if left >= least:
                    out.append(left)
        return sorted(set(out), reverse=True)[:MAX_TARGETS]


class _Need:
    """A group's buffer need compiled to plain arithmetic (the tiling search evaluates it thousands of times)."""

    def __init__(self, cg: CandidateGroup) -> None:
        self.terms = []
        for t in cg.terms:
            const = t.element_bytes
            var = []
            for f in t.factors:
                if f.tile is None:
                    const *= f.full_size
                else:
                    var.append((f.tile, f.full_size, f.halo_size))
            self.terms.append((const, tuple(var)))
        self._memo: dict[tuple, int] = {}
        self._grids: dict[tuple, np.ndarray] = {}

    def at(self, tiles: dict[str, int]) -> int:
        """``self(tiles)``, memoised (the tiling search asks the same tilings for every capacity and arch)."""
        key = tuple(sorted(tiles.items()))
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self(tiles)
        return got

    def grid_cached(self, tiles: dict[str, int], r0: str, o0: list[int], r1: str, o1: list[int]) -> np.ndarray:
        key = (tuple(sorted(tiles.items())), r0, r1)
        got = self._grids.get(key)
        if got is None:
            got = self._grids[key] = self.grid(tiles, r0, o0, r1, o1)
        return got

    def grid(self, tiles: dict[str, int], r0: str, o0: list[int], r1: str, o1: list[int]) -> np.ndarray:
        """The need for every pair of tiles (o0[i], o1[j]) of two ranks, the others fixed (int64)."""
        a0 = np.asarray(o0, dtype=np.int64)[:, None]
        a1 = np.asarray(o1, dtype=np.int64)[None, :]
        total = np.zeros((len(o0), len(o1)), dtype=np.int64)
        for const, var in self.terms:
            term: np.ndarray | int = const
            for r, full, halo in var:
                if r == r0:
                    term = term * (np.minimum(a0, full) + halo)
                elif r == r1:
                    term = term * (np.minimum(a1, full) + halo)
                else:
                    t = tiles.get(r, full)
                    term = term * ((t if t < full else full) + halo)
            total += term
        return total

    def __call__(self, tiles: dict[str, int]) -> int:
        total = 0
        get = tiles.get
        for const, var in self.terms:
            for r, full, halo in var:
                t = get(r)
                const *= (full if t is None or t >= full else t) + halo
            total += const
        return total


def _largest_fit(need: _Need, tiles: dict[str, int], rank: str, size: int, cap: int) -> int | None:
    """The largest tile of ``rank`` (full extent or a power of two) fitting ``cap`` with the other tiles fixed."""
    opts = _tile_options(size)  # descending; need is monotone in the tile

    def fits(t: int) -> bool:
        return need.at({**tiles, rank: t}) <= cap

    lo, hi = 0, len(opts) - 1
    if not fits(opts[hi]):
        return None
    while lo < hi:  # first index that fits
        mid = (lo + hi) // 2
        if fits(opts[mid]):
            hi = mid
        else:
            lo = mid + 1
    return opts[lo]


def _tilings(cg: _Need, tiled: list[str], size: dict[str, int], cap: int) -> list[dict[str, int]]:
    """Tilings that fit ``cap``: shrink inner loops first (their tiles cause no re-reads of outer-indexed
    operands), and every tile of the outermost loop with the largest fitting tile of the next."""
    out: list[dict[str, int]] = []
    tiles = {r: size[r] for r in tiled}
    for r in reversed(tiled):  # innermost first; the inner ones already shrunk to 1
        t = _largest_fit(cg, tiles, r, size[r], cap)
        if t is not None:
            out.append({**tiles, r: t})
            break
        tiles[r] = 1
    if len(tiled) >= 2:
        r0, r1 = tiled[0], tiled[1]
        rest = {r: size[r] for r in tiled[2:]}
        o0, o1 = _tile_options(size[r0]), _tile_options(size[r1])
        fit = cg.grid_cached(rest, r0, o0, r1, o1) <= cap  # [t0 option, t1 option], options descending
        js = fit.argmax(axis=1)  # the largest fitting t1 (need is monotone in it)
        ok = fit.any(axis=1)
        for i, t0 in enumerate(o0):
            if ok[i]:
                out.append({**rest, r0: t0, r1: o1[int(js[i])]})
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


def _cost_of(c: _Choice, objective: str) -> float:
    return c.latency_s if objective == "latency" else float(c.traffic_bytes)


def _score(c: _Choice, objective: str) -> tuple[float, float]:
    return (c.latency_s, c.traffic_bytes) if objective == "latency" else (c.traffic_bytes, c.latency_s)


def build_space(cascade: Cascade, arch: Arch, objective: str = "latency", *, max_size: int | None = None,
                ctx: CostContext | None = None) -> Space:
    """Enumerate legal candidate groups (connected, convex, fitting) with their best tiling and cost."""
    coster = _Coster(cascade, arch, objective, ctx)
    if not arch.can_fuse:
        max_size = 1
    kept: dict[tuple[str, ...], _Choice | Rejected | _Dominated] = {}

    def keep(members: tuple[str, ...]) -> bool:  # dominated groups are grown: a superset may pay
        kept[members] = coster.choose(members)
        return not isinstance(kept[members], Rejected)

    enumerated = 0
    for members in candidate_groups(cascade, max_size=max_size, keep=keep, dag=coster.dag):
        enumerated += 1
        if members not in kept:  # groups at the size cap are yielded but not offered to keep()
            kept[members] = coster.choose(members)
    candidates, rejected = [], {}
    for members, ch in kept.items():
        if isinstance(ch, _Choice):
            group = FusionGroup(members, ch.loop_order, dict(ch.tiles))
            candidates.append(Candidate(members, group, ch.traffic_bytes, ch.latency_s, ch.buffer_bytes))
        elif len(members) == 1:
            rejected[members[0]] = ch
    space = Space(cascade, arch, objective, candidates, rejected, enumerated, coster.evaluations, max_size, coster.ctx)
    space.best = coster.best
    space.grown = {m for m, ch in kept.items() if not isinstance(ch, Rejected)}
    space.dominated = sum(isinstance(ch, _Dominated) for ch in kept.values())
    space.coster = coster
    return space


def _rename(members: tuple[str, ...], shift: int) -> tuple[str, ...]:
    out = []
    for m in members:
        base, k = split_layer_name(m)
        out.append(layer_name(base, (k or 0) + shift))
    return tuple(out)


def build_chain_space(layer: Cascade, layers: int, arch: Arch, objective: str = "latency", *,
                      max_cross: int = 8, chained: Cascade | None = None) -> tuple[Cascade, Space]:
    """The space of ``chain_layers(layer, layers)`` in time linear in ``layers``.

    Within-layer groups cost the same in every layer (the traffic rule sees the same roles and
    consumers), so the one-layer space is built once and copied per layer; groups that cross a
    layer boundary (out_proj of one layer with the in_proj of the next, the decode adapter) are
    enumerated once on a two-layer chain, up to ``max_cross`` Einsums, and copied per boundary.
    Exact over that space: the only groups left out cross a boundary with more than ``max_cross``.
    """
    chained = chained or chain_layers(layer, layers)
    one = build_space(layer, arch, objective)
    cands: list[Candidate] = []
    for k in range(layers):
        for c in one.candidates:
            names = tuple(layer_name(m, k) for m in c.einsums)
            g = FusionGroup(names, c.group.loop_order, dict(c.group.tiles))
            cands.append(Candidate(names, g, c.traffic_bytes, c.latency_s, c.buffer_bytes))
    enumerated, evaluations = one.enumerated, one.evaluations
    rejected = {layer_name(e, k): r for e, r in one.rejected_singletons.items() for k in range(layers)}
    if layers > 1:
        two = chain_layers(layer, 2)
        within = set(layer.einsum_names)
        coster = _Coster(two, arch, objective, None)
        kept: dict[tuple[str, ...], _Choice | Rejected | _Dominated] = {}

        def base(members: tuple[str, ...]) -> tuple[str, ...] | None:
            """The one-layer names of a group within one layer of the two (None: it crosses)."""
            split = [split_layer_name(m) for m in members]
            if len({k for _, k in split}) == 1 and all(b in within for b, _ in split):
                return tuple(b for b, _ in split)
            return None

        def best_elsewhere(members: tuple[str, ...]) -> float | None:
            b = base(members)
            return None if b is None else one.best.get(b)

        coster.best_elsewhere = best_elsewhere

        def keep(members: tuple[str, ...]) -> bool:
            b = base(members)
            if b is not None:  # within a layer: decided (and costed) by the one-layer space
                return b in one.grown
            kept[members] = coster.choose(members)
            return not isinstance(kept[members], Rejected)

        for members in candidate_groups(two, max_size=max_cross, keep=keep, dag=coster.dag):
            enumerated += 1
            if members not in kept and base(members) is None:
                kept[members] = coster.choose(members)
        for members, ch in kept.items():
            if not isinstance(ch, _Choice):
                if len(members) == 1:
                    rejected.update({_rename(members, k)[0]: ch for k in range(layers - 1)})
                continue
            for k in range(layers - 1):
                names = _rename(members, k)
                g = FusionGroup(names, ch.loop_order, dict(ch.tiles))
                cands.append(Candidate(names, g, ch.traffic_bytes, ch.latency_s, ch.buffer_bytes))
        evaluations += coster.evaluations
    two_coster = coster if layers > 1 else None
    within_names = set(layer.einsum_names)

    def chained_need(group: FusionGroup) -> int:
        """A chained group's buffer need from the one- or two-layer analysis it was costed with (the
        same numbers: layers are renamed copies), so the report never analyses the whole chain."""
        split = [split_layer_name(m) for m in group.einsums]
        ks = {k or 0 for _, k in split}
        lo = min(ks)
        if len(ks) == 1 and all(b in within_names for b, _ in split):
            return one.coster.need(tuple(b for b, _ in split)).at(group.tiles)
        assert two_coster is not None
        return two_coster.need(tuple(layer_name(b, (k or 0) - lo) for b, k in split)).at(group.tiles)

    ctx = CostContext(chained, arch, buffer_need=chained_need)
    space = Space(chained, arch, objective, cands, rejected, enumerated, evaluations, max_cross, ctx)
    space.layer_space = one  # type: ignore[attr-defined]  (the layer-decomposition proof reads it)
    return chained, space
