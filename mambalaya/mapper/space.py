"""The mapper's search space: legal candidate groups, each with its best tiling and its cost.

Per-group cost is a function of the group alone (a group's schedule and its price depend only on
which Einsums are inside it and which of their outputs leave it, and roofline latency is summed
over groups), so the mapper costs every candidate once, here, and the solver only picks an exact
cover. Each candidate's tiling is chosen by :func:`mambalaya.mapper.tiling.best_tiling`, which
lowers and prices every tiling it tries: the mapper's costs are the cost model's, by the same
code. Groups are grown smallest first; one that is illegal, or (in an eager space) that no tiling fits,
is not grown (both only get worse as members are added); a lazy space costs each group of several
Einsums by its composed bound (:mod:`mambalaya.cost.bounds`: no lowering) until a solve picks it, so it
grows every legal group, and searches a pick only as far as some optimal cover could hold it
(:func:`refine`'s limits, :class:`Beyond`). A whole model's candidates are costed
once per *shape*: groups of chained layers that differ only by their layer (``X0_L3`` vs ``X0_L7``)
cost the same, so they share one evaluation (:func:`Coster._shape_key`). The searches of one size run in
forked processes (:func:`search_jobs`): they depend only on smaller groups.

Exact dominance pruning (:meth:`Coster._split`): a legal group costing at least the best split of
it into a source (or sink) Einsum and the rest is left out; it is still grown from. Costs are
compared as (objective, other objective) pairs, lexicographically (the mapper breaks ties by the
other objective), and a group within float noise (:data:`TIE`) of its split on the objective is kept
unless the split is no worse on the other one too: a fused group tying a split on latency but moving
less data must stay a candidate.

Recomputation variants (a group re-running a cheap element-wise producer instead of reading its
off-chip copy) are not built here: the write rule for a recomputed tensor depends on *all* its
consumers' groups, which breaks per-group additivity; :mod:`.recompute` adds them on request, with
the linear rows that keep the cover exact.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial

from mambalaya.analysis.candidates import EinsumDag, GroupEnumeration
from mambalaya.arch import Arch
from mambalaya.cost.bounds import ComposedBounds
from mambalaya.cost.context import CostContext
from mambalaya.cost.legality import GroupAnalysis
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.chain import split_layer_name
from mambalaya.ir.mapping import FusionGroup
from mambalaya.mapper.heap import settle
from mambalaya.mapper.tiling import Tiled, Untileable, best_tiling, remember
from mambalaya.schedule import Lowerer

OBJECTIVES = ("latency", "traffic")
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
    exact: bool = True  # False: a lower bound on every tiling's cost (a lazy space's, until refined)

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
    coster: object = field(repr=False, default=None)  # the Coster that built it (its compiled buffer needs)
    searches: int = 0  # group tile searches it took, when no coster of its own counts them (a chain's)
    lazy: bool = False  # some candidates carry a lower bound, refined (:func:`refine`) when a solve picks them
    #: what a size cap left out of the space (None: nothing): a solve over it is then no proof of the optimum
    left_out: str | None = None
    #: groups proven in no optimal cover, unsearched (:func:`mambalaya.mapper.prune_by_covers`) or their search cut
    #: short once it proved them dearer than any optimal cover lets them be (:func:`refine`)
    pruned: set[tuple[str, ...]] = field(repr=False, default_factory=set)
    #: groups a lazy space searched and found no tiling of fits, or proved beyond their limit by their bound before
    #: trying a tiling (most of those fit nowhere either: the bound is looked at first) (:func:`refine`)
    misfits: int = 0
    bound_pruned: int = 0  # of those, the ones pruned (the others were dropped: no tiling fits)


@dataclass(frozen=True)
class Choice:
    loop_order: tuple[str, ...]
    tiles: tuple[tuple[str, int], ...]
    traffic_bytes: int
    latency_s: float
    buffer_bytes: int
    compute_s: tuple[float, ...] = ()
    transfers: int = 0
    exact: bool = True


@dataclass(frozen=True)
class Beyond:
    """A group whose search proved it costs more than ``limit``, the most any optimal cover lets it cost
    (:func:`refine`): in no optimal cover, so pruned, its search cut short."""

    einsums: tuple[str, ...]
    limit: float
    on_bound: bool = False  # proved by the group's bound alone on an arch with program slots (Untileable.on_bound)


@dataclass(frozen=True)
class Dominated:
    """A legal group some split into two smaller candidates (a source or sink Einsum and the rest)
    costs no more than, even at its cheapest conceivable tiling: never needed for the optimum."""

    einsums: tuple[str, ...]
    lower_bound: Score
    split_cost: Score


@dataclass
class _Shared:
    """What the space of a cascade needs that no architecture changes: the group analyses (legality, loop
    model) and the lowerer's compiled index forms. Shared by every arch and objective mapped on a cascade
    of the same structure and sizes (:func:`shared_analysis`)."""

    analysis: GroupAnalysis
    lowerer: Lowerer
    #: the spaces' costers per (arch, objective): a cascade mapped again (another solver, an evaluation of the
    #: space, a report after a map) reuses every group's search
    costers: OrderedDict[tuple[str, str], Coster] = field(default_factory=OrderedDict)


#: Arch-independent analyses of the last few cascades, keyed by :func:`fingerprint`.
_SHARED: OrderedDict[str, _Shared] = OrderedDict()
SHARED_MAX = 4
#: Costers kept per cascade (the last few archs and objectives it was mapped on).
COSTERS_MAX = 8


def fingerprint(cascade: Cascade) -> str:
    """A digest of everything the analysis reads: params, rank extents, tensors, Einsums (not the name)."""
    text = repr((sorted(cascade.params.items()), cascade.rank_exprs, cascade.tensors, cascade.einsums,
                 cascade.meta.get("layers")))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def clear_shared() -> None:
    """Forget every cached analysis (a benchmark's cold start)."""
    _SHARED.clear()


def shared_analysis(cascade: Cascade) -> _Shared:
    """The arch-independent analysis of ``cascade`` (cached for the last :data:`SHARED_MAX` cascades)."""
    key = fingerprint(cascade)
    got = _SHARED.get(key)
    if got is None:
        analysis = GroupAnalysis(cascade)
        got = _SHARED[key] = _Shared(analysis, Lowerer(cascade, analysis))
        while len(_SHARED) > SHARED_MAX:
            _SHARED.popitem(last=False)
    else:
        _SHARED.move_to_end(key)
    return got


def shared_coster(cascade: Cascade, arch: Arch, objective: str) -> Coster:
    """The coster of ``cascade`` on ``arch`` for ``objective``, kept with the cascade's shared analysis (a group's
    search depends on nothing else: its members, the arch and the objective)."""
    sh = shared_analysis(cascade)
    key = (repr(arch), objective)
    got = sh.costers.get(key)
    if got is None:
        got = sh.costers[key] = Coster(cascade, arch, objective, None)  # (its context: the same shared analysis)
        while len(sh.costers) > COSTERS_MAX:
            sh.costers.popitem(last=False)
    else:
        sh.costers.move_to_end(key)
    return got


#: When a mapping must stop searching groups (``time.perf_counter()`` seconds; None: never), set by
#: :func:`~mambalaya.mapper.optimal_mapping`'s time limit for the searches it runs
SEARCH_DEADLINE: ContextVar[float | None] = ContextVar("mambalaya_search_deadline", default=None)


#: Processes a space searches each size's groups in (:func:`build_space`; 1: this one alone; a lazy space searches only
#: its single Einsums). The groups of one size depend only on smaller ones (their splits), so they are searched at
#: once, each by the same code.
SEARCH_JOBS: ContextVar[int] = ContextVar("mambalaya_search_jobs", default=1)
#: Fewest searches a size must have before other processes are asked (a few are quicker here than sent there).
POOL_FROM = 8
#: ... and a lazy space's refinement (:func:`refine`), whose processes live until the mapping ends
REFINE_POOL_FROM = 4


@contextmanager
def search_jobs(jobs: int):
    """Within it, spaces search each size's groups in ``jobs`` processes (forked: they start with this
    process's caches; where fork is not available, or inside a worker of a pool, in this one)."""
    token = SEARCH_JOBS.set(max(1, int(jobs)))
    try:
        yield
    finally:
        SEARCH_JOBS.reset(token)


def _beyond(limit: float, objective: str, bound) -> bool:
    """Whether a group costing ``bound`` (a :class:`~mambalaya.cost.model.GroupCost` or a tiling's floor) costs
    more than ``limit`` in the objective: then no optimal cover holds it (:meth:`Coster.exact`)."""
    return (bound.latency_s if objective == "latency" else float(bound.traffic_bytes)) > limit


def _gives_up(split: Score, objective: str, bound) -> bool:
    """Whether a group costing ``bound`` (a :class:`~mambalaya.cost.model.GroupCost`) is dominated by its split
    (exact dominance, :meth:`Coster._split`; within :data:`TIE` the other objective decides)."""
    own = (bound.latency_s, float(bound.traffic_bytes)) if objective == "latency" else \
        (float(bound.traffic_bytes), bound.latency_s)
    return own[0] > split[0] * (1 + TIE) or (own[0] >= split[0] and own[1] >= split[1])


_WORKER_CTX: list[CostContext] = []  # a search process's context (:func:`_adopt`)


def _adopt(ctx: CostContext) -> None:
    _WORKER_CTX[:] = [ctx]


def _search(task: tuple) -> tuple[tuple[str, ...], Tiled | Untileable]:
    """One group's tile search in a search process (what :meth:`Coster._choose` runs here otherwise)."""
    members, objective, give_up = task
    settle()
    return members, best_tiling(_WORKER_CTX[0], members, objective, give_up=give_up)


def _fork_pool(ctx: CostContext, jobs: int):
    """``jobs`` forked search processes holding ``ctx`` (None where a pool cannot be forked)."""
    if "fork" not in multiprocessing.get_all_start_methods() or multiprocessing.current_process().daemon:
        return None
    return multiprocessing.get_context("fork").Pool(jobs, initializer=_adopt, initargs=(ctx,))


class OutOfTime(Exception):
    """The time limit passed before a group's tile search (:data:`SEARCH_DEADLINE`): nothing was cached for it."""


def _check_deadline() -> None:
    deadline = SEARCH_DEADLINE.get()
    if deadline is not None and time.perf_counter() > deadline:
        raise OutOfTime


class Coster:
    """Chooses each group's tiling and costs it, caching by layer-relative shape."""

    def __init__(self, cascade: Cascade, arch: Arch, objective: str, ctx: CostContext | None) -> None:
        self.cascade, self.arch, self.objective = cascade, arch, objective
        if ctx is None:
            sh = shared_analysis(cascade)
            ctx = CostContext(cascade, arch, sh.analysis, sh.lowerer)
        self.ctx = ctx
        self.cap = arch.fusion_buffer_bytes
        self.layers = int(cascade.meta.get("layers", 1))
        self.shapes: dict[tuple, Choice | Rejected | Dominated] = {}
        self.evaluations = 0
        self.searched = 0  # group tile searches run (bounds and cache hits not counted)
        self.dag = EinsumDag(cascade)
        self._order = {n: i for i, n in enumerate(cascade.einsum_names)}
        #: best[g]: the least (lexicographic) cost of covering g by candidates (its own or a split's); see :meth:`_split`
        self.best: dict[tuple[str, ...], Score] = {}
        #: for groups this coster does not cost itself (a chain's within-layer groups): their best, or None
        self.best_elsewhere: Callable[[tuple[str, ...]], Score | None] | None = None
        self.dominated = 0
        self._splits: dict[tuple[str, ...], Score] = {}  # _choose's split cost, until choose reads it
        #: searches other processes ran for groups about to be chosen (:meth:`searches`, :func:`build_space`)
        self.prefetched: dict[tuple[str, ...], Tiled | Untileable] = {}
        self.composed = ComposedBounds(self.ctx)  # the first tier of lower bounds (estimate, dominance)
        self._pool = None  # :meth:`prefetch`'s search processes, while a mapping refines its space

    def analyse(self, members: tuple[str, ...]):
        """The analysis of a group (legality, loop order), cached by the cost context."""
        return self.ctx.analysis.analyze(members)

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

    def choose(self, members: tuple[str, ...]) -> Choice | Rejected | Dominated:
        key = self._shape_key(members)
        if key not in self.shapes:
            self.shapes[key] = self._choose(members)
            self.evaluations += 1
        ch = self.shapes[key]
        split = self._splits.pop(members, None)  # what _choose found, if it ran for these members
        if isinstance(ch, Choice):
            self.best[members] = min(_score(ch, self.objective), self._split(members) if split is None else split)
        elif isinstance(ch, Dominated):
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

    def estimate(self, members: tuple[str, ...]) -> Choice | Rejected | Dominated:
        """A group's lower bound as an inexact :class:`Choice` (no tiles): the composed bound
        (:class:`~mambalaya.cost.bounds.ComposedBounds`, no lowering), or Rejected when it is illegal; the full
        choice when it is one Einsum (singletons stay exact: every cover's upper bound is theirs)."""
        if len(members) == 1:
            return self.choose(members)
        key = ("bound", *self._shape_key(members))
        got = self.shapes.get(key)
        if got is None:
            an = self.ctx.analysis
            if not an.legal(members):
                got = Rejected(members, "; ".join(an.problems(members)))
            else:
                b = self.composed.bound(members)
                got = Choice((), (), b.traffic_bytes, b.latency_s, 0, (), b.transfers, exact=False)
            self.shapes[key] = got
            self.evaluations += 1
        return got

    def exact(self, members: tuple[str, ...], limit: float | None = None) -> Choice | Rejected | Beyond:
        """The group's best tiling and cost (no dominance test: a lazy space refines what a solve picked), or, with
        ``limit`` (the most its objective may be for some optimal cover to hold it, :func:`refine`), Beyond
        once its search proves it costs more: the search stops there, and nothing is kept for it."""
        got = self._known(members)
        if got is None:
            got = self._exact(members, limit)
            if not isinstance(got, Beyond):
                self.shapes[("exact", *self._shape_key(members))] = got
            self.evaluations += 1
        return got

    def _known(self, members: tuple[str, ...]) -> Choice | Rejected | None:
        """What :meth:`exact` has for the group without a search: its own earlier answer, or an eager space's."""
        got = self.shapes.get(("exact", *self._shape_key(members)))
        if got is None:
            got = self.shapes.get(self._shape_key(members))
        return got if isinstance(got, Choice | Rejected) else None

    def _limit_test(self, limit: float | None):
        """The give-up test of a search bounded by ``limit`` (:func:`_beyond`; None: none)."""
        return None if limit is None else partial(_beyond, limit, self.objective)

    def _exact(self, members: tuple[str, ...], limit: float | None = None) -> Choice | Rejected | Beyond:
        _check_deadline()
        settle()
        self.searched += 1
        give_up = self._limit_test(limit)
        got = self.prefetched.pop(members, None)
        if got is None:
            got = best_tiling(self.ctx, members, self.objective, give_up=give_up)
        else:  # (searched in another process: kept here as best_tiling keeps its own)
            remember(self.ctx, members, self.objective, None, got, give_up is not None)
        if isinstance(got, Tiled):
            return _choice(got)
        if got.bound is not None:  # (the search gave up on it: it costs more than the limit)
            return Beyond(members, limit, got.on_bound)  # type: ignore[arg-type]
        return Rejected(members, got.reason, got.need_bytes)

    def prefetch(self, groups: list[tuple[str, ...]], limits: dict[tuple[str, ...], float]) -> None:
        """Run the searches :meth:`exact` will run for these groups (with their ``limits``) at once, in the other
        processes (:data:`SEARCH_JOBS`), when there are enough of them to pay for forking."""
        jobs = SEARCH_JOBS.get()
        tasks = [(m, self.objective, self._limit_test(limits.get(m))) for m in groups if self._known(m) is None]
        if jobs < 2 or len(tasks) < REFINE_POOL_FROM:
            return
        if self._pool is None:
            self._pool = _fork_pool(self.ctx, jobs)
        if self._pool is None:
            return
        try:
            for members, got in self._pool.imap_unordered(_search, tasks):
                self.prefetched[members] = got
                _check_deadline()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """End the search processes :meth:`prefetch` forked (a mapping ends them when it is done)."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None

    def _judged(self, members: tuple[str, ...]) -> Choice | Rejected | Dominated | None:
        """What a group is without searching its tiles (illegal, found by a lazy space's search, or dominated
        by its composed bound), or None: it is searched, with :meth:`_give_up`."""
        if not self.ctx.analysis.legal(members):
            return Rejected(members, "; ".join(self.ctx.analysis.problems(members)))
        split = self._splits[members] = self._split(members)
        obj = self.objective
        # what a lazy space already found for these members (an eager space built after it reuses its work)
        known = self.shapes.get(("exact", *self._shape_key(members)))
        if isinstance(known, Rejected):
            return known
        if isinstance(known, Choice):
            return Dominated(members, _score(known, obj), split) if _dominated(known, split, obj) else known
        if len(members) > 1 and _gives_up(split, obj, b := self.composed.bound(members)):
            return Dominated(members, (b.latency_s, float(b.traffic_bytes)) if obj == "latency" else
                             (float(b.traffic_bytes), b.latency_s), split)
        return None

    def _give_up(self, members: tuple[str, ...]):
        """The dominance test a group's search stops on (none for one Einsum: its cost bounds every cover)."""
        return partial(_gives_up, self._splits[members], self.objective) if len(members) > 1 else None

    def searches(self, groups: list[tuple[str, ...]]) -> list[tuple]:
        """The tile searches :meth:`choose` will run for these groups (of one size), as tasks for :func:`_search`."""
        tasks, keys = [], set()
        for members in groups:
            key = self._shape_key(members)
            if key in self.shapes or key in keys or members in self.prefetched:
                continue
            keys.add(key)
            if self._judged(members) is None:
                tasks.append((members, self.objective, self._give_up(members)))
            self._splits.pop(members, None)  # (choose() judges it again)
        return tasks

    def _choose(self, members: tuple[str, ...]) -> Choice | Rejected | Dominated:
        judged = self._judged(members)
        if judged is not None:
            return judged
        split, obj, give_up = self._splits[members], self.objective, self._give_up(members)
        _check_deadline()
        settle()
        self.searched += 1
        got = self.prefetched.pop(members, None)
        if got is None:
            got = best_tiling(self.ctx, members, obj, give_up=give_up)
        else:  # (searched in another process: kept here as best_tiling keeps its own)
            remember(self.ctx, members, obj, None, got, give_up is not None)
        if not isinstance(got, Tiled):
            if got.bound is not None:
                b = got.bound
                return Dominated(members, (b.latency_s, float(b.traffic_bytes)) if obj == "latency" else
                                  (float(b.traffic_bytes), b.latency_s), split)
            return Rejected(members, got.reason, got.need_bytes)
        c = _choice(got)
        return Dominated(members, _score(c, self.objective), split) if _dominated(c, split, self.objective) else c


def _choice(t: Tiled) -> Choice:
    g = t.group
    return Choice(g.loop_order, tuple(g.tiles.items()), t.cost.traffic_bytes, t.cost.latency_s,
                   t.cost.occupancy_bytes, tuple(r.compute_s for r in t.einsums), t.cost.transfers)


def _score(c: Choice, objective: str) -> Score:
    return (c.latency_s, float(c.traffic_bytes)) if objective == "latency" else (float(c.traffic_bytes), c.latency_s)


def _dominated(c: Choice, split: Score, objective: str) -> bool:
    """Whether the split covers the group no worse, lexicographically. The objective decides unless the
    two are within float noise (:data:`TIE`: a tie at the solver's resolution), where the other does."""
    own = _score(c, objective)
    if own[0] < split[0]:
        return False
    return own[0] > split[0] * (1 + TIE) or own[1] >= split[1]


#: What an eager space holds for a group a lazy one proved in no optimal cover: grown from, never searched.
_PROVEN_OUT = Dominated((), (float("inf"), float("inf")), (float("inf"), float("inf")))


def build_space(cascade: Cascade, arch: Arch, objective: str = "latency", *, max_size: int | None = None,
                ctx: CostContext | None = None, lazy: bool = False, coster: Coster | None = None,
                exclude: frozenset[tuple[str, ...]] = frozenset()) -> Space:
    """Enumerate legal candidate groups (connected, convex, fitting) with their best tiling and cost.

    ``lazy``: a group of several Einsums is given a lower bound on its cost (its composed bound: no lowering, no
    tile search, no dominance test) and searched only when a solve picks it (:func:`refine`): a solve whose picks are all
    exact is optimal, since every other candidate costs at least its bound. ``coster``: a lazy space's, whose
    searches and bounds an eager space reuses; without it and ``ctx``, the cascade's shared one
    (:func:`shared_coster`). ``exclude``: groups proven in no optimal cover (a lazy space's ``pruned``), grown
    from but neither searched nor offered."""
    if coster is None:
        coster = shared_coster(cascade, arch, objective) if ctx is None else Coster(cascade, arch, objective, ctx)
    if not arch.can_fuse:
        max_size = 1
    kept: dict[tuple[str, ...], Choice | Rejected | Dominated] = {}
    estimate = coster.estimate if lazy else coster.choose

    def judge(members: tuple[str, ...]) -> Choice | Rejected | Dominated:
        return _PROVEN_OUT if members in exclude else estimate(members)

    def keep(members: tuple[str, ...]) -> bool:  # dominated groups are grown: a superset may pay
        ch = kept.get(members)
        if ch is None:  # (the loop below has usually chosen it already)
            ch = kept[members] = judge(members)
        return not isinstance(ch, Rejected)

    jobs, pool = SEARCH_JOBS.get(), None

    def prepare(level: list[tuple[str, ...]]) -> None:  # one size's searches at once, in the other processes
        nonlocal pool
        if jobs < 2:
            return
        # (a lazy space searches only its single Einsums; the others get bounds)
        tasks = coster.searches([m for m in level if m not in exclude and (not lazy or len(m) == 1)])
        if len(tasks) < POOL_FROM:
            return
        if pool is None:
            pool = _fork_pool(coster.ctx, jobs)
        if pool is None:
            return
        for members, got in pool.imap_unordered(_search, tasks, chunksize=max(1, len(tasks) // (8 * jobs))):
            coster.prefetched[members] = got
            _check_deadline()

    enumerated = 0
    groups = GroupEnumeration(cascade, max_size, keep=keep, dag=coster.dag, prepare=prepare)
    try:
        for members in groups:
            enumerated += 1
            if members not in kept:  # groups at the size cap are yielded but not offered to keep()
                kept[members] = judge(members)
    finally:
        if pool is not None:
            pool.terminate()
        coster.prefetched.clear()
    candidates, rejected = [], {}
    for members, ch in kept.items():
        if isinstance(ch, Choice):
            candidates.append(_candidate(members, ch))
        elif len(members) == 1:
            rejected[members[0]] = ch
    space = Space(cascade, arch, objective, candidates, rejected, enumerated, coster.evaluations, max_size, coster.ctx)
    space.lazy = lazy
    space.best = coster.best
    space.grown = {m for m, ch in kept.items() if not isinstance(ch, Rejected)}
    space.dominated = sum(isinstance(ch, Dominated) and ch is not _PROVEN_OUT for ch in kept.values())
    space.pruned = set(exclude)
    space.coster = coster
    if groups.truncated and max_size is not None and arch.can_fuse:
        space.left_out = f"groups of more than {max_size} Einsums (the size cap; some groups at it could grow)"
    return space


def bound_candidates(space: Space, groups) -> list[Candidate]:
    """These legal groups as candidates at their lower bound (:meth:`Coster.estimate`, no search): what a lazy
    space's pruned groups still are to a chain of its layers, where a group in no optimal cover of one layer may
    be in one of the chain."""
    out = []
    for members in groups:
        ch = space.coster.estimate(members)  # type: ignore[attr-defined]
        if isinstance(ch, Choice):
            out.append(_candidate(members, ch))
    return out


def _candidate(members: tuple[str, ...], ch: Choice) -> Candidate:
    group = FusionGroup(members, ch.loop_order, dict(ch.tiles))
    return Candidate(members, group, ch.traffic_bytes, ch.latency_s, ch.buffer_bytes, ch.compute_s, ch.transfers,
                     exact=ch.exact)


#: Inexact candidates refined with each solve's picks (those of the cheapest covers at the bounds): fewer solves,
#: and enough searches a round for the search processes (the default Mamba-2 on h200, 2 processes: 17.7 s at 4,
#: 14.9 s at 8, 12.3 s at 16; mamba2-370m L4096 on h200 lazy: 11.2 s at 4, 10.6 s at 16).
REFINE_BATCH = 16


def refine(space: Space, picked: list[Candidate], batch: int = REFINE_BATCH,
           limits: dict[tuple[str, ...], float] | None = None) -> None:
    """Replace the inexact candidates among ``picked`` by their searched cost (or drop those no tiling fits), and
    with them ``batch`` more: the first of ``limits`` (cheapest cover first), else those of least bound per
    Einsum (the next a solve would pick). ``limits``: per group, the most its objective may be for some optimal
    cover to hold it (:func:`~mambalaya.mapper.prune_by_covers`); its search stops once it proves the group
    dearer, and the group is pruned."""
    todo = {c.einsums for c in picked if not c.exact}
    if not todo:
        return
    if limits:  # (the groups of the cheapest covers at the bounds: the likeliest in an optimal one)
        todo |= set([g for g in limits if g not in todo][:batch])
    else:
        rest = sorted((c for c in space.candidates if not c.exact and c.einsums not in todo),
                      key=lambda c: c.cost(space.objective) / len(c.einsums))
        todo |= {c.einsums for c in rest[:batch]}
    limits = limits or {}
    coster: Coster = space.coster  # type: ignore[assignment]
    coster.prefetch([c.einsums for c in space.candidates if c.einsums in todo], limits)
    kept = []
    for c in space.candidates:
        if c.einsums not in todo:
            kept.append(c)
            continue
        ch = coster.exact(c.einsums, limits.get(c.einsums))
        space.misfits += isinstance(ch, Rejected) or (isinstance(ch, Beyond) and ch.on_bound)
        space.bound_pruned += isinstance(ch, Beyond) and ch.on_bound
        if isinstance(ch, Beyond):
            space.pruned.add(c.einsums)
        elif isinstance(ch, Choice):
            kept.append(_candidate(c.einsums, ch))
        # (a candidate no tiling fits is dropped)
    space.candidates = kept
    space.evaluations = coster.evaluations
