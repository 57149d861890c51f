"""The composed bound (the mapper's first tier) is below what every tiling of a group costs, on every shipped
arch: it prunes and proves dominance, so one group priced under it would make the mapper's optimum wrong."""

from __future__ import annotations

import itertools

import numpy as np
from analysis.cascades import random_cascades
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mambalaya.arch import load_arch
from mambalaya.cost.bounds import ComposedBounds, union_volume
from mambalaya.cost.context import CostContext
from mambalaya.cost.model import group_costs
from mambalaya.ir.mapping import FusionGroup
from mambalaya.mapper.tiling import tile_options
from mambalaya.parse.cascade_file import cascade_from_dict
from mambalaya.schedule import ScheduleError

ARCHS = ("cpu", "h200", "imax3", "mambalaya", "marca")


def _below(bound, cost) -> bool:
    return bound.traffic_bytes <= cost.traffic_bytes and bound.latency_s <= cost.latency_s * (1 + 1e-12)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(random_cascades(max_einsums=5), st.sampled_from(ARCHS), st.data())
def test_the_composed_bound_is_below_every_tiling(data_cascade, arch, data) -> None:
    """Every legal group of a random cascade, at random tiles of its tileable loops (and untiled): the priced
    schedule costs at least the composed bound, in traffic and in latency."""
    c = cascade_from_dict(data_cascade)
    ctx = CostContext(c, load_arch(arch))
    bounds = ComposedBounds(ctx)
    names = c.einsum_names
    groups = [tuple(names[i:j]) for i in range(len(names)) for j in range(i + 1, len(names) + 1)]
    for members in (g for g in groups if ctx.analysis.legal(g)):
        bound = bounds.bound(members)
        order = ctx.analysis.loop_order(members)
        loops = [r for r, _ in ctx.analysis.tileable(members)]
        tilings = [{}, *({r: data.draw(st.sampled_from(tile_options(c.rank_size(r))))
                          for r in data.draw(st.sets(st.sampled_from(loops), max_size=2)) if tile_options(c.rank_size(r))}
                         for _ in range(2) if loops)]
        for tiles in tilings:
            try:
                sched = ctx.lower(FusionGroup(members, order, tiles), check=False)
            except ScheduleError:
                continue
            cost = group_costs(ctx, sched)[0]
            assert _below(bound, cost), (members, tiles, bound, cost)


def test_a_partly_read_producer_that_may_be_inlined_counts_none_of_its_reads() -> None:
    """``P`` is point-wise and stays in the group, so the schedule inlines it into ``Y``, which reads its second half:
    only that half of ``X`` is loaded. Counting ``P``'s own read of all of ``X`` would bound above the cost."""
    c = cascade_from_dict({
        "name": "half", "params": {"N": 64, "H": 32}, "ranks": {"i": "N", "j": "H"},
        "einsums": ["P[i] = exp(X[i])", "Y[j] = P[j + H] * W[j]"]})
    for arch in ARCHS:
        ctx = CostContext(c, load_arch(arch))
        sched = ctx.lower(FusionGroup(("P", "Y"), ctx.analysis.loop_order(("P", "Y"))), check=False)
        cost = group_costs(ctx, sched)[0]
        bound = ComposedBounds(ctx).bound(("P", "Y"))
        assert _below(bound, cost), (arch, bound, cost)
        assert bound.traffic_bytes >= 2 * 32 * 4  # (Y stored, W loaded: both whole)


@settings(max_examples=200, deadline=None, database=None)
@given(st.integers(1, 3).flatmap(lambda d: st.lists(
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 4)), min_size=d, max_size=d), min_size=1, max_size=5)))
def test_union_volume_counts_each_element_once(raw) -> None:
    boxes = [tuple((lo, lo + w) for lo, w in b) for b in raw]
    grid = np.zeros((12,) * len(boxes[0]), dtype=bool)
    for b in boxes:
        grid[tuple(slice(lo, hi + 1) for lo, hi in b)] = True
    assert union_volume(boxes) == int(grid.sum())


def test_the_composed_bound_of_a_shipped_layer_is_below_its_searched_groups() -> None:
    """The default Mamba-2 layer: every legal group of up to four consecutive Einsums at its best tiling."""
    from mambalaya.mapper.tiling import Tiled, best_tiling
    from mambalaya.parse import open_cascade

    c = open_cascade("mamba2")
    for arch in ("mambalaya", "imax3"):
        ctx = CostContext(c, load_arch(arch))
        bounds = ComposedBounds(ctx)
        names = c.einsum_names
        for i, n in itertools.product(range(len(names)), (2, 3, 4)):
            members = tuple(names[i:i + n])
            if len(members) == n and ctx.analysis.legal(members):
                got = best_tiling(ctx, members)
                if isinstance(got, Tiled):
                    assert _below(bounds.bound(members), got.cost), (arch, members)


def test_a_diagonal_read_counts_none_of_its_hull() -> None:
    """``X[i, i]`` covers n of its hull's n*n elements: a tile of ``i`` loads only its diagonal part, so the bound
    counts none of that read (only ``W``'s load and ``T``'s store)."""
    c = cascade_from_dict({"name": "d", "params": {"n": 8, "m": 4}, "ranks": {"i": "n", "k": "m"},
                           "einsums": ["T[i] = sum_k(X[i,i] * W[k])"]})
    ctx = CostContext(c, load_arch("mambalaya"))
    bound = ComposedBounds(ctx).bound(("T",))
    assert bound.traffic_bytes == (4 + 8) * 4
    sched = ctx.lower(FusionGroup(("T",), ("i", "k"), {"i": 1}), check=False)
    assert _below(bound, group_costs(ctx, sched)[0])
