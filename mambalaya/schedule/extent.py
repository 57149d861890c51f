"""How big a box is, how big a buffer must be, how many elements a statement moves: the one rule.

Everything is evaluated by walking the tiles of the loops a box moves with (per loop, the
tile ``[lo, hi)`` and whether it is the loop's first), so the numbers here are exactly what an
executor that runs the loop nest moves. To stay fast at a million tokens, a loop's tiles are
enumerated only near its ends when the box is affine in the loop (every interior tile then has
the same size, and clipping to the tensor or a skewed first tile only touches the ends); a box
with a floor or remainder of the loop's rank is enumerated tile by tile. Many tiles at once are
evaluated with numpy (:meth:`AxisFn.intervals`): the same tiles, the same integer arithmetic.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import replace

import numpy as np

from mambalaya.schedule.intervals import IndexForm, Interval
from mambalaya.schedule.ir import AxisBox, Loop, Range

#: tile ``(lo, hi, first)`` per loop index: what a box is evaluated at
State = Mapping[int, tuple[int, int, bool]]
#: loops with at most this many tiles are always enumerated whole
ENUMERATE_UP_TO = 16
#: walks over more tile combinations than this are evaluated as numpy arrays (below it, plain Python is quicker)
VECTOR_FROM = 48
#: an array's "no interval" marker (far beyond any index)
_FAR = np.int64(1) << 60


def tile_of(loop: Loop, t: int) -> tuple[int, int, bool]:
    lo = t * loop.tile
    return lo, min(lo + loop.tile, loop.extent), t == 0


def tiles_of(loop: Loop, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`tile_of` at an array of tile indices."""
    lo = ts * loop.tile
    return lo, np.minimum(lo + loop.tile, loop.extent), ts == 0


