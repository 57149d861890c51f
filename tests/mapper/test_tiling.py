"""The tiling search's shortcuts hold: occupancy grows with tiles (so a binary search finds the largest fit),
and the untiled schedule bounds every tiling's cost from below (so the mapper may give up on a group early)."""

from __future__ import annotations

from analysis.cascades import motif_cascades, random_cascades
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mambalaya.arch import load_arch
from mambalaya.cost.context import CostContext
from mambalaya.cost.model import group_costs
from mambalaya.ir.mapping import FusionGroup
from mambalaya.mapper.tiling import NoFit, Untileable, _Search, tile_options
from mambalaya.parse import open_cascade
from mambalaya.parse.cascade_file import cascade_from_dict
from mambalaya.schedule import ScheduleError


def _groups(c, ctx, limit=12):
    names = c.einsum_names
    for i in range(len(names)):
        for j in range(i + 1, min(len(names), i + 5) + 1):
            members = tuple(names[i:j])
            if ctx.analysis.legal(members) and ctx.analysis.tileable(members):
                yield members
                limit -= 1
                if limit == 0:
                    return


def _occupancy(ctx, members, order, tiles):
    try:
        return ctx.occupancy(FusionGroup(members, order, tiles))
    except ScheduleError:
        return None


def test_largest_fit_is_the_brute_force_one() -> None:
    c = open_cascade("mamba2")
    for scale in (1 / 64, 1 / 8, 1.0):
        arch = load_arch("h200")
        arch = arch.with_overrides(fusion_buffer_bytes=max(1, int(arch.fusion_buffer_bytes * scale)))
        ctx = CostContext(c, arch)
        for members in _groups(c, ctx):
            s = _Search(ctx, members, "latency", None)
            r = s.loops[-1]
            got = s.largest({}, r)
            fits = [t for t in tile_options(s.size[r]) if s.fits({r: t})]
            assert got == (fits[0] if fits else None), (members, r)


def test_a_diagonal_read_bounds_without_its_sparse_load() -> None:
    """T0 read on its diagonal only: a tile may load less of I0 than the untiled hull, so the bound counts
    none of that load (only T2's store) and stays below every tiling's cost."""
    c = cascade_from_dict({"name": "d", "params": {"n": 4}, "ranks": {"i": "n", "j": "n"},
                           "einsums": ["T0[i,j] = I0[i,j]", "T2[i] = T0[i,i]"]})
    ctx = CostContext(c, load_arch("mambalaya"))
    s = _Search(ctx, ("T0", "T2"), "latency", None)
    lb = s.bound()
    assert lb.traffic_bytes == 4 * 4  # T2's store alone
    for t in tile_options(4):
        got = s.cost({"i": t})
        if not isinstance(got, NoFit):
            assert got.traffic_bytes >= lb.traffic_bytes and got.latency_s >= lb.latency_s
    whole = _Search(ctx, ("T0",), "latency", None).bound()
    assert whole.traffic_bytes == 2 * 16 * 4  # a dense copy: its load and store both count


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(random_cascades(max_einsums=4), st.data())
def test_occupancy_grows_with_tiles_and_untiled_bounds_cost(data_cascade, data) -> None:
    c = cascade_from_dict(data_cascade)
    ctx = CostContext(c, load_arch("mambalaya"))
    for members in _groups(c, ctx, limit=3):
        order = ctx.analysis.loop_order(members)
        loops = [r for r, _ in ctx.analysis.tileable(members)]
        r = data.draw(st.sampled_from(loops))
        sizes = sorted(tile_options(c.rank_size(r)))
        occ = [_occupancy(ctx, members, order, {r: t}) for t in sizes]
        known = [o for o in occ if o is not None]
        assert known == sorted(known), (members, r, sizes, occ)
        whole = _Search(ctx, members, "latency", None).bound()
        if whole is None:  # no untiled schedule
            continue
        for t in sizes:
            try:
                sched = ctx.lower(FusionGroup(members, order, {r: t}), check=False)
            except ScheduleError:
                continue
            cost = group_costs(ctx, sched)[0]
            assert whole.traffic_bytes <= cost.traffic_bytes and whole.latency_s <= cost.latency_s * (1 + 1e-12)


