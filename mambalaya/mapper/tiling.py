"""A group's best tiles: the tilings its schedule admits that fit the arch, costed, the best kept.

Every tiling is judged by lowering it (:meth:`CostContext.lower`) and pricing the schedule, so
what is searched is what runs. The search, per group:

1. untiled, when its schedule fits: every operand is then loaded once and nothing tiled can move
   less or run shorter;
2. else, with the loop order the analysis gives, the tileable loops (fused loops the analysis lets
   a mapping tile) shrunk inner first (inner tiles cause no re-reads of outer-indexed operands):
   each loop in turn, the inner ones at their smallest admitted tile, the largest admitted tile of it
   that fits (binary search: a schedule's occupancy grows with its tiles);
3. and the two outermost tileable loops together: for each admitted tile of the first, the largest
   of the second that fits;
4. without program slots, each loop alone, the others whole: its largest admitted tile that fits (the fewest
   tiles, where the staircases keep the inner loops at their least: a CPU pays for every tile it executes;
   with slots, the descent of :meth:`_Search.spread` explores from the best of 1-3).

Admitted tiles are the extent's divisors and powers of two below it (a chunked rank's tiles must
align with its pieces; the schedule refuses the others, which count as not fitting). The best
fitting tiling by the objective (lexicographic: latency then traffic, or the reverse) is kept.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from functools import cache

from sympy import divisors

from mambalaya.cost.bounds import grid_breakers
from mambalaya.cost.context import CostContext
from mambalaya.cost.latency import memory_seconds, staging_seconds
from mambalaya.cost.model import EinsumCost, GroupCost, group_costs
from mambalaya.cost.price import least_staged_parts, matrix_waste, member_waste
from mambalaya.errors import MambalayaError
from mambalaya.ir.mapping import FusionGroup
from mambalaya.schedule import GridShape, Load, Loop, ScheduleError, extent, piece_class

Score = tuple[float, float]
#: Up to this multiple of the capacity, a least tiling the quick occupancy refuses is lowered to decide (the quick
#: figure is an upper bound: the built schedule hoists and shares what it can)
QUICK_OCCUPANCY_SLACK = 2
#: Most rounds of the local search (:meth:`_Search.descend`); each tries every single and paired move.
DESCENT_ROUNDS = 4
#: Without program slots, a local search runs from the best starting tiling only when it costs more than this
#: multiple of the group's bound (:meth:`_Search.far_from_bound`)
DESCEND_BEYOND = 2.0


@dataclass(frozen=True)
class Tiled:
    """A group at its best tiling, its cost and its Einsums' rows."""

    group: FusionGroup
    cost: GroupCost
    einsums: tuple[EinsumCost, ...] = ()

    def score(self, objective: str) -> Score:
        return score(self.cost, objective)


@dataclass(frozen=True)
class Untileable:
    """No tiling of the group fits (or the group is illegal): why, and the least it needs on chip."""

    einsums: tuple[str, ...]
    reason: str
    need_bytes: int | None = None
    bound: GroupCost | None = None  # a lower bound on every tiling's cost, when the search gave up on it
    #: given up on its bound alone (only its untiled schedule priced), on an arch with program slots (there the bound,
    #: which sees the widest grid, is looked at before whether anything fits; most groups it stops fit nowhere either:
    #: the lazy space counts them with those)
    on_bound: bool = False


@dataclass(frozen=True)
class NoFit:
    """Why one tiling has no cost: the schedule refuses it (``refused``), or it needs more on chip than the arch
    has (its buffers, or its partial sums in registers)."""

    reason: str
    refused: bool = False


@dataclass(frozen=True, slots=True)
class _Floor:
    """What a dominance test reads of a bound at one tiling (:meth:`_Search.hopeless`)."""

    latency_s: float
    traffic_bytes: int


def score(cost: GroupCost, objective: str) -> Score:
    return (cost.latency_s, float(cost.traffic_bytes)) if objective == "latency" else \
        (float(cost.traffic_bytes), cost.latency_s)


@cache
def tile_options(size: int) -> tuple[int, ...]:
    """Tiles below the full extent, largest first: its divisors and the powers of two (the divisors by
    factorising: trial division up to a rank of 10^12 took hours)."""
    opts = {d for d in divisors(size) if d < size} if size > 1 else set()
    p = 1
    while p < size:
        opts.add(p)
        p *= 2
    return tuple(sorted(opts, reverse=True))


def search_order(ctx: CostContext, einsums: tuple[str, ...]) -> tuple[str, ...]:
    """The loop order a group's tilings are searched in first: the analysis's, with a recurrence's loop moved
    innermost on an arch with program slots (the loops outside it can then be the program grid)."""
    return search_orders(ctx, einsums)[0]


