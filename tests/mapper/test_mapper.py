"""The exact mapper: CP-SAT equals brute force, proves optimality, explains infeasibility."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from random_cascade import cascade_text

from mambalaya.arch import load_arch
from mambalaya.errors import MappingError
from mambalaya.exec.reference import random_inputs, run_reference
from mambalaya.ir.chain import chain_layers
from mambalaya.mapper import evaluate, map_command_result, optimal_mapping
from mambalaya.mapper.solver import Problem, Solution, cheapest_covers, quotient_cycle, solve
from mambalaya.parse import open_cascade, parse_cascade_text

SMALL = ["mlp2", "attention", "mamba1-decode", "mamba2-decode"]


def _same(a, b) -> None:
    """Same optimum on both keys: the objective, then the other figure (the tie-break)."""
    tol = max(a.resolution, b.resolution) * 64
    assert math.isclose(a.objective_value, b.objective_value, rel_tol=1e-9, abs_tol=tol), \
        (a.objective_value, b.objective_value, a.groups, b.groups)
    other = (lambda r: r.report.traffic_bytes) if a.objective == "latency" else (lambda r: r.report.latency_s)
    assert math.isclose(other(a), other(b), rel_tol=1e-9, abs_tol=64 if a.objective == "latency" else 64e-12), \
        (other(a), other(b), a.groups, b.groups)


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("arch", ["imax3", "h200"])
def test_ilp_equals_exhaustive(name: str, arch: str) -> None:
    c = open_cascade(name)
    ilp = optimal_mapping(c, arch)
    ex = optimal_mapping(c, arch, method="exhaustive")
    assert ilp.optimal and ex.optimal
    _same(ilp, ex)


@pytest.mark.slow
@pytest.mark.parametrize(("objective", "arch", "name"), [  # (mamba2 on h200 by latency: test_space's default-mamba2 test)
    (o, a, n) for o in ("latency", "traffic") for a in ("imax3", "h200", "marca") for n in ("mamba2", "mamba1", "attention")
    if (o, a, n) != ("latency", "h200", "mamba2")])
def test_ilp_equals_exhaustive_all(name: str, arch: str, objective: str) -> None:
    c = open_cascade(name)
    _same(optimal_mapping(c, arch, objective), optimal_mapping(c, arch, objective, method="exhaustive"))


@pytest.mark.parametrize("name", SMALL)
def test_mapping_validates_and_report_adds_up(name: str) -> None:
    c = open_cascade(name)
    for objective in ("latency", "traffic"):
        r = optimal_mapping(c, "imax3", objective)
        r.mapping.validate(c)
        rep = evaluate(c, "imax3", r.mapping)  # a fresh evaluation agrees with the solver's sum
        value = rep.latency_s if objective == "latency" else rep.traffic_bytes
        assert math.isclose(value, r.objective_value, rel_tol=1e-9)
        unfused = evaluate(c, "imax3")
        assert value <= (unfused.latency_s if objective == "latency" else unfused.traffic_bytes) * (1 + 1e-12)


def test_unfused_arch_keeps_singletons() -> None:
    r = optimal_mapping(open_cascade("mamba1"), "marca")
    assert all(len(g) == 1 for g in r.groups) and r.optimal


def test_infeasible_explained() -> None:
    c = open_cascade("mamba1")
    arch = load_arch("imax3").with_overrides(fusion_buffer_bytes=2)
    with pytest.raises(MappingError, match=r"no mapping fits a 2 B buffer.*Einsum \w+ alone needs at least"):
        optimal_mapping(c, arch)


@pytest.mark.parametrize("lazy", [True, False])
def test_infeasible_explained_when_only_a_bound_fitted(lazy: bool) -> None:
    """A nested max no tiling fits alone, behind a producer whose group with it the lazy space bounds as fitting:
    once the search drops that group, the error still names the Einsum and why (not a bare solver message)."""
    c = parse_cascade_text("""
