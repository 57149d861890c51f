"""How big a box is, how big a buffer must be, how many elements a statement moves: the one rule.

Everything is evaluated by walking the tiles of the loops a box moves with (per loop, the
tile ``[lo, hi)`` and whether it is the loop's first), so the numbers here are exactly what an
executor that runs the loop nest moves. To stay fast at a million tokens, a loop's tiles are
enumerated only near its ends when the box is affine in the loop (every interior tile then has
the same size, and clipping to the tensor or a skewed first tile only touches the ends); a box
with a floor or remainder of the loop's rank is enumerated tile by tile.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

from mambalaya.schedule.intervals import Interval
from mambalaya.schedule.ir import AxisBox, Loop, Range

#: tile ``(lo, hi, first)`` per loop index: what a box is evaluated at
State = Mapping[int, tuple[int, int, bool]]
#: loops with at most this many tiles are always enumerated whole
ENUMERATE_UP_TO = 256


def tile_of(loop: Loop, t: int) -> tuple[int, int, bool]:
    lo = t * loop.tile
    return lo, min(lo + loop.tile, loop.extent), t == 0


def rank_interval(r: Range, state: State) -> Interval:
    """Inclusive [lo, hi] of a range at a state (an empty range gives lo > hi)."""
    if r.loop is None or r.loop not in state:  # outside its loop: the whole extent
        return 0, r.size - 1
    lo, hi, first = state[r.loop]
    a, b = r.bounds(lo, hi, first)
    return a, b - 1


def axis_interval(axis: AxisBox, ranges: Mapping[str, Mapping[str, Range]], state: State) -> Interval:
    """The box's inclusive [lo, hi] on one axis at a state, clipped to the axis (lo > hi: empty). Only the
    loops the box moves with count: every other rank spans its whole range (a box hoisted out of a loop
    covers all its tiles)."""
    state = {j: v for j, v in state.items() if j in axis.loops}
    lo, hi = None, None
    for form, member in axis.reads:
        rr = ranges[member]
        iv = {r: rank_interval(rr[r], state) for r in form.ranks}
        if any(a > b for a, b in iv.values()):
            continue
        a, b = form.interval(iv)
        lo = a if lo is None else min(lo, a)
        hi = b if hi is None else max(hi, b)
    if lo is None:
        return 0, -1
    return max(lo, 0), min(hi, axis.size - 1)


def _length(iv: Interval) -> int:
    return max(0, iv[1] - iv[0] + 1)


def is_affine(axis: AxisBox, ranges: Mapping[str, Mapping[str, Range]]) -> bool:
    """No floor or remainder in the forms, and no range is a piece (a floor) of its loop."""
    for form, member in axis.reads:
        if any(t.sub is not None for t in form.terms) or form.den != 1:
            return False
        if any(ranges[member][r].kind == "piece" for r in form.ranks):
            return False
    return True


def _reach(axes: Iterable[AxisBox], ranges: Mapping[str, Mapping[str, Range]], loop: int) -> int:
    """How far (in indices) the boxes reach beyond a tile of ``loop``: their constant offsets, the spans
    of ranks that do not move with the loop, skews: the ends a tile's box can be clipped within."""
    span = 0
    for axis in axes:
        for form, member in axis.reads:
            rr = ranges[member]
            iv = {r: ((0, 0) if rr[r].loop == loop else (0, rr[r].size - 1)) for r in form.ranks}
            a, b = form.interval(iv)
            span = max(span, abs(a), abs(b))
            span = max(span, max((rr[r].skew for r in form.ranks), default=0))
    return span


