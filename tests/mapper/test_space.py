"""The mapper's space: every candidate is priced by the cost model's own code, at its best tiling."""

from __future__ import annotations

import pytest

from mambalaya.arch import load_arch
from mambalaya.exec.verify import verify_mapping
from mambalaya.ir.mapping import Mapping
from mambalaya.mapper import evaluate, optimal_mapping
from mambalaya.mapper.heuristics import greedy_mapping, unfused_baseline
from mambalaya.mapper.space import build_space
from mambalaya.parse import open_cascade


def _candidates_cost_what_evaluate_says(c, a) -> None:
    space = build_space(c, a)
    assert space.candidates
    for cand in space.candidates[:40]:
        if len(cand.einsums) != len(c.einsums) and any(c.tensors[e].role == "output" for e in cand.einsums):
            continue  # (evaluate needs a whole mapping: only whole-cascade groups are checked directly)
        if len(cand.einsums) == len(c.einsums):
            r = evaluate(c, a, Mapping((cand.group,), c.name))
            assert (r.traffic_bytes, r.latency_s) == pytest.approx((cand.traffic_bytes, cand.latency_s))
            assert r.schedule.groups[0].occupancy_bytes == cand.buffer_bytes <= a.fusion_buffer_bytes


def _priced_as_evaluated(c, a):
    res = optimal_mapping(c, a)
    again = evaluate(c, a, res.mapping)
    assert again.traffic_bytes == res.report.traffic_bytes
    assert again.latency_s == pytest.approx(res.report.latency_s)
    assert all(g.occupancy_bytes <= a.fusion_buffer_bytes for g in again.schedule.groups)
    return res


@pytest.mark.parametrize(("name", "arch"), [pytest.param("mamba1", "imax3", marks=pytest.mark.slow),
                                            ("attention", "mambalaya"), ("mamba1-decode", "imax3")])
def test_candidates_cost_what_evaluate_says(name: str, arch: str) -> None:
    """A candidate's traffic and latency are those of its group evaluated alone (the same schedule, priced once)."""
    _candidates_cost_what_evaluate_says(open_cascade(name), load_arch(arch))


@pytest.mark.slow  # mamba2 at its default shapes on h200: the grid search of every group (~4 min on a CI core)
def test_the_default_mamba2_on_h200() -> None:
    """The one space of the slow suite that takes minutes to build, built once (the mapper keeps a cascade's
    searches per process) for every check that needs it: its candidates cost what evaluate says, the optimum is
    priced as evaluated, the MIP equals the exhaustive solver on it, and the optimum, the greedy and the unfused
    mappings compute the reference's numbers with the predicted traffic (Numba)."""
    c, a = open_cascade("mamba2"), load_arch("h200")
    _candidates_cost_what_evaluate_says(c, a)
    res = _priced_as_evaluated(c, a)
    ex = optimal_mapping(c, a, method="exhaustive")
    assert res.optimal and ex.optimal and ex.groups == res.groups
    assert ex.objective_value == pytest.approx(res.objective_value, rel=1e-9)
    for m in (res.mapping, greedy_mapping(c, a), unfused_baseline(c, a)):
        r = verify_mapping(c, a, mapping=m, backend="numba")
        assert r["ok"], r


def test_gc_is_restored() -> None:
    """The mapper pauses the cyclic collector while it runs, and leaves it as it found it."""
    import gc

    assert gc.isenabled()
    optimal_mapping(open_cascade("mamba1-decode"), "imax3")
    assert gc.isenabled()
    gc.disable()
    try:
        optimal_mapping(open_cascade("mamba1-decode"), "imax3")
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("lazy", [False, True])
def test_a_space_searched_in_processes_is_the_one_searched_here(monkeypatch, lazy: bool) -> None:
    """``search_jobs``: each size's group searches run in forked processes (here every size with a search, so
    the small cascade uses them; a lazy space searches its single Einsums so), and the space is the one this
    process builds alone: the same candidates at the same tiles and costs, the same groups dominated and
    searched."""
    from mambalaya.cost.context import CostContext
    from mambalaya.mapper import space as sp

    c, a = open_cascade("mamba1-decode"), load_arch("h200")
    alone = build_space(c, a, ctx=CostContext(c, a), lazy=lazy)
    sent: list[int] = []
    real = sp.Coster.searches
    monkeypatch.setattr(sp, "POOL_FROM", 1)
    monkeypatch.setattr(sp.Coster, "searches", lambda self, groups: sent.append(len(got := real(self, groups))) or got)
    with sp.search_jobs(2):
        spread = build_space(c, a, ctx=CostContext(c, a), lazy=lazy)
    assert sum(sent) > (len(c.einsums) - 1 if lazy else 20)
    assert [(x.einsums, x.group, x.traffic_bytes, x.latency_s, x.buffer_bytes) for x in spread.candidates] == \
        [(x.einsums, x.group, x.traffic_bytes, x.latency_s, x.buffer_bytes) for x in alone.candidates]
    assert (spread.dominated, spread.coster.searched) == (alone.dominated, alone.coster.searched)