def search_orders(ctx: CostContext, einsums: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """Every loop order a group's tilings are searched in: the analysis's and, for a group with a recurrence, the
    same with the recurrence's loop innermost (its state then persists per tile of the other loops: a Mamba-1
    scan at a million tokens cannot hold a whole sequence per tile, and with its loop outermost it keeps every
    channel's state across the sequence's tiles). On an arch with program slots only the latter (the loops
    outside it are the program grid)."""
    order = ctx.analysis.loop_order(einsums)
    seq = {rec.rank for e in einsums if (rec := ctx.cascade.einsum(e).recurrence) is not None}
    inner = tuple(r for r in order if r not in seq) + tuple(r for r in order if r in seq)
    if ctx.arch.program_slots:
        return (inner,)
    return (order,) if inner == order else (order, inner)


class _Search:
    def __init__(self, ctx: CostContext, einsums: tuple[str, ...], objective: str,
                 stored: frozenset[str] | None, order: tuple[str, ...] | None = None) -> None:
        self.ctx, self.einsums, self.objective, self.stored = ctx, einsums, objective, stored
        self.order = search_order(ctx, einsums) if order is None else order
        tileable = {r for r, _ in ctx.analysis.tileable(einsums)}
        self.loops = [r for r in self.order if r in tileable]
        self.size = {r: ctx.cascade.rank_size(r) for r in self.loops}
        # (a GPU grid's: none without program slots, and they ask for the group's loop model)
        self.breakers = grid_breakers(ctx, einsums) if ctx.arch.program_slots else frozenset()
        self.seen: dict[tuple, GroupCost | NoFit] = {}
        self.rows: dict[tuple, tuple[EinsumCost, ...]] = {}
        self.fit: dict[tuple, bool] = {}
        self.refused: set[tuple] = set()  # tilings the schedule refuses (not a size question)
        self.refusals: dict[str, None] = {}  # why, in the order met (a group no tiling fits names them)
        self.why: dict[tuple, NoFit] = {}  # why the quick occupancy says a tiling does not fit
        self.quick: dict[tuple, int] = {}  # the quick occupancy of each tiling it was asked of
        self.cap = ctx.arch.fusion_buffer_bytes
        self.acc = ctx.arch.accumulator_bytes  # 0: partial sums live in the fusion buffer, no register limit
        self.least: int | None = None  # the smallest occupancy seen (for the message when nothing fits)
        self.untiled = None  # the untiled schedule, once lowered
        self._bound: list = []  # bound(), once computed
        self.give_up = None  # run()'s dominance test: a tiling that cannot pass it is not worth lowering
        self._pieces: dict[str, tuple] = {}  # per loop, the pieces of its rank (tile_class)
        self._grids: dict[tuple, GridShape | None] = {}  # shape() by tiled loops and their tiles' classes
        self._dense: dict[str, int] = {}  # per operand, the bytes the untiled schedule loads of it densely (bound())
        #: what each member and each operand stages at least (bound())
        self._staged: tuple[dict[str, int], dict[str, int]] = ({}, {})
        self._waste: dict[str, float] = {}  # each member's matrix-unit waste untiled (bound())
        self._never: frozenset[str] | None = None  # never_in_grid()
        self._outside: dict[tuple, bool] = {}  # outside(), by loop and tile class

    def cost(self, tiles: dict[str, int]) -> GroupCost | NoFit:
        """The cost at these tiles, or why they do not fit."""
        key = tuple(sorted(tiles.items()))
        got = self.seen.get(key)
        if got is None:
            group = FusionGroup(self.einsums, self.order, dict(tiles))
            try:
                sched = self.ctx.lower(group, self.stored, check=False)
            except ScheduleError as err:
                got = NoFit(str(err), refused=True)
                self.refusals[got.reason] = None
            else:
                if not key:
                    self.untiled = sched
                need = sched.occupancy_bytes
                self.least = need if self.least is None else min(self.least, need)
                if need > self.cap:
                    got = NoFit(f"needs {need} bytes on chip")
                elif self.acc and sched.accumulator_bytes > self.acc:
                    got = NoFit(f"needs {sched.accumulator_bytes} bytes of partial sums in registers")
                else:
                    got, rows, _ = group_costs(self.ctx, sched)
                    self.rows[key] = tuple(rows)
            self.seen[key] = got
        return got

    def fits(self, tiles: dict[str, int]) -> bool:
        """Whether the schedule at these tiles fits (its occupancy alone: the statements are not built)."""
        key = tuple(sorted(tiles.items()))
        got = self.fit.get(key)
        if got is None:
            if key in self.seen:
                got = isinstance(self.seen[key], GroupCost)
            else:
                try:
                    need, acc = self.ctx.occupancy(FusionGroup(self.einsums, self.order, dict(tiles)), self.stored)
                except ScheduleError as err:
                    self.seen[key] = NoFit(str(err), refused=True)
                    self.refused.add(key)
                    self.refusals[str(err)] = None
                    got = False
                else:
                    self.least = need if self.least is None else min(self.least, need)
                    self.quick[key] = need
                    got = need <= self.cap and (not self.acc or acc <= self.acc)
                    if not got:  # (an upper bound: the built schedule may need less, so cost() may still try it)
                        self.why[key] = NoFit(f"needs {need} bytes on chip" if need > self.cap
                                              else f"needs {acc} bytes of partial sums in registers")
            self.fit[key] = got
        return got

    def least_tiles(self) -> dict[str, int]:
        """Every tileable loop at its smallest admitted tile (the least any tiling of them holds on chip)."""
        return {r: opts[-1] for r in self.loops if (opts := tile_options(self.size[r]))}

    def least_fitting(self) -> dict[str, int] | None:
        """A tiling at the least tiles of some set of tiled loops that fits (the others whole), or None when none
        does: then no tiling fits. Occupancy grows with the tiles of a fixed set of tiled loops, but not with the
        set: a loop left whole can keep another buffer per tile (Mamba-1's scan with its recurrence rank ``l``
        tiled keeps the state of every ``b, d, n`` across its tiles, 33 MB at the least tiles; with ``l`` whole
        each tile holds its own, 1 KB), so every set is tried, the most tiled first."""
        least = self.least_tiles()
        ranks = list(least)
        for k in range(len(ranks), -1, -1):
            for kept in itertools.combinations(ranks, k):
                tiles = {r: least[r] for r in kept}
                if self.fits(tiles) or self.builds(tiles):
                    return tiles
        return None

    def builds(self, tiles: dict[str, int]) -> bool:
        """Whether the built schedule at ``tiles`` fits where the quick occupancy (an upper bound) says no by at
        most QUICK_OCCUPANCY_SLACK times the capacity (a recurrence's group on a 128-byte buffer: 132 bytes quick,
        the built schedule fits, and no other tiling does)."""
        need = self.quick.get(tuple(sorted(tiles.items())))
        return need is not None and need <= QUICK_OCCUPANCY_SLACK * self.cap and \
            isinstance(self.cost(tiles), GroupCost)

    def fits_nowhere(self) -> bool:
        """Whether no tiling in this loop order fits, decided before searching: its least tiles do not (the quick
        occupancy says so by more than QUICK_OCCUPANCY_SLACK times the capacity, or their schedule is built and
        does not), nor do they with some loops whole (:meth:`least_fitting`). A schedule's occupancy grows with
        its tiles, so then none does; the mapper's lazy space meets many such groups (its bounds do not probe)."""
        least = self.least_tiles()
        if not least or self.fits(least) or tuple(sorted(least.items())) in self.refused:
            return False
        if self.least is not None and self.least <= QUICK_OCCUPANCY_SLACK * self.cap and \
                isinstance(self.cost(least), GroupCost):
            return False
        return self.least_fitting() is None

    def why_none(self) -> str:
        """Why no tiling fits: the least it needs on chip, and what the schedule refused of the tilings that could
        hold less (a max over a tiled rank, a floor read along a tiled loop, ...)."""
        needs = [v.reason for v in (*self.seen.values(), *self.why.values()) if isinstance(v, NoFit) and not v.refused]
        said = needs[0] if needs else "no tiling fits"
        if self.least is not None and needs:
            said = f"needs {self.least} bytes on chip at least"
        if self.refusals:
            said += f"; tiling it is refused: {'; '.join(list(self.refusals)[:3])}"
        return said

    def largest(self, tiles: dict[str, int], rank: str) -> int | None:
        """The largest admitted tile of ``rank`` (the others fixed) that fits: binary search, options descend."""
        opts = tile_options(self.size[rank])
        if not opts or not self.fits({**tiles, rank: opts[-1]}):
            return None
        lo, hi = 0, len(opts) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.fits({**tiles, rank: opts[mid]}):
                hi = mid
            else:
                lo = mid + 1
        return opts[lo]

    def bound(self) -> GroupCost | None:
        """A lower bound on the cost at every tiling, from the untiled schedule (whether or not it fits): its
        compute (tiles only add programs' replicas), its stores and its dense loads (a load covering its box
        densely, :func:`~mambalaya.schedule.extent.dense_box`, moves no less under any tiling; a sparse one may,
        so it counts 0), the least it stages through scratch (:func:`~mambalaya.cost.price.least_staged_bytes`), its
        overheads, over the most of the chip any grid of its loops can reach (:meth:`widest_grid`: tiles may spread
        it over more programs). None when the group has no untiled schedule."""
        if not self._bound:
            self._bound.append(self._lower_bound())
        return self._bound[0]

    def _lower_bound(self) -> GroupCost | None:
        if () not in self.seen:
            self.cost({})
        if self.untiled is None:
            return None
        sched, cascade = self.untiled, self.ctx.cascade
        ranges = {n: dict(zip(cascade.einsum(n).ranks, rs, strict=True)) for n, rs in sched.ranges.items()}
        sparse = 0
        for s, _ in sched.statements():
            if isinstance(s, Load):
                nbytes = s.elements * cascade.tensors[s.tensor].element_bytes
                if not extent.dense_box(s.box, ranges):
                    sparse += nbytes
                elif s.init_of is None:
                    self._dense[s.tensor] = self._dense.get(s.tensor, 0) + nbytes
        got = group_costs(self.ctx, sched)[0]
        traffic = got.traffic_bytes - sparse
        memory = memory_seconds(self.ctx.arch, traffic)
        self._staged = least_staged_parts(self.ctx, sched)  # (what repeated() scales by a grid's trips)
        self._waste = matrix_waste(self.ctx, sched)
        slots = self.ctx.arch.program_slots
        if not slots:
            return replace(got, traffic_bytes=traffic, memory_s=memory, staging_s=0.0,
                           latency_s=max(got.compute_s, memory, got.chain_s) + got.overhead_s)
        frac = min(1.0, self.widest_grid() / slots)  # the most of the chip any tiling's grid can keep busy
        # every recurrence walks all steps of its rank in some program, one after another, at least one block each
        chain = sum(self.ctx.cascade.rank_size(rec.rank) for e in self.einsums
                    if (rec := self.ctx.cascade.einsum(e).recurrence) is not None) * self.ctx.arch.recurrence_step_s
        staging = staging_seconds(self.ctx.arch, sum(self._staged[0].values()) + sum(self._staged[1].values()))
        return replace(got, traffic_bytes=traffic, memory_s=memory, parallel_fraction=frac, staging_s=staging,
                       chain_s=min(chain, got.chain_s),
                       latency_s=max((max(got.compute_s, memory) + staging) / frac, min(chain, got.chain_s))
                       + got.overhead_s)

    def widest_grid(self, tiles: dict[str, int] | None = None) -> int:
        """An upper bound on the programs of a tiling's grid (of any tiling's, without ``tiles``). A GPU's grid is the
        leading loops whose role is parallel, and a loop a rank some member reduces over or scans along follows is
        never one (the member accumulates or carries its state across it, or runs after it, which ends the grid:
        :func:`grid_breakers`), nor is one :meth:`outside` says is in no grid at its tile
        (tests/mapper/test_tiling.py holds both on random cascades and the default Mamba-2's groups). So the grid is
        at most the trips of the tiled loops before the first tiled such loop; without ``tiles``, every other
        tileable loop at tiles of one. A grid of P programs keeps at most ``min(1, P / slots)`` of the chip busy, so
        a group that reduces over all but a batch of one cannot be priced at the whole chip."""
        n = 1
        for r in self.loops:
            if tiles is None:
                if r not in self.breakers and r not in self.never_in_grid():
                    n *= self.size[r]
                continue
            t = tiles.get(r, self.size[r])
            if t >= self.size[r]:
                continue
            if r in self.breakers or self.outside(r, t):
                break
            n *= -(-self.size[r] // t)
        return n

    def outside(self, rank: str, tile: int) -> bool:
        """Whether loop ``rank`` tiled at ``tile`` is in no program grid of any tiling holding it at that tile's class
        (:meth:`CostContext.outside_grid`: refused, or read whole by a member that does not iterate it)."""
        key = (rank, self.tile_class(rank, tile))
        got = self._outside.get(key)
        if got is None:
            got = self._outside[key] = self.ctx.outside_grid(
                FusionGroup(self.einsums, self.order, {rank: tile}), self.stored) is not None
        return got

    def never_in_grid(self) -> frozenset[str]:
        """The loops :meth:`outside` every grid at every tile they admit."""
        if self._never is None:
            self._never = frozenset(r for r in self.loops if r not in self.breakers and
                                    all(self.outside(r, t) for t in tile_options(self.size[r])))
        return self._never

    def shape(self, tiles: dict[str, int]) -> GridShape | None:
        """What the placement of the loops ``tiles`` tiles fixes of its program grid (:meth:`CostContext.grid`:
        decided by which loops are tiled and their tiles' piece classes, so kept per those), or None when the
        schedule refuses them."""
        key = tuple(sorted((r, self.tile_class(r, t)) for r, t in tiles.items() if t < self.size[r]))
        if key in self._grids:
            return self._grids[key]
        try:
            got = self.ctx.grid(FusionGroup(self.einsums, self.order, dict(tiles)), self.stored)
        except ScheduleError:
            got = None
        self._grids[key] = got
        return got

    def tile_class(self, rank: str, tile: int) -> frozenset:
        """How ``tile`` of loop ``rank`` meets the pieces of its rank (:func:`~mambalaya.schedule.piece_class`)."""
        pieces = self._pieces.get(rank)
        if pieces is None:
            pieces = self._pieces[rank] = self.ctx.lowerer.pieces(self.einsums, rank)
        return piece_class(pieces, rank, tile)

    def programs(self, tiles: dict[str, int]) -> int:
        """An upper bound on the programs of the grid at ``tiles`` (0: the schedule refuses them): the trips of its
        :meth:`shape`'s loops, no more than :meth:`widest_grid` allows."""
        shape = self.shape(tiles)
        if shape is None:
            return 0
        return min(self.trips(shape.loops, tiles), self.widest_grid(tiles))

    def trips(self, loops: tuple[str, ...], tiles: dict[str, int]) -> int:
        """The programs of a grid of these loops at ``tiles``."""
        n = 1
        for r in loops:
            n *= -(-self.size[r] // tiles.get(r, self.size[r]))
        return n

    def floor(self, tiles: dict[str, int], exact_grid: bool = True) -> float | None:
        """A lower bound on the latency at ``tiles`` (None: no untiled schedule to bound it by; inf: the schedule
        refuses them): the group's bound (:meth:`bound`) over the most of the chip these tiles' grid can keep busy,
        with what its :meth:`shape` says every program repeats (with ``exact_grid`` False, the grid of
        :meth:`widest_grid` alone, a bound that only falls as a tile grows)."""
        lb = self.bound()
        if lb is None:
            return None
        arch = self.ctx.arch
        slots, per_statement, per_transfer = arch.program_slots, arch.statement_overhead_s, arch.transfer_overhead_s
        compute, memory = lb.compute_s, lb.memory_s
        if exact_grid and (slots or per_statement or per_transfer):
            shape = self.shape(tiles)
            if shape is None:
                return math.inf
            computes, stores = self.more_executions(shape, tiles)
            overhead = lb.overhead_s + per_statement * (computes + stores) + per_transfer * stores
            if not slots:
                return max(max(compute, memory) + lb.staging_s, lb.chain_s) + overhead
            frac = min(1.0, min(self.trips(shape.loops, tiles), self.widest_grid(tiles)) / slots)
            compute, memory, staging = self.repeated(shape, tiles)
            return max((max(compute, memory) + staging) / frac, lb.chain_s) + overhead
        frac = 1.0 if not slots else min(1.0, self.widest_grid(tiles) / slots)
        return max((max(compute, memory) + lb.staging_s) / frac, lb.chain_s) + lb.overhead_s

    def more_executions(self, shape: GridShape, tiles: dict[str, int]) -> tuple[int, int]:
        """(computes, stores): how many more times than untiled the members' computes and stores run at ``tiles`` at
        least (each statement execution costs ``arch.statement_overhead_s``, each store also a transfer): a member
        whose ranges follow a loop is inside it, so it runs once per tile of every loop it follows, and so does its
        store unless it accumulates across some loop (then it is stored after that loop); untiled, each runs once."""
        computes = stores = 0
        plain = set(shape.stores)
        for name, ranges in shape.ranges:
            runs = self.trips(tuple(shape.placed[j] for j in {x.loop for x in ranges if x.loop is not None}), tiles)
            computes += runs - 1
            if name in plain:
                stores += runs - 1
        return computes, stores

    def repeated(self, shape: GridShape, tiles: dict[str, int]) -> tuple[float, float, float]:
        """(compute, memory, staging seconds) at least, at ``tiles`` of this shape: the bound's, and what the programs
        along the grid's certain loops repeat: a member that does not iterate one runs in each of its programs (the
        cost model charges its ops per program, and it stages its output in each), and an operand none of whose
        reads moves with one is loaded whole by each (programs share nothing on chip); so its dense bytes and what
        it stages at least (:meth:`bound`) count once per program more."""
        lb = self.bound()  # (and its untiled schedule's parts: what the programs repeat is counted from them)
        assert lb is not None, "a shape's floor needs the group's bound"
        compute, staged = lb.compute_s, 0
        computes, loads = self._staged
        if self.ctx.arch.matrix_min > 1 and shape.ranges:  # a member's matrix ops wasted on tiles shorter than the
            # unit's least: its ops cost w times, and the bound's cost them w0 times untiled (w >= w0: tiles only
            # shorten ranges, and a GPU schedule placed with its grid puts each member at least as deep, so its
            # ranges are these or shorter); each replica costs at least once more (ops w R >= ops (w + R - 1))
            loops = tuple(Loop(r, self.ctx.cascade.rank_size(r), tiles.get(r, self.ctx.cascade.rank_size(r)))
                          for r in shape.placed)
            for name, ranges in shape.ranges:
                more = member_waste(self.ctx, name, {x.rank: extent.range_length(x, loops) for x in ranges}) - \
                    self._waste.get(name, 1.0)
                if more > 0:
                    compute += self.ctx.matrix_s(name) * more
        for name, loops in shape.replicas:
            if loops:
                n = self.trips(loops, tiles) - 1
                compute += self.ctx.compute_s(name) * n
                staged += computes.get(name, 0) * n
        extra = 0
        for t, loops in shape.rereads:
            if loops:
                n = self.trips(loops, tiles) - 1
                extra += self._dense.get(t, 0) * n
                staged += loads.get(t, 0) * n
        memory = memory_seconds(self.ctx.arch, lb.traffic_bytes + extra) if extra else lb.memory_s
        return compute, memory, lb.staging_s + staging_seconds(self.ctx.arch, staged)

    def hopeless(self, tiles: dict[str, int], best: GroupCost, exact_grid: bool = True) -> bool:
        """Whether no schedule at ``tiles`` can be faster than ``best`` (the latency objective, by :meth:`floor`),
        or than what ``give_up`` (the mapper's dominance test, :meth:`run`) keeps the group for: the search skips
        lowering a tiling whose grid is too small to compete. Exact: the floor is a bound. With ``exact_grid``
        False, by the grid bound that only falls as a tile grows: then no larger tile of a loop can compete either."""
        floor = self.floor(tiles, exact_grid) if self.objective == "latency" else None
        if floor is None:
            return False
        if floor > best.latency_s * (1 + 1e-9):
            return True
        return self.give_up is not None and self.give_up(_Floor(floor, self.bound().traffic_bytes))

    def at_bound(self, cost: GroupCost) -> bool:
        """Whether ``cost`` is the group's bound (to rounding), so no tiling costs less (the latency objective)."""
        lb = self.bound()
        return self.objective == "latency" and lb is not None and cost.latency_s <= lb.latency_s * (1 + 1e-9)

    def far_from_bound(self, cost: GroupCost) -> bool:
        """Whether ``cost`` is more than DESCEND_BEYOND times the group's bound: on an arch without program slots
        the starting tilings are usually near the best (a local search from them tripled the mapping time for
        no better optimum on the shipped cascades), but not always."""
        lb = self.bound()
        return lb is not None and cost.latency_s > DESCEND_BEYOND * lb.latency_s

    def spread(self, tiles: dict[str, int], cost: GroupCost) -> tuple[dict[str, int], GroupCost]:
        """On an arch with program slots: the best of ``tiles`` and the tilings that give the grid about one
        program per slot (each outer loop alone, the two outermost split evenly), then a walk to a neighbouring
        tiling (one loop's tile the next admitted size smaller or larger) while one costs less: more programs fill
        more of the chip until the re-reads they add cost more; a wider reduction tile feeds the matrix unit."""
        slots = self.ctx.arch.program_slots
        best = (dict(tiles), cost)
        if self.at_bound(cost):
            return best

        def better(cand: dict[str, int]) -> None:
            nonlocal best
            if self.hopeless(cand, best[1]):
                return
            c = self.cost(cand)
            if isinstance(c, GroupCost) and score(c, self.objective) < score(best[1], self.objective):
                best = (cand, c)

        def at_trips(r: str, n: int) -> int:  # the largest admitted tile of r giving at least n tiles
            return next((t for t in tile_options(self.size[r]) if -(-self.size[r] // t) >= n), 1)

        have = max(1, cost.programs)
        outer = self.loops[:3]
        for r in outer:
            if have < slots:
                better({**tiles, r: min(tiles.get(r, self.size[r]), at_trips(r, -(-slots // have)))})
        if len(outer) >= 2 and have < slots:
            half = max(1, int((slots / have) ** 0.5))
            better({**tiles, outer[0]: min(tiles.get(outer[0], self.size[outer[0]]), at_trips(outer[0], half)),
                    outer[1]: min(tiles.get(outer[1], self.size[outer[1]]), at_trips(outer[1], -(-slots // (have * half))))})
        return self.descend(*best)

    def descend(self, tiles: dict[str, int], cost: GroupCost) -> tuple[dict[str, int], GroupCost]:
        """Local search from ``tiles`` until no move costs less: one loop's tile set to any admitted size (the
        others fixed), and two loops traded against each other (for each admitted tile of one, the largest of the
        other that fits: occupancy grows with every tile, so only those can be best on the pair's staircase).
        A pair move is what a single one misses: giving one loop room (a smaller tile of another) only pays once
        the first grows into it (a contraction's short side widened to the matrix unit's tile). Single moves run
        until none helps before a round of pairs (pairs are many more lowerings); a tiling whose grid is too small
        to beat the best so far is skipped unlowered (:meth:`hopeless`)."""
        best = (dict(tiles), cost)

        def at(base: dict[str, int], r: str, t: int) -> dict[str, int]:
            return {**base, r: t} if t < self.size[r] else {k: v for k, v in base.items() if k != r}

        def better(cand: dict[str, int]) -> bool:
            """Try ``cand``; False when no larger tile of a loop can do better (see the single moves)."""
            nonlocal best
            if self.hopeless(cand, best[1], exact_grid=False):
                return False
            if self.hopeless(cand, best[1]):  # (its own grid: a larger tile may place differently)
                return True
            if not self.fits(cand):
                return tuple(sorted(cand.items())) in self.refused
            c = self.cost(cand)
            if isinstance(c, GroupCost) and score(c, self.objective) < score(best[1], self.objective):
                best = (cand, c)
            return True

        pair_rounds = 0
        for _ in range(4 * DESCENT_ROUNDS):
            if self.at_bound(best[1]):
                break
            cur = best
            for r in self.loops:
                better(at(cur[0], r, self.size[r]))
                # smallest tile first: a larger tile of one loop holds no less on chip and spreads over no more
                # programs, so once one does not fit (the schedule refusing it aside) or its floor is hopeless,
                # no larger one can do better
                for t in reversed(tile_options(self.size[r])):
                    if not better(at(cur[0], r, t)):
                        break
            if best is not cur:  # (single moves first: pairs are many more lowerings)
                continue
            pair_rounds += 1
            for i, r0 in enumerate(self.loops):
                for r1 in self.loops[i + 1:]:
                    for t0 in (self.size[r0], *tile_options(self.size[r0])):
                        base = at(cur[0], r0, t0)
                        if self.hopeless(at(base, r1, 1), best[1], exact_grid=False):  # (r1's least tile: the widest grid of the pair)
                            continue
                        if self.fits(at(base, r1, self.size[r1])):
                            better(at(base, r1, self.size[r1]))
                        else:
                            t1 = self.largest(base, r1)
                            if t1 is not None:
                                better(at(base, r1, t1))
            if best is cur or pair_rounds >= DESCENT_ROUNDS:
                break
        return best

    def run(self, give_up=None) -> Tiled | Untileable:
        """The best tiling found. ``give_up(cost)`` (a :class:`GroupCost`, a bound or a tiling's): whether a group
        costing that is of no use (the mapper's split dominates it). Tilings whose floor it gives up on are not
        lowered, and a best it gives up on is returned as :class:`Untileable` ("dominated", ``bound`` its cost):
        the search was cut short for it, so it is not the group's answer."""
        untiled = self.cost({})  # lowered whole: the untiled schedule is cheap and tells whether it fits
        slots = self.ctx.arch.program_slots
        if isinstance(untiled, GroupCost) and not slots:
            # (nothing tiled moves less or runs shorter, but for a sparse read: a tile of a diagonal X[i, i] loads
            # only its part of the hull; then the untiled cost is above the bound and the descent looks)
            best = ({}, untiled) if self.objective != "latency" or self.at_bound(untiled) else self.descend({}, untiled)
            return Tiled(FusionGroup(self.einsums, self.order, best[0]), best[1], self.rows[tuple(sorted(best[0].items()))])
        if give_up is not None:
            lb = self.bound()
            if lb is not None and give_up(lb):
                return Untileable(self.einsums, "dominated", None, bound=lb, on_bound=slots > 0)
            self.give_up = give_up if lb is not None else None
        if not isinstance(untiled, GroupCost) and self.fits_nowhere():
            return Untileable(self.einsums, self.why_none(), self.least)
        found: list[dict[str, int]] = []
        fixed: dict[str, int] = {}
        if isinstance(untiled, GroupCost):  # (a GPU's: it fits, and tiles may still pay by spreading it)
            found.append({})
        for r in reversed(self.loops if not found else ()):  # inner loops first, the inner ones already at their least tile
            t = self.largest(fixed, r)
            if t is not None:
                found.append({**fixed, r: t})
                break
            least = {**fixed, r: tile_options(self.size[r])[-1]} if tile_options(self.size[r]) else fixed
            self.fits(least)
            if tuple(sorted(least.items())) not in self.refused:  # (a loop the schedule will not tile stays whole)
                fixed = least
        if len(self.loops) >= 2 and not isinstance(untiled, GroupCost):  # a staircase: as r0's tile falls, r1's largest fitting tile only grows
            r0, r1 = self.loops[0], self.loops[1]
            rest = {r: t for r, t in fixed.items() if r in self.loops[2:]}
            opts1 = (self.size[r1], *tile_options(self.size[r1]))
            j = len(opts1)  # the index of r1's largest fitting tile so far (none yet)
            for t0 in (self.size[r0], *tile_options(self.size[r0])):
                base = {**rest, r0: t0} if t0 < self.size[r0] else dict(rest)
                while j > 0 and self.fits({**base, r1: opts1[j - 1]} if opts1[j - 1] < self.size[r1] else base):
                    j -= 1
                if j < len(opts1):
                    found.append({**base, r1: opts1[j]} if opts1[j] < self.size[r1] else base)
        if not isinstance(untiled, GroupCost) and not slots:  # each loop alone (the others whole): fewest tiles
            for r in self.loops:
                t = self.largest({}, r)
                if t is not None:
                    found.append({r: t})
        best = None
        for tiles in found:
            c = self.cost(tiles)
            if isinstance(c, GroupCost) and (best is None or score(c, self.objective) < score(best[1], self.objective)):
                best = (tiles, c)
        if best is None:  # the quick occupancy (fits) is an upper bound: the built schedule may still fit
            least = self.least_tiles()
            c = self.cost(least)
            if isinstance(c, GroupCost):
                best = (least, c)
        if best is None and (start := self.least_fitting()) is not None:  # (some loops whole: see least_fitting)
            c = self.cost(start)
            if isinstance(c, GroupCost):
                best = self.descend(start, c)
        if best is not None and slots:
            best = self.spread(*best)
        elif best is not None and self.far_from_bound(best[1]):  # (a GEMM over a batch of 64 kept every start's
            # partial sums whole along the batch and re-read its input per tile: MARCA's X0 at seqlen 2^17, 225x its bound)
            best = self.descend(*best)
        if best is None:
            return Untileable(self.einsums, self.why_none(), self.least)
        if self.give_up is not None and self.give_up(best[1]):
            return Untileable(self.einsums, "dominated", None, bound=best[1])
        return Tiled(FusionGroup(self.einsums, self.order, best[0]), best[1], self.rows[tuple(sorted(best[0].items()))])


def tiling_floor(ctx: CostContext, einsums: tuple[str, ...], tiles: dict[str, int],
                 stored: frozenset[str] | None = None) -> float | None:
    """The lower bound on the group's latency at ``tiles`` that lets the search skip lowering them (None: none)."""
    return _Search(ctx, tuple(einsums), "latency", stored).floor(tiles)


def best_tiling(ctx: CostContext, einsums: tuple[str, ...], objective: str = "latency",
                stored: frozenset[str] | None = None, give_up=None) -> Tiled | Untileable:
    """The group's best tiling on ``ctx.arch`` (module docstring), or why none fits. ``give_up(bound)``: when
    the untiled schedule does not fit, a predicate on the lower bound it gives (a :class:`GroupCost`) that
    ends the search (a mapper's dominance test); the result is then :class:`Untileable` with that bound."""
    key = (tuple(einsums), objective, stored)
    got = ctx.tilings.get(key)
    if got is not None:
        return got  # type: ignore[return-value]
    an = ctx.analysis
    if not an.legal(einsums):
        return Untileable(einsums, "; ".join(an.problems(einsums)))
    best: Tiled | Untileable | None = None
    for order in search_orders(ctx, tuple(einsums)):
        try:
            got = _Search(ctx, tuple(einsums), objective, stored, order).run(give_up)
        except MambalayaError as err:
            got = Untileable(einsums, str(err))
        if best is None or (isinstance(got, Tiled) and (not isinstance(best, Tiled)
                                                        or got.score(objective) < best.score(objective))):
            best = got
    remember(ctx, einsums, objective, stored, best, give_up is not None)  # type: ignore[arg-type]
    return best  # type: ignore[return-value]


def remember(ctx: CostContext, einsums: tuple[str, ...], objective: str, stored: frozenset[str] | None,
             got: Tiled | Untileable, gave_up: bool) -> None:
    """Keep a search's result as the group's answer (:func:`best_tiling` asks first), unless it searched with a
    ``give_up`` test and did not find a tiling: then it may have stopped short."""
    if isinstance(got, Tiled) or not gave_up:
        ctx.tilings[(tuple(einsums), objective, stored)] = got


__all__ = ["NoFit", "Tiled", "Untileable", "best_tiling", "remember", "score", "search_order",
           "search_orders", "tile_options", "tiling_floor"]