def tiles_to_walk(loop: Loop, affine: bool, reach: int) -> tuple[list[int], int, int]:
    """(tiles to evaluate, index of the representative interior tile or -1, how many it stands for)."""
    n = loop.trips
    if not affine or n <= ENUMERATE_UP_TO:
        return list(range(n)), -1, 0
    k = 3 + -(-reach // max(1, loop.tile))
    if 2 * k + 1 >= n:
        return list(range(n)), -1, 0
    return [*range(k), k, *range(n - k, n)], k, n - 2 * k - 1


def max_length(axis: AxisBox, loops: tuple[Loop, ...], ranges: Mapping[str, Mapping[str, Range]]) -> int:
    """The longest the box gets on this axis over every tile of the loops it moves with."""
    deps = sorted(axis.loops)
    if not deps:
        return _length(axis_interval(axis, ranges, {}))
    affine = is_affine(axis, ranges)
    walks = [tiles_to_walk(loops[j], affine, _reach([axis], ranges, j))[0] for j in deps]
    best = 0
    for ts in itertools.product(*walks):
        state = {j: tile_of(loops[j], t) for j, t in zip(deps, ts, strict=True)}
        best = max(best, _length(axis_interval(axis, ranges, state)))
    return best


def box_total(axes: tuple[AxisBox, ...], enclosing: tuple[int, ...], loops: tuple[Loop, ...],
              ranges: Mapping[str, Mapping[str, Range]], *, slides: int | None = None,
              slide_loop: int | None = None, first_of: int | None = None,
              guard: frozenset[int] = frozenset()) -> tuple[int, int]:
    """(elements over every execution, executions) of a statement moving this box, run once per
    iteration of the ``enclosing`` loops; ``slides``: along that axis only the indices past the previous
    tile's box of ``slide_loop`` count; ``first_of``: it runs only on that loop's first tile; ``guard``:
    loops whose iterations after the first skip it (a replicated member's store)."""
    deps: dict[int, set[int]] = {i: {j for j in axis.loops if j in enclosing} for i, axis in enumerate(axes)}
    # components: loops joined by axes that move with more than one of them
    comps: list[set[int]] = []
    for js in deps.values():
        if not js:
            continue
        merged = set(js)
        for c in [c for c in comps if c & merged]:
            merged |= c
            comps.remove(c)
        comps.append(merged)
    executions = 1
    for j in enclosing:
        if j in guard:
            continue
        executions *= 1 if j == first_of else loops[j].trips
    total = 1
    in_comp = set().union(*comps) if comps else set()
    for j in enclosing:
        if j not in in_comp and j not in guard and j != first_of:
            total *= loops[j].trips
    static = [i for i, js in deps.items() if not js]
    for i in static:
        total *= _length(axis_interval(axes[i], ranges, {}))
    if total == 0:
        return 0, executions
    for comp in comps:
        js = sorted(comp)
        mine = [i for i, d in deps.items() if d and d <= comp]
        total *= _comp_sum(js, mine, axes, loops, ranges, slides, slide_loop, first_of, guard)
        if total == 0:
            break
    return total, executions


def _comp_sum(js: list[int], mine: list[int], axes, loops, ranges, slides, slide_loop, first_of, guard) -> int:
    """Sum over the tiles of loops ``js`` of the product of the lengths of axes ``mine``."""
    affine = all(is_affine(axes[i], ranges) for i in mine)
    walks, reps = [], []
    for j in js:
        if j == first_of or j in guard:
            walks.append([0])
            reps.append((-1, 0))
            continue
        ts, rep, count = tiles_to_walk(loops[j], affine, _reach([axes[i] for i in mine], ranges, j))
        walks.append(ts)
        reps.append((rep, count))
    total = 0
    for ts in itertools.product(*walks):
        state = {j: tile_of(loops[j], t) for j, t in zip(js, ts, strict=True)}
        weight = 1
        for (rep, count), t in zip(reps, ts, strict=True):
            if t == rep:
                weight *= count + 1
        n = 1
        for i in mine:
            lo, hi = axis_interval(axes[i], ranges, state)
            if i == slides and slide_loop in state:
                # only indices past the previous tile's box are new (the previous tile: same outer tiles)
                t = ts[js.index(slide_loop)]
                if t > 0:
                    before = {**state, slide_loop: tile_of(loops[slide_loop], t - 1)}
                    lo = max(lo, axis_interval(axes[i], ranges, before)[1] + 1)
            n *= max(0, hi - lo + 1)
            if not n:
                break
        total += n * weight
    return total


def window_rows(tile: int, skew: int, behind: int | None, tail_lo: int | None, size: int) -> int:
    """Rows a sliding window keeps: the tile plus how far its readers reach behind it (``behind``: the
    least ``skew + offset`` a reader reads at, at most 0 counts), and what a reader after the loop reads
    from ``tail_lo`` on; at least the first tile (which starts at 0). Capped at the axis size."""
    rows = tile + skew - min(0, behind if behind is not None else 0)
    if tail_lo is not None:
        rows = max(rows, size - tail_lo)
    return min(rows, size)


__all__ = ["ENUMERATE_UP_TO", "State", "axis_interval", "box_total", "is_affine", "max_length", "rank_interval",
           "tile_of", "tiles_to_walk", "window_rows"]