def range_bounds(r: Range, lo: np.ndarray, hi: np.ndarray, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`Range.bounds` at arrays of tiles (numpy's ``//`` and ``%`` floor as Python's do)."""
    if r.kind == "full":
        return np.int64(0), np.int64(r.size)
    if r.kind == "tile":
        a = np.where(first, 0, lo + r.skew)
        return np.maximum(a, 0), np.minimum(hi + r.skew, r.size)
    if r.kind == "parent":
        return np.maximum(lo * r.scale + r.offset, 0), np.minimum(hi * r.scale + r.offset, r.size)
    a, b = (lo - r.offset) // r.divisor, (hi - 1 - r.offset) // r.divisor
    if r.modulus is not None:
        m = r.modulus
        same = a // m == b // m
        a, b = np.where(same, a % m, 0), np.where(same, b % m, m - 1)
    return np.maximum(a, 0), np.minimum(b + 1, r.size)


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


class AxisFn:
    """An :class:`AxisBox` compiled against its members' ranges: :meth:`interval` is :func:`axis_interval` in
    plain integer arithmetic (the lowering and the mapper evaluate boxes millions of times). Reads with a
    floor or remainder of a moving rank use the general evaluator."""

    __slots__ = ("axis", "ranges", "size", "loops", "deps", "reads", "static", "generic", "affine", "_reach", "memo",
                 "shape", "canon", "lengths")

    def __init__(self, axis: AxisBox, ranges: Mapping[str, Mapping[str, Range]], memo: dict | None = None) -> None:
        self.axis, self.ranges, self.size, self.loops = axis, ranges, axis.size, axis.loops
        self.deps = tuple(sorted(axis.loops))
        self.lengths: dict[tuple, int] = {}  # max_length by its loops' (tile, extent): asked thousands of times each
        self.static: Interval | None = None
        self.generic = False
        self.affine = is_affine(axis, ranges)
        self._reach: dict[tuple[int, int], int] = {}
        self.memo = memo  # results of max_length and box_total keyed by what they depend on (see `shape`)
        self.shape: tuple | None = None  # the compiled reads, which with the loops' tiles decide every interval
        self.canon: tuple | None = None  # `shape` with its loops numbered in order (shared by equal boxes)
        reads = []
        for form, member in axis.reads:
            rr = ranges[member]
            moving = [t for t in form.terms if (t.rank is not None and rr[t.rank].loop in axis.loops)
                      or (t.sub is not None and any(rr[r].loop in axis.loops for r in t.sub.ranks))]
            if any(t.sub is not None for t in moving) or form.den != 1:
                self.generic = True
                break
            fixed = IndexForm(form.const, tuple(t for t in form.terms if t not in moving))
            a, b = fixed.interval({r: (0, rr[r].size - 1) for r in fixed.ranks}) if fixed.terms else (form.const,
                                                                                                        form.const)
            reads.append((a, b, tuple((t.coef, rr[t.rank]) for t in moving)))
        self.reads = tuple(reads)
        if not self.generic and not axis.loops:
            self.static = self.interval({})
        if memo is None:
            pass
        elif self.generic:  # (its key is itself: equal boxes over equal ranges share one AxisFn, see lower.Forms)
            self.shape = self.canon = (self,)
        else:
            self.shape = (self.size, self.affine, self.reads)
            number = {j: i for i, j in enumerate(sorted(axis.loops))}
            self.canon = (self.size, self.affine, tuple(
                (a, b, tuple((c, replace(r, loop=number.get(r.loop, -1)) if r.loop is not None else r) for c, r in terms))
                for a, b, terms in self.reads))

    def interval(self, state: State) -> Interval:
        if self.static is not None:
            return self.static
        if self.generic:
            return axis_interval(self.axis, self.ranges, state)
        lo = hi = None
        for a, b, terms in self.reads:
            empty = False
            for coef, r in terms:
                st = state.get(r.loop) if r.loop is not None else None
                if st is None:
                    x0, x1 = 0, r.size - 1
                elif r.kind == "tile":
                    x0 = 0 if st[2] else st[0] + r.skew
                    x1 = min(st[1] + r.skew, r.size) - 1
                    x0 = max(x0, 0)
                else:
                    x0, x1 = r.bounds(st[0], st[1], st[2])
                    x1 -= 1
                if x0 > x1:
                    empty = True
                    break
                if coef >= 0:
                    a += coef * x0
                    b += coef * x1
                else:
                    a += coef * x1
                    b += coef * x0
            if empty:
                continue
            lo = a if lo is None or a < lo else lo
            hi = b if hi is None or b > hi else hi
        if lo is None:
            return 0, -1
        return (lo if lo > 0 else 0), (hi if hi < self.size - 1 else self.size - 1)

    def intervals(self, state: Mapping[int, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`interval` at arrays of tiles (``state``: per loop, :func:`tiles_of`'s arrays, broadcastable
        against each other): arrays of ``lo`` and ``hi``. Not for a generic box (a floor or remainder of a
        moving rank)."""
        if self.static is not None:
            return np.int64(self.static[0]), np.int64(self.static[1])
        assert not self.generic, "a generic box is evaluated tile by tile"
        lo = hi = None
        for a, b, terms in self.reads:
            a0, b0, ok = np.int64(a), np.int64(b), True
            for coef, r in terms:
                st = state.get(r.loop) if r.loop is not None else None
                if st is None:
                    x0, x1 = np.int64(0), np.int64(r.size - 1)
                else:
                    x0, x1 = range_bounds(r, *st)
                    x1 = x1 - 1
                ok = ok & (x0 <= x1)
                if coef >= 0:
                    a0, b0 = a0 + coef * x0, b0 + coef * x1
                else:
                    a0, b0 = a0 + coef * x1, b0 + coef * x0
            a0, b0 = np.where(ok, a0, _FAR), np.where(ok, b0, -_FAR)  # (an empty read adds nothing to the hull)
            lo = a0 if lo is None else np.minimum(lo, a0)
            hi = b0 if hi is None else np.maximum(hi, b0)
        if lo is None:
            return np.int64(0), np.int64(-1)
        empty = lo > hi  # (every read empty)
        return np.where(empty, 0, np.maximum(lo, 0)), np.where(empty, -1, np.minimum(hi, self.size - 1))

    def reach(self, loop: int, extent: int) -> int:
        key = (loop, extent)
        got = self._reach.get(key)
        if got is None:
            got = self._reach[key] = _reach([self.axis], self.ranges, loop, extent)
        return got


def is_affine(axis: AxisBox, ranges: Mapping[str, Mapping[str, Range]]) -> bool:
    """Whether every interior tile of a loop gives the box the same length (then one stands for them all): no
    floor or remainder in the forms, no range a piece (a floor) of its loop, and every read moving at one rate
    along each loop (the hull of ``X[l]`` and ``X[8*c + q]`` under tiles of ``c`` grows tile by tile)."""
    rates: list[dict[int, int]] = []  # per read, how far it moves per index of each loop
    for form, member in axis.reads:
        if any(t.sub is not None for t in form.terms) or form.den != 1:
            return False
        if any(ranges[member][r].kind == "piece" for r in form.ranks):
            return False
        mine: dict[int, int] = {}
        for t in form.terms:
            x = ranges[member][t.rank]
            if x.loop is not None:
                mine[x.loop] = mine.get(x.loop, 0) + t.coef * (x.scale if x.kind == "parent" else 1)
        rates.append(mine)
    loops = set().union(*rates) if rates else set()
    return all(len({r.get(j, 0) for r in rates}) == 1 for j in loops)


def rises_with(axis: AxisBox, ranges: Mapping[str, Mapping[str, Range]], loop: int) -> bool:
    """Whether the box only moves up as ``loop`` advances: in every read, each term in a rank that follows the
    loop has a positive coefficient (a floor of such a sum too; a remainder, or a piece of the loop that wraps
    around, does not rise). A sliding window keeps the newest rows at its top, so only such a box may slide:
    ``W[p - q + P]`` tiled along ``q`` moves down, and loading only the rows past the previous tile's top
    would miss the new rows below it."""
    return all(_rises(form, ranges[member], loop) for form, member in axis.reads)


def _rises(form: IndexForm, rr: Mapping[str, Range], loop: int) -> bool:
    for t in form.terms:
        if t.rank is not None:
            x = rr[t.rank]
            if x.loop == loop and (t.coef < 0 or (x.kind == "piece" and x.modulus is not None)):
                return False
        elif t.sub is not None and any(rr[r].loop == loop for r in t.sub.ranks):
            if t.modulus is not None or t.coef < 0 or not _rises(t.sub, rr, loop):
                return False
    return True


def _reach(axes: Iterable[AxisBox], ranges: Mapping[str, Mapping[str, Range]], loop: int, extent: int) -> int:
    """How far (in indices) the boxes that move with ``loop`` reach beyond its tile: their constant offsets,
    the spans of ranks that do not move with the loop, skews, how much shorter than the loop a rank that
    follows it is, and how far past either end of the axis a read reaches: the ends within which a tile's box can
    be clipped."""
    span = 0
    for axis in axes:
        if loop not in axis.loops:
            continue
        for form, member in axis.reads:
            rr = ranges[member]
            iv = {r: ((0, 0) if rr[r].loop == loop else (0, rr[r].size - 1)) for r in form.ranks}
            a, b = form.interval(iv)
            span = max(span, abs(a), abs(b))
            # (tiles whose box lies past either end of the axis are clipped too: a read of a 4-row tensor along a
            # rank of 100 reads nothing at 96 of its tiles)
            a, b = form.interval({r: (0, rr[r].size - 1) for r in form.ranks})
            span = max(span, -a, b - (axis.size - 1))
            for r in form.ranks:
                x = rr[r]
                if x.loop == loop:
                    span = max(span, x.skew, extent * x.scale - x.size)
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


def dense_box(box: tuple[AxisBox, ...], ranges: Mapping[str, Mapping[str, Range]]) -> bool:
    """Whether every read of the box covers its hull with no gaps over whole ranges (:func:`dense_read`). Only then
    can tiling never load less than the untiled box (a smaller tile of a sparse read clips its hull)."""
    if not box:
        return True
    for k in range(len(box[0].reads)):
        member = box[0].reads[k][1]
        if not dense_read(tuple(axis.reads[k][0] for axis in box), {r: x.size for r, x in ranges[member].items()}):
            return False
    return True


def dense_read(forms: Iterable[IndexForm], sizes: Mapping[str, int]) -> bool:
    """Whether one read over whole ranks of these ``sizes`` covers its hull with no gaps: each axis a mixed-radix
    contiguous form (``l``, ``c*256 + q`` with q below 256; no floor, remainder or stride) and no rank in two axes
    (a diagonal ``X[i, i]`` covers a hull of n*n for n elements)."""
    seen: set[str] = set()
    for form in forms:
        if form.den != 1:
            return False
        span = 0
        for t in sorted(form.terms, key=lambda t: abs(t.coef)):
            if t.rank is None and t.sub is None:  # a constant
                continue
            if t.sub is not None or t.rank in seen or abs(t.coef) > span + 1:
                return False
            seen.add(t.rank)
            span += abs(t.coef) * (sizes[t.rank] - 1)
    return True


def range_length(r: Range, loops: tuple[Loop, ...]) -> int:
    """The most indices the range spans at any tile of its loop (the static bound of code looping over it)."""
    if r.loop is None:
        return r.size
    lp = loops[r.loop]
    return _range_spans(r, lp.tile, lp.extent)[1]


def range_is_uniform(r: Range, loops: tuple[Loop, ...]) -> bool:
    """Whether the range spans the same number of indices at every tile of its loop (then code over it needs
    no mask beyond that static length)."""
    if r.loop is None:
        return True
    lp = loops[r.loop]
    least, most = _range_spans(r, lp.tile, lp.extent)
    return least == most


@functools.lru_cache(maxsize=1 << 16)
def _range_spans(r: Range, tile: int, extent: int) -> tuple[int, int]:  # (the mapper asks it of every tiling)
    """(least, most) indices the range spans over the loop's tiles."""
    lp = Loop(r.rank, extent, tile)
    spans = [b - a for a, b in (r.bounds(*tile_of(lp, t)) for t in range(lp.trips))]
    return min(spans), max(spans)


def max_length(fn: AxisFn, loops: tuple[Loop, ...]) -> int:
    """The longest the box gets on this axis over every tile of the loops it moves with."""
    if fn.static is not None:
        return _length(fn.static)
    tiles = tuple((loops[j].tile, loops[j].extent) for j in fn.deps)
    got = fn.lengths.get(tiles)
    if got is None:
        if fn.canon is not None:  # the mapper asks the same question of thousands of groups
            key = ("max", fn.canon, tiles)
            got = fn.memo.get(key)
            if got is None:
                got = fn.memo[key] = _max_length(fn, loops, list(fn.deps))
        else:
            got = _max_length(fn, loops, list(fn.deps))
        fn.lengths[tiles] = got
    return got


def _grid(walks: list[list[int]]) -> list[np.ndarray]:
    """Each walk as an array along its own axis (their combinations by broadcasting)."""
    out = []
    for i, w in enumerate(walks):
        shape = [1] * len(walks)
        shape[i] = len(w)
        out.append(np.asarray(w, dtype=np.int64).reshape(shape))
    return out


def _combinations(walks: list[list[int]]) -> int:
    n = 1
    for w in walks:
        n *= len(w)
    return n


def _max_length(fn: AxisFn, loops: tuple[Loop, ...], deps: list[int]) -> int:
    walks = [tiles_to_walk(loops[j], fn.affine, fn.reach(j, loops[j].extent))[0] for j in deps]
    if not fn.generic and _combinations(walks) > VECTOR_FROM:
        lo, hi = fn.intervals({j: tiles_of(loops[j], ts) for j, ts in zip(deps, _grid(walks), strict=True)})
        return max(0, int((hi - lo).max()) + 1)
    best = 0
    for ts in itertools.product(*walks):
        state = {j: tile_of(loops[j], t) for j, t in zip(deps, ts, strict=True)}
        iv = fn.interval(state)
        n = iv[1] - iv[0] + 1
        if n > best:
            best = n
    return best


def box_total(fns: tuple[AxisFn, ...], enclosing: tuple[int, ...], loops: tuple[Loop, ...], *,
              slides: int | None = None, slide_loop: int | None = None, first_of: int | None = None,
              guard: frozenset[int] = frozenset()) -> tuple[int, int]:
    """(elements over every execution, executions) of a statement moving this box, run once per
    iteration of the ``enclosing`` loops; ``slides``: along that axis only the indices past the previous
    tile's box of ``slide_loop`` count; ``first_of``: it runs only on that loop's first tile; ``guard``:
    loops whose iterations after the first skip it (a replicated member's store)."""
    memo = fns[0].memo if fns else None
    if memo is not None and all(fn.shape is not None for fn in fns):
        used = sorted(set(enclosing).union(*(fn.loops for fn in fns)))
        key = ("total", tuple(fn.shape for fn in fns), enclosing, tuple((j, loops[j].tile, loops[j].extent) for j in used),
               slides, slide_loop, first_of, guard)
        got = memo.get(key)
        if got is None:
            got = memo[key] = _box_total(fns, enclosing, loops, slides, slide_loop, first_of, guard)
        return got
    return _box_total(fns, enclosing, loops, slides, slide_loop, first_of, guard)


def _box_total(fns: tuple[AxisFn, ...], enclosing: tuple[int, ...], loops: tuple[Loop, ...], slides: int | None,
               slide_loop: int | None, first_of: int | None, guard: frozenset[int]) -> tuple[int, int]:
    executions = 1
    for j in enclosing:
        if j not in guard and j != first_of:
            executions *= loops[j].trips
    deps = {i: {j for j in fn.loops if j in enclosing} for i, fn in enumerate(fns)}
    comps: list[set[int]] = []  # loops joined by axes that move with more than one of them
    for js in deps.values():
        if not js:
            continue
        merged = set(js)
        for c in [c for c in comps if c & merged]:
            merged |= c
            comps.remove(c)
        comps.append(merged)
    total = 1
    in_comp = set().union(*comps) if comps else set()
    for j in enclosing:
        if j not in in_comp and j not in guard and j != first_of:
            total *= loops[j].trips
    for i, js in deps.items():
        if not js:
            total *= _length(fns[i].interval({}))
    if total == 0:
        return 0, executions
    for comp in comps:
        js = sorted(comp)
        mine = [i for i, d in deps.items() if d and d <= comp]
        total *= _comp_sum(js, [fns[i] for i in mine], mine, loops, slides, slide_loop, first_of, guard)
        if total == 0:
            break
    return total, executions


def _comp_sum(js: list[int], fns: list[AxisFn], idx: list[int], loops, slides, slide_loop, first_of, guard) -> int:
    """Sum over the tiles of loops ``js`` of the product of the lengths of these axes."""
    affine = all(fn.affine for fn in fns)
    walks, reps = [], []
    for j in js:
        if j == first_of or j in guard:
            walks.append([0])
            reps.append((-1, 0))
            continue
        reach = max((fn.reach(j, loops[j].extent) for fn in fns), default=0)
        ts, rep, count = tiles_to_walk(loops[j], affine, reach)
        walks.append(ts)
        reps.append((rep, count))
    if not any(fn.generic for fn in fns) and _combinations(walks) > VECTOR_FROM:
        got = _comp_sum_arrays(js, fns, idx, loops, slides, slide_loop, walks, reps)
        if got is not None:
            return got
    total = 0
    for ts in itertools.product(*walks):
        state = {j: tile_of(loops[j], t) for j, t in zip(js, ts, strict=True)}
        weight = 1
        for (rep, count), t in zip(reps, ts, strict=True):
            if t == rep:
                weight *= count + 1
        n = 1
        for i, fn in zip(idx, fns, strict=True):
            lo, hi = fn.interval(state)
            if i == slides and slide_loop in state:
                # only indices past the previous tile's box are new (the previous tile: same outer tiles)
                t = ts[js.index(slide_loop)]
                if t > 0:
                    before = {**state, slide_loop: tile_of(loops[slide_loop], t - 1)}
                    lo = max(lo, fn.interval(before)[1] + 1)
            n *= max(0, hi - lo + 1)
            if not n:
                break
        total += n * weight
    return total


def _comp_sum_arrays(js: list[int], fns: list[AxisFn], idx: list[int], loops, slides, slide_loop, walks,
                     reps) -> int | None:
    """:func:`_comp_sum` over the same tiles as arrays (None: a sum too large for int64, left to Python)."""
    grid = _grid(walks)
    state = {j: tiles_of(loops[j], ts) for j, ts in zip(js, grid, strict=True)}
    weight = np.int64(1)
    for (rep, count), ts in zip(reps, grid, strict=True):
        if rep >= 0:
            weight = weight * np.where(ts == rep, count + 1, 1)
    n = np.int64(1)
    bound = 1.0
    for i, fn in zip(idx, fns, strict=True):
        lo, hi = fn.intervals(state)
        if i == slides and slide_loop in state:  # only indices past the previous tile's box are new
            ts = grid[js.index(slide_loop)]
            before = {**state, slide_loop: tiles_of(loops[slide_loop], np.maximum(ts - 1, 0))}
            lo = np.where(ts > 0, np.maximum(lo, fn.intervals(before)[1] + 1), lo)
        length = np.maximum(0, hi - lo + 1)
        bound *= float(np.max(length)) + 1
        n = n * length
    bound *= float(np.max(weight)) * _combinations(walks)
    if bound >= 2.0**62:
        return None
    return int(np.sum(np.broadcast_to(n * weight, tuple(len(w) for w in walks))))


def window_rows(tile: int, skew: int, behind: int | None, tail_lo: int | None, size: int) -> int:
    """Rows a sliding window keeps: the tile plus how far its readers reach behind it (``behind``: the
    least ``skew + offset`` a reader reads at, at most 0 counts), and what a reader after the loop reads
    from ``tail_lo`` on; at least the first tile (which starts at 0). Capped at the axis size."""
    rows = tile + skew - min(0, behind if behind is not None else 0)
    if tail_lo is not None:
        rows = max(rows, size - tail_lo)
    return min(rows, size)


__all__ = ["ENUMERATE_UP_TO", "VECTOR_FROM", "AxisFn", "State", "axis_interval", "box_total", "dense_box", "dense_read", "is_affine", "max_length",
           "range_is_uniform", "range_length", "range_bounds", "rank_interval", "rises_with", "tile_of", "tiles_of", "tiles_to_walk", "window_rows"]
