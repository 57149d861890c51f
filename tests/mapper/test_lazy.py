"""The lazy space (groups costed by a lower bound, tile-searched when a solve picks them) finds the eager optimum."""

from __future__ import annotations

import pytest
from analysis.cascades import random_cascades
from hypothesis import HealthCheck, given, settings
from small_cascades import small_cascade

from mambalaya.arch import load_arch
from mambalaya.errors import MappingError
from mambalaya.mapper import optimal_mapping
from mambalaya.mapper.space import build_space
from mambalaya.parse.cascade_file import cascade_from_dict


def _same(c, arch) -> None:
    eager = optimal_mapping(c, arch, lazy=False)
    lazy = optimal_mapping(c, arch, lazy=True)
    assert lazy.objective_value == pytest.approx(eager.objective_value, rel=1e-9, abs=1e-15)
    assert lazy.report.latency_s == pytest.approx(eager.report.latency_s, rel=1e-9)


@pytest.mark.parametrize("arch", ["mambalaya", "imax3", pytest.param("h200", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", ["mlp2", "attention", "mamba1-decode", pytest.param("mamba1", marks=pytest.mark.slow)])
def test_shipped_cascades(name: str, arch: str) -> None:
    _same(small_cascade(name), arch)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(random_cascades(max_einsums=5))
def test_random_cascades_in_a_small_buffer(data) -> None:
    c = cascade_from_dict(data)
    arch = load_arch("mambalaya").with_overrides(fusion_buffer_bytes=2048)
    try:
        eager = optimal_mapping(c, arch, lazy=False)
    except MappingError:
        with pytest.raises(MappingError):
            optimal_mapping(c, arch, lazy=True)
        return
    lazy = optimal_mapping(c, arch, lazy=True)
    assert lazy.objective_value == pytest.approx(eager.objective_value, rel=1e-9, abs=1e-15)


def test_a_lazy_space_bounds_groups_and_keeps_singletons_exact() -> None:
    c = small_cascade("mamba1")
    space = build_space(c, load_arch("mambalaya"), lazy=True)
    assert all(x.exact for x in space.candidates if len(x.einsums) == 1)
    assert any(not x.exact for x in space.candidates)
    exact = {x.einsums: x for x in build_space(c, load_arch("mambalaya")).candidates}
    for x in space.candidates:  # a bound never exceeds the searched cost
        if not x.exact and x.einsums in exact:
            assert x.latency_s <= exact[x.einsums].latency_s * (1 + 1e-12)


def test_a_pick_searched_past_its_cover_limit_is_pruned_and_costs_more() -> None:
    """A picked group is searched only as far as some optimal cover could hold it (its limit: its bound plus what
    its cheapest cover at the bounds leaves below a real cover); a search that proves it dearer stops and prunes
    it. Each such group, searched in full, costs more than its limit, and the optimum is the eager one."""
    import mambalaya.mapper.space as sp
    from mambalaya.cost.context import CostContext
    from mambalaya.mapper.tiling import Tiled, best_tiling

    c, arch = small_cascade("mamba1"), load_arch("mambalaya").with_overrides(fusion_buffer_bytes=2048)
    cut: list = []
    real = sp.Coster.exact

    def exact(self, members, limit=None):
        got = real(self, members, limit)
        if isinstance(got, sp.Beyond):
            cut.append((members, limit))
        return got

    sp.clear_shared()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sp.Coster, "exact", exact)
        lazy = optimal_mapping(c, arch, lazy=True)
    assert cut and lazy.pruned["by_cover_bound"] >= len(cut)
    ctx = CostContext(c, arch)
    for members, limit in cut:
        full = best_tiling(ctx, members)
        assert not isinstance(full, Tiled) or full.cost.latency_s > limit, (members, limit, full.cost.latency_s)
    sp.clear_shared()
    eager = optimal_mapping(c, arch, lazy=False)
    assert lazy.objective_value == pytest.approx(eager.objective_value, rel=1e-9, abs=1e-15)


def test_the_eager_space_after_pruning_leaves_the_pruned_groups_unsearched(monkeypatch) -> None:
    """Once the lazy loop gives up (its searches outrun its pruning; here: at the first round after its pruning found
    something), the eager space it builds leaves out what the pruning proved in no optimal cover: none of those
    groups is searched again, and the optimum is the eager one."""
    import mambalaya.mapper as mapper
    from mambalaya.mapper import space as sp

    c, arch = small_cascade("mamba2"), load_arch("cpu")
    eager = optimal_mapping(c, arch, lazy=False)
    sp.clear_shared()
    pruned: set = set()
    searched: list = []
    excluded: list = []
    real_prune, real_search, real_build = mapper.prune_by_covers, sp.best_tiling, mapper.build_space

    def prune(space, problem, cands, res):
        n = real_prune(space, problem, cands, res)
        pruned.update(space.pruned)
        if pruned:  # (the next round goes eager)
            monkeypatch.setattr(mapper, "LAZY_SEARCH_BASE", -10**9)
        return n

    def build(*a, **k):
        excluded.append(k.get("exclude", frozenset()))
        return real_build(*a, **k)

    monkeypatch.setattr(mapper, "prune_by_covers", prune)
    monkeypatch.setattr(mapper, "build_space", build)
    monkeypatch.setattr(sp, "best_tiling", lambda *a, **k: searched.append(tuple(a[1])) or real_search(*a, **k))
    lazy = optimal_mapping(c, arch, lazy=True)
    assert len(excluded) == 2 and excluded[1] == pruned and pruned  # (the lazy space, then the eager one)
    # (a group is pruned unsearched, or searched once and cut short by its cover limit: never again)
    assert all(searched.count(g) <= 1 for g in pruned)
    assert lazy.objective_value == pytest.approx(eager.objective_value, rel=1e-9, abs=1e-15)


def test_a_cascade_mapped_again_reuses_its_searches(monkeypatch) -> None:
    """The second map of a cascade on an arch (another solver, another cap) searches no group's tiles again."""
    from mambalaya.mapper import space as sp

    c, arch = small_cascade("attention"), load_arch("imax3")
    sp.clear_shared()
    first = optimal_mapping(c, arch, lazy=False)
    searched = []
    real = sp.best_tiling
    monkeypatch.setattr(sp, "best_tiling", lambda *a, **k: searched.append(a[1]) or real(*a, **k))
    again = optimal_mapping(c, arch, method="exhaustive", lazy=False)
    assert searched == [] and again.objective_value == pytest.approx(first.objective_value, rel=1e-12)
    optimal_mapping(c, load_arch("imax3").with_overrides(fusion_buffer_bytes=4096), lazy=False)
    assert searched  # (another arch: searched anew)


def test_a_bound_whose_cheapest_cover_costs_more_than_a_searched_cover_is_pruned() -> None:
    """A -> B -> C, singletons searched at 10 each (a cover of 30): the bound AB at 25 is in no cover under 35, so
    it goes unsearched; BC at 5 (a cover of 15) stays, and so do the searched ones. BC is worth searching only
    while it may cost up to 20 (with A, a cover of 30): that is its limit."""
    from types import SimpleNamespace

    from mambalaya.ir.mapping import FusionGroup
    from mambalaya.mapper import Candidate, prune_by_covers
    from mambalaya.mapper.solver import Problem

    def cand(g, cost, exact):
        return Candidate(g, FusionGroup(g, ("i",)), 0, cost, 0, exact=exact)

    cands = [cand(("A",), 10, True), cand(("B",), 10, True), cand(("C",), 10, True), cand(("A", "B"), 25, False),
             cand(("B", "C"), 5, False)]
    problem = Problem(("A", "B", "C"), (("A", "B"), ("B", "C")), tuple(c.einsums for c in cands),
                      tuple(int(c.latency_s) * 1000 for c in cands))
    space = SimpleNamespace(candidates=list(cands), pruned=set(), objective="latency")
    limits = prune_by_covers(space, problem, cands, 1e-3)
    assert list(limits) == [("B", "C")] and limits[("B", "C")] == pytest.approx(20, abs=0.02)
    assert [c.einsums for c in space.candidates] == [("A",), ("B",), ("C",), ("B", "C")]
    assert space.pruned == {("A", "B")}  # (an eager space built after leaves it out)


@pytest.mark.slow
def test_candidates_no_optimal_cover_holds_are_pruned_unsearched(monkeypatch) -> None:
    """A published Mamba-2 on mambalaya: most bounds are left unsearched (pruned, or never picked), the pruning
    searches no more groups than the loop without it, and the optimum is the one found with nothing pruned (the
    lazy loop the tests above hold to the eager space)."""
    import mambalaya.mapper as mapper
    from mambalaya.mapper.space import clear_shared
    from mambalaya.parse import open_cascade

    c = open_cascade("mamba2", model="mamba2-130m", params={"seqlen": 1024})
    clear_shared()
    lazy = optimal_mapping(c, "mambalaya", lazy=True)
    # (left out unsearched: pruned, or still at its bound when the solve picked only searched groups)
    assert lazy.pruned["by_cover_bound"] + lazy.pruned["costed_by_bound"] > 5 * lazy.pruned["searched"]
    clear_shared()
    monkeypatch.setattr(mapper, "prune_by_covers", lambda *a: {})
    unpruned = optimal_mapping(c, "mambalaya", lazy=True)
    assert unpruned.pruned["by_cover_bound"] == 0 and lazy.pruned["searched"] <= unpruned.pruned["searched"]
    assert lazy.objective_value == pytest.approx(unpruned.objective_value, rel=1e-9, abs=1e-15)
    assert lazy.report.latency_s == pytest.approx(unpruned.report.latency_s, rel=1e-9)