def test_a_batched_gemm_on_an_arch_without_slots_is_tiled_near_its_bound() -> None:
    """MARCA's X0 (mamba-1.4b, batch 64, seqlen 2^17): every starting tiling kept the partial sums whole along
    the batch and re-read the input per tile (281 TB, 225x the bound); the local search from the best start
    finds a tiling within DESCEND_BEYOND of the bound."""
    from mambalaya.mapper.tiling import DESCEND_BEYOND, best_tiling

    c = open_cascade("mamba1", model="mamba-1.4b", params={"batch": 64, "seqlen": 131072})
    ctx = CostContext(c, load_arch("marca"))
    got = best_tiling(ctx, ("X0",))
    lb = _Search(ctx, ("X0",), "latency", None).bound()
    assert got.cost.latency_s <= DESCEND_BEYOND * lb.latency_s, (got.group.tiles, got.cost.latency_s, lb.latency_s)
    assert got.cost.traffic_bytes < 1e12


def test_a_scan_whose_least_tiles_overflow_fits_with_its_recurrence_whole() -> None:
    """Mamba-1's scan at mamba-1.4b, batch 64: with every loop at its least tile the state of every b, d, n is
    kept across the tiles of l (33 MB, over mambalaya's buffer); with l whole each tile holds its own. The
    bound once called the scan untileable from the least tiles alone, so the mapper never grew a group
    around it (its optimum left the scan alone: 118 ms a layer where fusing it costs 31)."""
    from mambalaya.mapper.tiling import Tiled, best_tiling

    c = open_cascade("mamba1", model="mamba-1.4b", params={"batch": 64, "seqlen": 2048})
    ctx = CostContext(c, load_arch("mambalaya"))
    s = _Search(ctx, ("H",), "latency", None)
    least = {r: tile_options(s.size[r])[-1] for r in s.loops}
    assert "l" in least and not s.fits(least)
    for members in (("H",), ("DA", "BX", "H", "SY")):
        got = best_tiling(ctx, members)
        assert isinstance(got, Tiled) and "l" not in got.group.tiles, got


def _every_tiling(s):
    import itertools

    opts = [[None, *tile_options(s.size[r])] for r in s.loops]
    for pick in itertools.product(*opts):
        yield {r: t for r, t in zip(s.loops, pick, strict=True) if t is not None}


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(random_cascades(max_einsums=4), st.integers(6, 12))
def test_untileable_only_when_no_tiling_fits(data_cascade, log_cap) -> None:
    """A group's search calls it untileable (and the mapper drops it) only when no tiling at all fits by the same
    occupancy: every combination of tiles, loops whole included (a brute force)."""
    from mambalaya.mapper.tiling import Untileable, best_tiling

    c = cascade_from_dict(data_cascade)
    ctx = CostContext(c, load_arch("mambalaya").with_overrides(fusion_buffer_bytes=2**log_cap))
    for members in _groups(c, ctx, limit=4):
        got = best_tiling(ctx, members)
        if not isinstance(got, Untileable):
            continue
        s = _Search(ctx, members, "latency", None)
        tilings = list(_every_tiling(s))
        if len(tilings) > 400:
            continue
        assert not any(s.fits(t) for t in tilings), (members, got.reason)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.integers(1, 6), st.integers(2, 12), st.integers(1, 8), st.integers(6, 11))
def test_a_scan_is_untileable_only_when_no_tiling_fits(batch, seqlen, channels, log_cap) -> None:
    """The same brute force on a recurrence with a readout (the shape of the bug: a recurrence's loop tiled
    keeps every channel's state across its tiles)."""
    from mambalaya.mapper.tiling import Untileable, best_tiling

    c = cascade_from_dict({
        "name": "scan", "params": {"B": batch, "L": seqlen, "D": channels},
        "ranks": {"b": "B", "l": "L", "d": "D"},
        "tensors": {"H": {"init": "H0"}, "H0": {"role": "input"}},
        "einsums": ["H[b,l,d] = A[b,l,d] * H[b,l-1,d] + X[b,l,d]", "Y[b,l] = sum_d(C[b,l,d] * H[b,l,d])"]})
    ctx = CostContext(c, load_arch("mambalaya").with_overrides(fusion_buffer_bytes=2**log_cap))
    for members in (("H",), ("H", "Y")):
        got = best_tiling(ctx, members)
        if isinstance(got, Untileable):
            s = _Search(ctx, members, "latency", None)
            assert not any(s.fits(t) for t in _every_tiling(s)), (members, got.reason)


