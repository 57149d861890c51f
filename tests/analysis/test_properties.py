"""Properties of the analyzer over random valid cascades (hypothesis)."""

from __future__ import annotations

import networkx as nx
import pytest
import sympy
from analysis.cascades import random_cascades
from hypothesis import HealthCheck, given, settings

from mambalaya.analysis import GroupAnalyzer, analyze, check_group
from mambalaya.ir.sizes import substitute
from mambalaya.parse.cascade_file import cascade_from_dict

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _convex_connected(cascade, group) -> bool:
    g = cascade.einsum_graph
    s = set(group)
    if not nx.is_weakly_connected(g.subgraph(s)):
        return False
    reach_out = {w for a in s for w in nx.descendants(g, a)} - s
    return not any(nx.descendants(g, w) & s for w in reach_out)


@SETTINGS
@given(random_cascades())
def test_edge_classes_follow_from_the_rank_sets(data):
    cascade = cascade_from_dict(data)
    a = analyze(cascade)
    expected = {(t, e.name) for e in cascade.einsums for t in e.reads
                if t != e.name and cascade.producer(t) is not None}
    assert {(e.producer, e.consumer) for e in a.edges} == expected
    for e in a.edges:
        P, C = cascade.einsum(e.producer), cascade.einsum(e.consumer)
        shared_p = {p for p, _ in e.shared}
        shared_c = {c for _, c in e.shared}
        assert shared_p | set(e.private_producer) == set(P.ranks) and not shared_p & set(e.private_producer)
        assert shared_c | set(e.private_consumer) == set(C.ranks) and not shared_c & set(e.private_consumer)
        assert (e.fusion_class == "RI") == (not e.private_producer and not e.private_consumer)
        assert (e.fusion_class == "RSb") == (bool(e.private_producer) and not e.private_consumer)
        assert (e.fusion_class == "RSp") == (not e.private_producer and bool(e.private_consumer))
        assert (e.fusion_class == "RD") == (bool(e.private_producer) and bool(e.private_consumer))
        assert set(P.reduced_ranks) <= set(e.private_producer)  # a reduced rank never indexes T
        for h in e.halos:
            assert h.size > 0 and h.rank in shared_c
        if e.iterative is not None:
            assert e.iterative.einsum in (e.producer, e.consumer)


@SETTINGS
@given(random_cascades())
def test_candidates_are_convex_connected_and_legality_is_check_group(data):
    cascade = cascade_from_dict(data)
    a = analyze(cascade)
    analyzer = GroupAnalyzer(cascade, a.edges)
    assert len({frozenset(g.einsums) for g in a.groups}) == len(a.groups)
    for g in a.groups:
        assert _convex_connected(cascade, g.einsums)
        assert g.legal == (analyzer.check(g.einsums) == []) == (not g.reasons)
        if g.legal and g.iterative is not None:
            assert g.loop_order[0] == g.iterative
    for g in a.groups[:: max(1, len(a.groups) // 8)]:  # the one-off entry point agrees
        assert check_group(cascade, reversed(g.einsums)) == list(g.reasons)


@SETTINGS
@given(random_cascades(max_einsums=5))
def test_candidate_enumeration_is_complete(data):
    cascade = cascade_from_dict(data)
    names = list(cascade.einsum_names)
    found = {frozenset(g.einsums) for g in analyze(cascade, max_candidates=None).groups}
    brute = set()
    for mask in range(1, 1 << len(names)):
        s = [n for i, n in enumerate(names) if mask >> i & 1]
        if _convex_connected(cascade, s):
            brute.add(frozenset(s))
    assert found == brute


@SETTINGS
@given(random_cascades())
def test_buffer_expression_matches_its_numbers(data):
    cascade = cascade_from_dict(data)
    for g in analyze(cascade).groups:
        if not g.legal:
            continue
        assert 0 <= g.buffer_min_bytes <= g.buffer_full_bytes
        tiles = {r.name: r.size for r in g.loops.ranks}
        subs = {sympy.Symbol(f"T_{name}", integer=True, positive=True): sympy.Integer(v) for name, v in tiles.items()}
        value = substitute(sympy.sympify(g.buffer).xreplace(subs), cascade.values, "buffer")
        assert int(value) == g.buffer_elems(tiles) == g.buffer_elems()
        ones = {name: 1 for name in tiles}
        assert g.buffer_elems(ones) <= g.buffer_elems()


@pytest.mark.parametrize("seed_einsums", [
    ["T0[i] = I0[i] + 0.5 * T0[i-1]", "T1[j] = sum_i(T0[i] * I1[i,j])", "T2[i,j] = T1[j] * T0[i]"],
    ["T0[i,j] = cumsum_i(I0[i,j])", "T1[i,j] = T0[i+w-1,j] * T0[0,j]"],
])
def test_examples_never_crash(seed_einsums):
    data = {"name": "ex", "params": {"na": 3, "nb": 2, "nw": 2}, "ranks": {"i": "na", "j": "nb", "w": "nw"},
            "einsums": seed_einsums}
    a = analyze(cascade_from_dict(data))
    assert a.groups and all(isinstance(g.buffer, sympy.Expr) for g in a.groups)