name: nested
params: {B: 4, L: 40, C: 30}
ranks: {b: B, l: L, c: C}
tensors: {X: {role: input}, MX: {role: output}}
einsums:
  - Y[b,l,c] = exp(X[b,l,c])
  - MX[b] = max_l(max_c(Y[b,l,c]))
""")
    arch = load_arch("imax3").with_overrides(fusion_buffer_bytes=100)
    with pytest.raises(MappingError, match=r"Einsum MX alone needs at least .*a max over the tiled rank"):
        optimal_mapping(c, arch, lazy=lazy)


def test_cyclic_cover_is_cut() -> None:
    # A->B, C->B, C->D, A->D: groups {A,D} and {B,C} are convex but schedule cyclically
    p = Problem(("A", "C", "B", "D"), (("A", "B"), ("C", "B"), ("C", "D"), ("A", "D")),
                (("A",), ("B",), ("C",), ("D",), ("A", "D"), ("C", "B")), (10, 10, 10, 10, 1, 1))
    for method in ("cpsat", "exhaustive", "downsets", "ilp"):
        s = solve(p, method)
        assert s.objective == 21 and s.optimal  # one pair fused, the other split
        assert quotient_cycle(p, s.chosen) is None


@st.composite
def problems(draw) -> Problem:
    """A random exact-cover instance with few distinct costs (so ties abound) and random secondary costs."""
    n = draw(st.integers(2, 7))
    names = tuple(f"E{i}" for i in range(n))
    edges = tuple((names[i], names[j]) for i in range(n) for j in range(i + 1, n) if draw(st.booleans()))
    groups = {(e,) for e in names}
    for g in draw(st.lists(st.sets(st.sampled_from(names), min_size=2, max_size=4), max_size=10)):
        groups.add(tuple(e for e in names if e in g))
    groups_t = tuple(sorted(groups))
    costs = tuple(draw(st.integers(0, 3)) * len(g) for g in groups_t)  # additive-ish: many equal covers
    second = tuple(draw(st.integers(0, 9)) for _ in groups_t)
    fused = [i for i, g in enumerate(groups_t) if len(g) > 1]  # at-most-one rows (singletons stay free: feasible)
    rows = tuple(tuple(r) for r in draw(st.lists(st.sets(st.sampled_from(fused), min_size=2), max_size=3))
                 ) if len(fused) >= 2 else ()
    return Problem(names, edges, groups_t, costs, second, conflicts=rows)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_lexicographic_solvers_agree(problem: Problem) -> None:
    """Every backend: the least objective, then the least secondary among the covers that reach it
    (and at most one column of each conflict row, as recomputation adds)."""
    ex = solve(problem, "exhaustive")
    for method in ("mip", "cpsat", "layers", "ilp", *(() if problem.conflicts else ("downsets",))):
        s = solve(problem, method)
        assert s.optimal and (s.objective, s.secondary) == (ex.objective, ex.secondary), method
        assert s.objective == sum(problem.costs[i] for i in s.chosen), method
        assert s.secondary == sum(problem.secondary[i] for i in s.chosen)
        assert all(sum(i in s.chosen for i in row) <= 1 for row in problem.conflicts)
        assert sorted(e for i in s.chosen for e in problem.groups[i]) == sorted(problem.einsums), method
        assert quotient_cycle(problem, s.chosen) is None, method


def _covers(problem: Problem):
    """Every schedulable cover of a small problem, by brute force (the first uncovered Einsum's groups in turn)."""
    def rec(left: tuple[str, ...], chosen: tuple[int, ...]):
        if not left:
            if quotient_cycle(problem, chosen) is None:
                yield chosen
            return
        for i, g in enumerate(problem.groups):
            if left[0] in g and set(g) <= set(left):
                yield from rec(tuple(e for e in left if e not in g), (*chosen, i))

    yield from rec(problem.einsums, ())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_cheapest_covers_through_each_candidate(problem: Problem) -> None:
    """What the lazy space prunes by: per candidate the least objective of a cover holding it, against every
    cover; and the least cover of some candidates alone (its searched ones), from the same walk."""
    problem = replace(problem, conflicts=())
    least, through = cheapest_covers(problem)
    covers = list(_covers(problem))
    assert least == min(sum(problem.costs[i] for i in c) for c in covers)
    for i in range(len(problem.groups)):
        holding = [sum(problem.costs[j] for j in c) for c in covers if i in c]
        assert through[i] == (min(holding) if holding else None), problem.groups[i]
    within = set(range(0, len(problem.groups), 2))  # (the lazy space's searched candidates: the cover of them alone)
    alone = [sum(problem.costs[j] for j in c) for c in covers if set(c) <= within]
    assert cheapest_covers(problem, within) == ((min(alone) if alone else None), through)
    # (a solve walks the downsets once for the covers that follow over the same candidates: their costs are theirs)
    assert solve(problem, "downsets").objective == least
    double = replace(problem, costs=tuple(2 * c for c in problem.costs))
    assert cheapest_covers(double) == (2 * least, [None if t is None else 2 * t for t in through])


def test_downsets_hands_ilp_to_mip_past_its_limit(monkeypatch) -> None:
    """``ilp`` is the downset path where it applies; a problem with more downsets than the limit, or with
    conflict rows, is solved by SCIP, to the same optimum."""
    from mambalaya.mapper import solver as backend

    p = Problem(("A", "B", "C"), (("A", "C"),), (("A",), ("B",), ("C",), ("A", "C"), ("B", "C")), (5, 5, 5, 6, 7))
    assert (s := solve(p, "ilp")).method == "downsets" and s.objective == 11 and s.nodes == 5  # {} A B AB AC
    monkeypatch.setattr(backend, "DOWNSETS_MAX", 3)
    with pytest.raises(backend.TooManyDownsets):
        solve(p, "downsets")
    assert (s := solve(p, "ilp")).method == "mip" and s.objective == 11
    monkeypatch.undo()
    rows = replace(p, conflicts=((3, 4),))
    assert (s := solve(rows, "ilp")).method == "mip" and s.objective == 11
    with pytest.raises(MappingError, match="no budget or conflict rows"):
        solve(rows, "downsets")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_a_stalled_second_solve_is_finished_by_cpsat(problem: Problem) -> None:
    """SCIP can stall on the tie-break solve's budget row (no point found within its limit): the
    lexicographic result is still the least objective and then the least secondary, proven."""
    from mambalaya.mapper import solver as backend

    def stalls_on_budgets(p: Problem, time_limit_s: float | None = None) -> Solution:
        if p.budget is not None:
            raise MappingError("SCIP found no mapping within 2 s (status 6)")
        return backend._mip_once(p, time_limit_s)

    ex = solve(problem, "exhaustive")
    s = backend.lexicographic(problem, stalls_on_budgets, None, "mip")
    assert s.optimal and (s.objective, s.secondary) == (ex.objective, ex.secondary)


@pytest.mark.slow
def test_latency_ties_broken_by_traffic() -> None:
    """Regression (bench_accelforge on tpu_v4i): Mamba-1 prefill is compute-bound there, so many mappings
    tie on latency; the mapper returned one moving 1.23 GB where 120 MB has the same latency (seqlen 8192:
    bench_accelforge's 17.8 GB against 62 MB). Ties now go to the least traffic, in every solver."""
    from pathlib import Path

    arch = load_arch(str(Path(__file__).resolve().parents[2] / "benchmarks" / "archs" / "tpu_v4i.yaml"))
    c = open_cascade("mamba1", model="mamba-1.4b", params={"d_state": 128, "batch": 1, "seqlen": 256})
    ilp = optimal_mapping(c, arch)
    assert ilp.optimal and ilp.report.traffic_bytes < 0.2e9, ilp.report.traffic_bytes
    _same(ilp, optimal_mapping(c, arch, method="cpsat"))
    by_traffic = optimal_mapping(c, arch, "traffic")
    assert by_traffic.report.traffic_bytes <= ilp.report.traffic_bytes
    assert ilp.report.latency_s <= by_traffic.report.latency_s * (1 + 1e-12)


def test_unknown_method_and_objective() -> None:
    c = open_cascade("mlp2")
    with pytest.raises(MappingError, match="unknown mapping method"):
        optimal_mapping(c, "h200", method="magic")
    with pytest.raises(MappingError, match="unknown objective"):
        optimal_mapping(c, "h200", objective="energy")


def test_map_command_result_contract() -> None:
    out = map_command_result(open_cascade("mamba1-decode"), "imax3", "latency", "ilp", 2, None)
    for key in ("arch", "objective", "groups", "traffic_bytes", "latency_s", "optimal", "solve_s", "unfused",
                "einsums"):
        assert key in out
    # two 9-Einsum layers: groups crossing the boundary past the default cap were not searched, and it says so
    assert out["optimal"] is False and "crossing a layer boundary" in out["left_out"] and out["layers"] == 2
    assert out["gap"] == 0  # (solved exactly over the space it searched)
    for key in ("traffic_bytes", "latency_s"):
        assert key in out["unfused"]
    row = out["einsums"][0]
    for key in ("name", "group", "traffic_bytes", "compute_s", "memory_s", "latency_s", "ops"):
        assert key in row
    assert sum(len(g) for g in out["groups"]) == len(out["einsums"])


# ---- chained layers ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mamba1", "mamba2", "mamba1-decode", "mamba2-decode"])
def test_chain_layers_equals_layer_by_layer(name: str) -> None:
    c = open_cascade(name, params={"batch": 2})
    n = 3
    ch = chain_layers(c, n)
    assert len(ch.einsums) >= n * len(c.einsums)
    inputs = random_inputs(ch, seed=1, scale=0.3)
    full = run_reference(ch, inputs)
    out, inp = ch.meta["feed"]
    x = inputs[f"{inp}_L0"]
    for k in range(n):
        layer = {t: inputs[f"{t}_L{k}"] for t in c.inputs() if t != inp}
        layer[inp] = np.reshape(x, c.shape(inp))
        ref = run_reference(c, layer)
        for o in c.outputs():
            np.testing.assert_allclose(full[f"{o}_L{k}"], ref[o], rtol=1e-10, atol=1e-12)
        x = ref[out]


def test_chain_needs_feed_when_ambiguous() -> None:
    with pytest.raises(Exception, match="feed"):
        chain_layers(open_cascade("mlp2"), 2)


@pytest.mark.slow
def test_chained_ilp_equals_exhaustive() -> None:
    ch = chain_layers(open_cascade("mamba2-decode"), 2)
    _same(optimal_mapping(ch, "imax3", max_size=6), optimal_mapping(ch, "imax3", method="exhaustive", max_size=6))


# ---- random cascades --------------------------------------------------------------------------


@st.composite
def cascades(draw) -> str:
    """A small random valid cascade as YAML: GEMMs, element-wise maps, reductions, broadcasts, a recurrence."""
    n = draw(st.integers(2, 6))
    mats = ["A"]  # tensors shaped [m, n]
    vecs: list[str] = []  # tensors shaped [m]
    lines, weights = [], []
    for i in range(n):
        name = f"T{i}"
        kind = draw(st.sampled_from(["gemm", "unary", "binary", "reduce", "bcast", "rec"]))
        p = draw(st.sampled_from(mats))
        if kind == "gemm":
            weights.append(f"W{i}")
            lines.append(f"{name}[m,n] = {p}[m,k] * W{i}[k,n]")
        elif kind == "unary":
            lines.append(f"{name}[m,n] = {draw(st.sampled_from(['silu', 'exp', 'sigmoid']))}({p}[m,n])")
        elif kind == "binary":
            q = draw(st.sampled_from(mats))
            lines.append(f"{name}[m,n] = {p}[m,n] * {q}[m,n]")
        elif kind == "reduce":
            lines.append(f"{name}[m] = sum_n({p}[m,n])")
            vecs.append(name)
            continue
        elif kind == "bcast" and vecs:
            lines.append(f"{name}[m,n] = {p}[m,n] * {draw(st.sampled_from(vecs))}[m]")
        elif kind == "rec":
            q = draw(st.sampled_from(mats))
            lines.append(f"{name}[m,n] = {p}[m,n] * {name}[m-1,n] + {q}[m,n]")
        else:
            lines.append(f"{name}[m,n] = neg({p}[m,n])")
        mats.append(name)
    size = draw(st.sampled_from([8, 64, 512]))
    return cascade_text(lines, weights, size)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=cascades(), arch=st.sampled_from(["imax3", "h200", "mambalaya"]),
       objective=st.sampled_from(["latency", "traffic"]))
