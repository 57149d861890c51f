"""The sizes rule against its definition: every tile of every loop, walked one by one.

:mod:`mambalaya.schedule.extent` evaluates an affine box at a few tiles near each end of a loop and one
representative interior tile (weighted), and many tiles at once as numpy arrays; both must give exactly what
walking every tile with the general evaluator (:func:`~mambalaya.schedule.extent.axis_interval`) gives.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mambalaya.schedule import extent
from mambalaya.schedule.intervals import IndexForm, Term
from mambalaya.schedule.ir import AxisBox, Loop, Range

RANKS = ("r0", "r1", "r2")
#: short loops, and long ones (only a long loop's interior tiles are priced by one representative)
SIZES = st.one_of(st.integers(1, 40), st.integers(100, 300))
MEMBERS = ("m0", "m1")


@st.composite
def ranges_of(draw, extents: list[int]) -> Range:
    rank = draw(st.sampled_from(RANKS))
    size = draw(SIZES)
    kind = draw(st.sampled_from(["full", "tile", "tile", "parent", "piece"]))
    if kind == "full":
        return Range(rank, size)
    loop = draw(st.integers(0, len(extents) - 1))
    if kind == "tile" and draw(st.booleans()):  # (a rank its loop sweeps, as most are)
        return Range(rank, extents[loop], "tile", loop, skew=draw(st.integers(0, 2)))
    if kind == "tile":
        return Range(rank, size, "tile", loop, skew=draw(st.integers(0, 3)))
    if kind == "parent":
        return Range(rank, size, "parent", loop, scale=draw(st.integers(1, 4)), offset=draw(st.integers(0, 3)))
    return Range(rank, size, "piece", loop, offset=draw(st.integers(0, 2)), divisor=draw(st.integers(1, 4)),
                 modulus=draw(st.one_of(st.none(), st.integers(1, 4))))


@st.composite
def boxes(draw):
    """Loops, every member's ranges, and a few axes of reads over them (what a load or a buffer spans)."""
    n_loops = draw(st.integers(1, 3))
    loops = []
    for k in range(n_loops):
        ext = draw(SIZES)
        loops.append(Loop(f"l{k}", ext, draw(st.integers(1, ext))))
    assume(math.prod(lp.trips for lp in loops) <= 5000)  # (the test walks every tile)
    ranges = {}
    for m in MEMBERS:
        got = {}
        for r in RANKS:
            x = draw(ranges_of([lp.extent for lp in loops]))
            got[r] = Range(r, x.size, x.kind, x.loop, x.skew, x.scale, x.offset, x.divisor, x.modulus)
        ranges[m] = got
    axes = []
    for _ in range(draw(st.integers(1, 3))):
        reads = []
        for _ in range(draw(st.integers(1, 3))):
            if draw(st.booleans()):  # a rank at an offset (``X[l - 1]``), as most reads are
                form = IndexForm(draw(st.integers(-3, 3)), (Term(1, draw(st.sampled_from(RANKS))),))
            else:
                form = IndexForm(draw(st.integers(-6, 12)), tuple(
                    Term(draw(st.sampled_from([-2, -1, 1, 1, 2, 3])), r)
                    for r in draw(st.lists(st.sampled_from(RANKS), min_size=1, max_size=2, unique=True))))
            reads.append((form, draw(st.sampled_from(MEMBERS))))
        moving = {ranges[m][r].loop for f, m in reads for r in f.ranks if ranges[m][r].loop is not None}
        kept = draw(st.lists(st.sampled_from(sorted(moving)), unique=True)) if moving else []
        axes.append(AxisBox(draw(SIZES), tuple(reads), frozenset(kept)))
    return tuple(loops), ranges, tuple(axes)


def walk_every_tile(loops: tuple[Loop, ...], which: list[int]):
    for ts in itertools.product(*(range(loops[j].trips) for j in which)):
        yield dict(zip(which, ts, strict=True)), {j: extent.tile_of(loops[j], t) for j, t in zip(which, ts, strict=True)}


def length(iv: tuple[int, int]) -> int:
    return max(0, iv[1] - iv[0] + 1)


@pytest.mark.parametrize("vector_from", [extent.VECTOR_FROM, 0])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=boxes())
def test_max_length_is_the_longest_box_over_every_tile(case, vector_from, monkeypatch) -> None:
    loops, ranges, axes = case
    monkeypatch.setattr(extent, "VECTOR_FROM", vector_from)  # 0: every walk through the numpy path
    for axis in axes:
        want = max(length(extent.axis_interval(axis, ranges, state))
                   for _, state in walk_every_tile(loops, sorted(axis.loops)))
        assert extent.max_length(extent.AxisFn(axis, ranges, {}), loops) == want
        assert extent.max_length(extent.AxisFn(axis, ranges), loops) == want