def test_a_scan_at_a_million_tokens_runs_its_recurrence_innermost() -> None:
    """At 2^20 tokens no tile holds a whole sequence, and with the recurrence's loop outermost the scan keeps
    (or re-reads) every channel's state across the sequence's tiles: the search also tries the recurrence's
    loop innermost, and that order is the better one here."""
    from mambalaya.mapper.tiling import Tiled, best_tiling, search_orders

    c = open_cascade("mamba1", model="mamba-1.4b", params={"batch": 64, "seqlen": 1 << 20})
    ctx = CostContext(c, load_arch("mambalaya"))
    members = ("DA", "BX", "H", "SY")
    first, inner = search_orders(ctx, members)
    assert inner[-1] == "l" and first[0] == "l"
    got = best_tiling(ctx, members)
    alone = _Search(ctx, members, "latency", None, first).run()
    assert isinstance(got, Tiled) and got.group.loop_order == inner
    assert not isinstance(alone, Tiled) or got.cost.latency_s < alone.cost.latency_s


def _check_grid(ctx, members, tiles_list) -> int:
    """Lower each tiling of ``members`` on a GPU arch: its grid never has more programs than the search's widest
    grid for those tiles (nor than for any tiles) or its placement's grid shape allows, it starts with the shape's
    certain loops, the loops in it are none of the grid breakers, and neither the group's bound nor the floor at
    these tiles (which prices what the shape's programs repeat: its compute and its traffic, each no more than the
    schedule's) is above its cost."""
    s = _Search(ctx, members, "latency", None)
    checked = 0
    for tiles in tiles_list:
        try:
            sched = ctx.lower(FusionGroup(members, s.order, tiles), check=False)
        except ScheduleError:
            continue
        programs = group_costs(ctx, sched)[0].programs
        outside = {lp.rank for lp in sched.loops[:sched.grid] if s.outside(lp.rank, lp.tile)}
        assert not outside, (members, tiles, outside)  # (what the widest grid leaves out)
        assert programs <= s.widest_grid(tiles) <= s.widest_grid(), (members, tiles, programs, s.widest_grid(tiles))
        shape = s.shape(tiles)  # (its certain loops lead the grid; it has no more programs than its loops)
        assert shape is not None and programs <= s.programs(tiles), (members, tiles, shape, programs)
        assert sched.grid >= shape.certain and shape.loops[:shape.certain] == tuple(
            lp.rank for lp in sched.loops[:shape.certain]), (members, tiles, shape, sched.loops, sched.grid)
        assert not {lp.rank for lp in sched.loops[:sched.grid]} & s.breakers, (members, tiles, sched.loops)
        cost, lb = group_costs(ctx, sched)[0], s.bound()
        if lb is not None:  # (the least staging and the widest grid are parts of the bound)
            assert lb.staging_s <= cost.staging_s * (1 + 1e-12), (members, tiles, lb.staging_s, cost.staging_s)
            assert lb.latency_s <= cost.latency_s * (1 + 1e-12), (members, tiles, lb.latency_s, cost.latency_s)
            assert s.floor(tiles) <= cost.latency_s * (1 + 1e-12), (members, tiles, s.floor(tiles), cost.latency_s)
            # (what the programs repeat: no more than the schedule's)
            compute, memory, staging = s.repeated(shape, tiles)
            assert compute <= cost.compute_s * (1 + 1e-12), (members, tiles, shape, compute, cost.compute_s)
            assert memory <= cost.memory_s * (1 + 1e-12), (members, tiles, shape, memory, cost.memory_s)
            assert staging <= cost.staging_s * (1 + 1e-12), (members, tiles, shape, staging, cost.staging_s)
        checked += 1
    return checked


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.one_of(random_cascades(max_einsums=4), motif_cascades()), st.data())
def test_no_grid_is_wider_than_the_search_bounds_it(data_cascade, data) -> None:
    """The search prices a tiling's idle chip from the widest grid it can have (the group's bound and the floor
    that skips tilings unlowered rest on it): a loop a member reduces over or scans along is never in a grid (the
    motifs add a mean read through a floor of the channel, masks, nested maxima and Toeplitz reads)."""
    c = cascade_from_dict(data_cascade)
    ctx = CostContext(c, load_arch("h200"))
    for members in _groups(c, ctx, limit=4):
        loops = [r for r, _ in ctx.analysis.tileable(members)]
        tiles_list = [{r: data.draw(st.sampled_from(tile_options(c.rank_size(r))), label=r)
                       for r in loops if tile_options(c.rank_size(r)) and data.draw(st.booleans(), label=f"tile {r}")}
                      for _ in range(3)]
        _check_grid(ctx, members, tiles_list)


