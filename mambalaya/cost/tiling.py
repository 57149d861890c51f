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
   of the second that fits.

Admitted tiles are the extent's divisors and powers of two below it (a chunked rank's tiles must
align with its pieces; the schedule refuses the others, which count as not fitting). The best
fitting tiling by the objective (lexicographic: latency then traffic, or the reverse) is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from mambalaya.cost.context import CostContext
from mambalaya.cost.model import EinsumCost, GroupCost, group_costs
from mambalaya.errors import MambalayaError
from mambalaya.ir.mapping import FusionGroup
from mambalaya.schedule import Load, ScheduleError, extent

Score = tuple[float, float]


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


def score(cost: GroupCost, objective: str) -> Score:
    return (cost.latency_s, float(cost.traffic_bytes)) if objective == "latency" else \
        (float(cost.traffic_bytes), cost.latency_s)


@cache
def tile_options(size: int) -> tuple[int, ...]:
    """Tiles below the full extent, largest first: its divisors and the powers of two."""
    opts = {d for d in range(1, size) if size % d == 0}
    p = 1
    while p < size:
        opts.add(p)
        p *= 2
    return tuple(sorted(opts, reverse=True))


class _Search:
    def __init__(self, ctx: CostContext, einsums: tuple[str, ...], objective: str,
                 stored: frozenset[str] | None) -> None:
        self.ctx, self.einsums, self.objective, self.stored = ctx, einsums, objective, stored
        an = ctx.analysis
        self.order = an.loop_order(einsums)
        self.loops = [r for r, _ in an.tileable(einsums)]
        self.size = {r: ctx.cascade.rank_size(r) for r in self.loops}
        self.seen: dict[tuple, GroupCost | str] = {}
        self.rows: dict[tuple, tuple[EinsumCost, ...]] = {}
        self.fit: dict[tuple, bool] = {}
        self.refused: set[tuple] = set()  # tilings the schedule refuses (not a size question)
        self.cap = ctx.arch.fusion_buffer_bytes
        self.least: int | None = None  # the smallest occupancy seen (for the message when nothing fits)

    def cost(self, tiles: dict[str, int]) -> GroupCost | str:
        """The cost at these tiles, or why they do not fit."""
        key = tuple(sorted(tiles.items()))
        got = self.seen.get(key)
        if got is None:
            group = FusionGroup(self.einsums, self.order, dict(tiles))
            try:
                sched = self.ctx.lower(group, self.stored, check=False)
            except ScheduleError as err:
                got = str(err)
            else:
                need = sched.occupancy_bytes
                self.least = need if self.least is None else min(self.least, need)
                if need > self.cap:
                    got = f"needs {need} bytes on chip"
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
                    need = self.ctx.occupancy(FusionGroup(self.einsums, self.order, dict(tiles)), self.stored)
                except ScheduleError as err:
                    self.seen[key] = str(err)
                    self.refused.add(key)
                    got = False
                else:
                    self.least = need if self.least is None else min(self.least, need)
                    got = need <= self.cap
                    if not got:
                        self.seen[key] = f"needs {need} bytes on chip"
            self.fit[key] = got
        return got

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
        """The untiled schedule's cost, whether or not it fits: when every load covers its box densely
        (:func:`~mambalaya.schedule.extent.dense_box`), no tiling loads less, computes less or runs faster
        (tiles only add re-reads, transfers and programs), so it bounds every tiling from below. None
        when a load is sparse (a tile would clip its hull) or the group has no untiled schedule."""
        group = FusionGroup(self.einsums, self.order)
        try:
            sched = self.ctx.lower(group, self.stored, check=False)
        except ScheduleError:
            return None
        ranges = {n: dict(zip(self.ctx.cascade.einsum(n).ranks, rs, strict=True)) for n, rs in sched.ranges.items()}
        if not all(extent.dense_box(s.box, ranges) for s, _ in sched.statements() if isinstance(s, Load)):
            return None
        return group_costs(self.ctx, sched)[0]

    def run(self, give_up=None) -> Tiled | Untileable:
        untiled = self.cost({})  # lowered whole: the untiled schedule is cheap and tells whether it fits
        if isinstance(untiled, GroupCost):
            return Tiled(FusionGroup(self.einsums, self.order), untiled, self.rows[()])
        if give_up is not None:
            lb = self.bound()
            if lb is not None and give_up(lb):
                return Untileable(self.einsums, "dominated", None, bound=lb)
        found: list[dict[str, int]] = []
        fixed: dict[str, int] = {}
        for r in reversed(self.loops):  # inner loops first, the inner ones already at their least tile
            t = self.largest(fixed, r)
            if t is not None:
                found.append({**fixed, r: t})
                break
            least = {**fixed, r: tile_options(self.size[r])[-1]} if tile_options(self.size[r]) else fixed
            self.fits(least)
            if tuple(sorted(least.items())) not in self.refused:  # (a loop the schedule will not tile stays whole)
                fixed = least
        if len(self.loops) >= 2:  # a staircase: as r0's tile falls, r1's largest fitting tile only grows
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
        best = None
        for tiles in found:
            c = self.cost(tiles)
            if isinstance(c, GroupCost) and (best is None or score(c, self.objective) < score(best[1], self.objective)):
                best = (tiles, c)
        if best is None:
            reasons = [v for v in self.seen.values() if isinstance(v, str)]
            return Untileable(self.einsums, reasons[0] if reasons else "no tiling fits", self.least)
        return Tiled(FusionGroup(self.einsums, self.order, best[0]), best[1], self.rows[tuple(sorted(best[0].items()))])


def best_tiling(ctx: CostContext, einsums: tuple[str, ...], objective: str = "latency",
                stored: frozenset[str] | None = None, give_up=None) -> Tiled | Untileable:
    """The group's best tiling on ``ctx.arch`` (module docstring), or why none fits. ``give_up(bound)``: when
    the untiled schedule does not fit, a predicate on the lower bound it gives (a :class:`GroupCost`) that
    ends the search (a mapper's dominance test); the result is then :class:`Untileable` with that bound."""
    an = ctx.analysis
    if not an.legal(einsums):
        return Untileable(einsums, "; ".join(an.problems(einsums)))
    try:
        return _Search(ctx, tuple(einsums), objective, stored).run(give_up)
    except MambalayaError as err:
        return Untileable(einsums, str(err))


__all__ = ["Tiled", "Untileable", "best_tiling", "score", "tile_options"]