@pytest.mark.parametrize("vector_from", [extent.VECTOR_FROM, 0])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=boxes(), data=st.data())
def test_box_total_is_the_elements_over_every_tile(case, data, vector_from, monkeypatch) -> None:
    loops, ranges, axes = case
    monkeypatch.setattr(extent, "VECTOR_FROM", vector_from)
    enclosing = tuple(sorted(data.draw(st.lists(st.integers(0, len(loops) - 1), unique=True))))
    # (a window slides along a loop its axis moves with)
    sliding = [(i, j) for i, a in enumerate(axes) for j in sorted(a.loops) if j in enclosing]
    slides, slide_loop = data.draw(st.sampled_from([(None, None), *sliding]))
    first_of = data.draw(st.one_of(st.none(), st.sampled_from(enclosing))) if enclosing else None
    guard = frozenset(data.draw(st.lists(st.sampled_from(enclosing), unique=True))) if enclosing else frozenset()
    walked = [j for j in enclosing if j != first_of and j not in guard]
    want, runs = 0, 0
    for ts, state in walk_every_tile(loops, walked):
        state = {**state, **{j: extent.tile_of(loops[j], 0) for j in enclosing if j not in walked}}
        n = 1
        for i, axis in enumerate(axes):
            lo, hi = extent.axis_interval(axis, ranges, state)
            if i == slides and ts.get(slide_loop, 0) > 0:  # only what the previous tile's box did not hold
                before = {**state, slide_loop: extent.tile_of(loops[slide_loop], ts[slide_loop] - 1)}
                lo = max(lo, extent.axis_interval(axis, ranges, before)[1] + 1)
            n *= length((lo, hi))
        want += n
        runs += 1
    fns = tuple(extent.AxisFn(a, ranges, {}) for a in axes)
    got = extent.box_total(fns, enclosing, loops, slides=slides, slide_loop=slide_loop, first_of=first_of,
                           guard=guard)
    assert got == (want, runs)


@st.composite
def long_loops(draw):
    """One long loop and reads near it (``X[l + k - 3]``, a chunk's rows ``X[8*c + q]``): the boxes whose interior
    tiles one representative prices."""
    ext = draw(st.integers(200, 3000))
    loop = Loop("l", ext, draw(st.integers(1, 40)))
    ranges = {
        "m0": {"r0": Range("r0", ext, "tile", 0, skew=draw(st.integers(0, 3))), "r1": Range("r1", draw(st.integers(1, 4))),
               "r2": Range("r2", 8 * ext, "parent", 0, scale=8)},
        "m1": {"r0": Range("r0", ext, "tile", 0), "r1": Range("r1", 8), "r2": Range("r2", 3)},
    }
    reads = []
    for _ in range(draw(st.integers(1, 2))):
        rank = draw(st.sampled_from(["r0", "r2"]))
        terms = (Term(1, rank),) + ((Term(1, "r1"),) if draw(st.booleans()) else ())
        reads.append((IndexForm(draw(st.integers(-4, 4)), terms), draw(st.sampled_from(MEMBERS))))
    size = 8 * ext if any("r2" in f.ranks for f, _ in reads) else ext
    return (loop,), ranges, (AxisBox(size, tuple(reads), frozenset({0})), AxisBox(5, ((IndexForm(0, (Term(1, "r1"),)), "m0"),)))


@pytest.mark.parametrize("vector_from", [extent.VECTOR_FROM, 0])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=long_loops(), slide=st.booleans())
def test_a_long_loops_interior_priced_by_one_tile_is_exact(case, slide, vector_from, monkeypatch) -> None:
    loops, ranges, axes = case
    monkeypatch.setattr(extent, "VECTOR_FROM", vector_from)
    want, prev = 0, None
    for ts, state in walk_every_tile(loops, [0]):
        lo, hi = extent.axis_interval(axes[0], ranges, state)
        if slide and prev is not None:
            lo = max(lo, prev + 1)
        prev = hi if ts[0] >= 0 else prev
        want += length((lo, hi)) * length(extent.axis_interval(axes[1], ranges, state))
    fns = tuple(extent.AxisFn(a, ranges, {}) for a in axes)
    got = extent.box_total(fns, (0,), loops, slides=0 if slide else None, slide_loop=0 if slide else None)
    assert got == (want, loops[0].trips)
    assert extent.max_length(fns[0], loops) == max(length(extent.axis_interval(axes[0], ranges, state))
                                                    for _, state in walk_every_tile(loops, [0]))


@pytest.mark.parametrize("vector_from", [extent.VECTOR_FROM, 0])
def test_a_read_past_the_end_of_its_axis_counts_only_the_rows_inside(vector_from, monkeypatch) -> None:
    """``X[r]`` of a 4-row tensor along a rank of 100, one row a tile: 4 tiles read a row, the other 96 read
    nothing. The affine walk takes one interior tile for them all, so clipping past the axis's end must widen the
    ends it walks (it counted 97 elements; found by the property test above)."""
    monkeypatch.setattr(extent, "VECTOR_FROM", vector_from)
    loops = (Loop("l", 100, 1),)
    ranges = {"m": {"r": Range("r", 100, "tile", 0)}}
    axis = AxisBox(4, ((IndexForm(0, (Term(1, "r"),)), "m"),), frozenset({0}))
    assert extent.box_total((extent.AxisFn(axis, ranges),), (0,), loops) == (4, 100)