def test_the_shipped_mamba2s_grids_are_within_the_widest() -> None:
    """Every group of up to six Einsums of the default Mamba-2 on h200, each loop tiled alone and all at their
    least tiles: no grid wider than the search's bound (the layer's reductions over l, d and n cut most grids)."""
    c = open_cascade("mamba2")
    ctx = CostContext(c, load_arch("h200"))
    checked = 0
    names = c.einsum_names
    for i in range(len(names)):
        for j in range(i + 1, min(len(names), i + 6) + 1):
            members = tuple(names[i:j])
            if not ctx.analysis.legal(members):
                continue
            loops = [r for r, _ in ctx.analysis.tileable(members) if tile_options(c.rank_size(r))]
            least = {r: tile_options(c.rank_size(r))[-1] for r in loops}
            checked += _check_grid(ctx, members, [least, *({r: t} for r, t in least.items())])
    assert checked > 100


def test_a_search_given_a_dominance_test_lowers_no_tiling_it_could_not_keep() -> None:
    """The mapper's ``give_up`` (a split of the group costs less) prunes inside the search too: no tiling whose
    floor it gives up on is lowered, and a best it gives up on comes back as "dominated" (not the group's answer,
    so not kept as it); a group it does not give up on gets the same tiles as without it."""
    c = open_cascade("mamba2")
    pruned = dominated = kept = 0
    for members in _groups(c, CostContext(c, load_arch("h200")), limit=16):
        free = _Search(CostContext(c, load_arch("h200")), members, "latency", None)
        alone = free.run()
        floors = sorted(free.floor(dict(k)) for k, v in free.seen.items() if k and not isinstance(v, NoFit))
        if not hasattr(alone, "cost") or len(set(floors)) < 2:
            continue
        # a split dearer than the group's best, one below the floors of some tilings the free search lowered, and one
        # just below its best
        for cut in (alone.cost.latency_s * 1.2, floors[len(floors) // 2], alone.cost.latency_s * 0.99):
            s = _Search(CostContext(c, load_arch("h200")), members, "latency", None)
            got = s.run(give_up=lambda g, cut=cut: g.latency_s > cut)
            lowered = [dict(k) for k, v in s.seen.items() if k and not isinstance(v, NoFit)]
            assert all(s.floor(t) <= cut for t in lowered), members
            pruned += sum(1 for k in free.seen if k not in s.seen)
            if isinstance(got, Untileable):
                assert got.reason == "dominated" and got.bound.latency_s > cut
                dominated += 1
            else:
                assert got.cost.latency_s <= cut and got.group.tiles == alone.group.tiles, members
                kept += 1
    assert pruned and dominated and kept


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.one_of(random_cascades(max_einsums=4), motif_cascades()), st.sampled_from(("cpu", "imax3")), st.data())
def test_a_tilings_floor_counts_no_more_runs_than_its_schedule(data_cascade, arch, data) -> None:
    """Without program slots the floor at a tiling charges a statement overhead for each run of a member's compute
    and store that a tile of a loop it follows adds (``cpu``: 104.5 us each), and a transfer for each store's
    (``imax3``: 10 us): never above the lowered schedule's latency, and above the untiled bound wherever a member
    follows a tiled loop."""
    c = cascade_from_dict(data_cascade)
    ctx = CostContext(c, load_arch(arch))
    for members in _groups(c, ctx, limit=4):
        s = _Search(ctx, members, "latency", None)
        for _ in range(3):
            tiles = {r: data.draw(st.sampled_from(tile_options(c.rank_size(r))), label=r)
                     for r in s.loops if tile_options(c.rank_size(r)) and data.draw(st.booleans(), label=f"tile {r}")}
            try:
                sched = ctx.lower(FusionGroup(members, s.order, tiles), check=False)
            except ScheduleError:
                continue
            cost, floor = group_costs(ctx, sched)[0], s.floor(tiles)
            assert floor is not None and floor <= cost.latency_s * (1 + 1e-12), (members, tiles, floor, cost)
            computes, stores = s.more_executions(s.shape(tiles), tiles)
            assert sched.executions >= s.untiled.executions + computes + stores, (members, tiles, computes, stores)
            assert group_costs(ctx, sched)[0].transfers >= group_costs(ctx, s.untiled)[0].transfers + stores
            if ctx.arch.statement_overhead_s and computes:
                assert floor > s.bound().latency_s