def test_random_cascades_ilp_equals_exhaustive(text: str, arch: str, objective: str) -> None:
    c = parse_cascade_text(text, file="<random>")
    ilp = optimal_mapping(c, arch, objective)
    ex = optimal_mapping(c, arch, objective, method="exhaustive")
    assert ilp.optimal
    _same(ilp, ex)
    ilp.mapping.validate(c)


# ---- whole models at published sizes (regression: integer resolution wiped out the optimum) ---------


@pytest.mark.slow
@pytest.mark.parametrize("name,arch", [("mamba2-decode", "imax3"), ("mamba1-decode", "h200"),
                                       ("mamba2-decode", "mambalaya")])
def test_chain_costs_layers_times_one_layer(name: str, arch: str) -> None:
    """Without cross-layer groups (max_cross=1) the L-layer optimum is L one-layer optima plus the adapters."""
    c = open_cascade(name, model="mamba2-370m" if "2" in name else "mamba-370m", params={"batch": 64})
    one = optimal_mapping(c, arch)
    assert one.optimal and one.resolution * len(c.einsums) <= one.objective_value * 1e-5
    for n in (2, 8):
        ch = optimal_mapping(c, arch, layers=n, max_cross=1)
        names = {f"{e}_L{k}" for e in c.einsum_names for k in range(n)}
        adapters = sum(g.latency_s for g in ch.report.groups if not set(g.einsums) <= names)
        assert ch.optimal
        assert math.isclose(ch.objective_value, n * one.objective_value + adapters, rel_tol=1e-9), \
            (n, ch.objective_value, n * one.objective_value + adapters)
        # with cross-layer groups allowed it can only get better
        full = optimal_mapping(c, arch, layers=n)
        assert full.objective_value <= ch.objective_value * (1 + 1e-12)


@pytest.mark.parametrize("name,arch", [("mamba2-decode", "imax3"), ("attention", "imax3"),
                                       pytest.param("mamba1", "h200", marks=pytest.mark.slow)])
def test_dominance_pruning_keeps_the_optimum(name: str, arch: str, monkeypatch) -> None:
    from mambalaya.mapper import space as sp

    c = open_cascade(name)
    pruned = optimal_mapping(c, arch)
    monkeypatch.setattr(sp.Coster, "_split", lambda self, members: (float("inf"), float("inf")))
    sp.clear_shared()  # (the pruned map's searches are kept per process: search again, without pruning)
    full = optimal_mapping(c, arch)
    assert full.candidates >= pruned.candidates
    _same(pruned, full)


def test_mip_and_cpsat_agree() -> None:
    c = open_cascade("mamba2-decode")
    _same(optimal_mapping(c, "imax3", method="mip"), optimal_mapping(c, "imax3", method="cpsat"))
