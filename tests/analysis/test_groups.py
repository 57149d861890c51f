"""Candidate fusion groups: enumeration, legality rules, loop order, buffer need, off-chip tensors."""

from __future__ import annotations

import json
import time
from pathlib import Path

import networkx as nx
import pytest
import sympy
from analysis.cascades import chain_layers

from mambalaya.analysis import GroupAnalyzer, analyze, analyze_group, candidate_groups, check_group
from mambalaya.analysis.edges import tile_symbol
from mambalaya.errors import CascadeError
from mambalaya.fileio import resolve_shipped
from mambalaya.ir.expr import param_symbol
from mambalaya.ir.mapping import load_mapping, unfused_mapping
from mambalaya.parse.cascade_file import cascade_from_dict, load_cascade

FIGURES = Path(__file__).resolve().parents[2] / "docs" / "figures"


@pytest.fixture(scope="module")
def mamba1():
    return load_cascade(resolve_shipped("mamba1", "cascades"))


@pytest.fixture(scope="module")
def mamba2():
    return load_cascade(resolve_shipped("mamba2", "cascades"))


def scan_cascade(extra: list[str]) -> dict:
    """A tiny recurrence on l with extra Einsums around it."""
    return {
        "name": "scan", "params": {"L": 6, "D": 3}, "ranks": {"l": "L", "d": "D", "e": "D"},
        "einsums": ["X[l,d] = U[l,d] * V[d]", *extra],
    }


def brute_force_groups(cascade) -> set[frozenset[str]]:
    g = cascade.einsum_graph
    names = list(cascade.einsum_names)
    out = set()
    for mask in range(1, 1 << len(names)):
        s = {n for i, n in enumerate(names) if mask >> i & 1}
        if not nx.is_weakly_connected(g.subgraph(s)):
            continue
        outside = set(names) - s
        if any(nx.has_path(g, w, b) for w in outside for a in s if nx.has_path(g, a, w) for b in s):
            continue
        out.add(frozenset(s))
    return out


# ---- enumeration ---------------------------------------------------------------------------------------
def test_candidates_are_the_connected_convex_subgraphs():
    c = cascade_from_dict(scan_cascade([
        "M[d] = sum_l(X[l,d])", "H[l,d] = M[d] * H[l-1,d] + X[l,d]", "Y[l,d] = H[l,d] * X[l,d]",
    ]))
    assert {frozenset(g) for g in candidate_groups(c)} == brute_force_groups(c)


def test_mamba_counts_and_time(mamba1, mamba2):
    for cascade, count in ((mamba1, 861), (mamba2, 3171)):
        start = time.perf_counter()
        a = analyze(cascade)
        assert len(a.groups) == count and not a.truncated and a.complete_size == len(cascade.einsums)
        assert time.perf_counter() - start < 15
    assert len({g.einsums for g in a.groups}) == len(a.groups)  # each once


def test_chain_of_layers_is_pruned_not_exploding():
    chain = chain_layers("mamba2", 8)
    assert len(chain.einsums) == 8 * 24
    start = time.perf_counter()
    a = analyze(chain, max_group_size=6, max_candidates=None)
    assert time.perf_counter() - start < 20
    assert len(a.groups) == 3901 and a.truncated and a.complete_size == 6
    budget = analyze(chain_layers("mamba1", 8), max_candidates=2000)
    assert budget.truncated and 2000 <= len(budget.groups) < 5000
    assert all(len(g.einsums) <= budget.complete_size + 1 for g in budget.groups)


def test_capacity_prunes_and_explains(mamba1):
    a = analyze(mamba1, capacity_bytes=2048)
    too_big = [g for g in a.groups if not g.legal]
    assert too_big and all("more than the capacity 2048 bytes" in g.reasons[0] for g in too_big)
    assert all(g.buffer_min_bytes <= 2048 for g in a.legal_groups)
    assert len(a.groups) < 861


# ---- legality ------------------------------------------------------------------------------------------
def test_whole_mamba1_layer_is_legal_with_l_outermost(mamba1):
    g = analyze_group(mamba1, mamba1.einsum_names)
    assert g.legal and g.iterative == "l" and g.loop_order[0] == "l"
    # dt_proj needs all of x_proj's d: d cannot be tiled in this group
    assert "d" in g.untiled
    assert set(g.writes) == {"OUT", "HF", "CSF"} and "U" in g.reads and "H0" in g.reads
    assert "A held whole along n" in " ".join(g.notes)


def test_whole_mamba2_layer_is_legal_with_chunks_outermost(mamba2):
    g = analyze_group(mamba2, mamba2.einsum_names)
    assert g.legal and g.iterative == "c" and g.loop_order[0] == "c"
    assert "q" in g.untiled  # the causal mask reads ACS at q and at s
    assert any(n.startswith("l re-tiled as c and q") for n in g.notes)


def test_conv_group_buffer_is_the_halo_window(mamba1):
    g = analyze_group(mamba1, ["X0", "XC"])
    T = {r: tile_symbol(r) for r in "bld"}
    assert sympy.simplify(g.buffer - T["b"] * T["d"] * (T["l"] + param_symbol("d_conv") - 1)) == 0
    assert g.buffer_elems({"b": 1, "l": 8, "d": 16}) == 1 * (8 + 3) * 16
    assert g.buffer_full_bytes == 4 * 1 * (64 + 3) * 128
    assert g.internal == ("X0",) and g.writes == ("X0", "XC")  # X0 is also read by CSF, outside


def test_reduction_over_the_iterative_rank_before_the_recurrence_is_illegal():
    c = cascade_from_dict(scan_cascade(["M[d] = sum_l(X[l,d])", "H[l,d] = M[d] * H[l-1,d] + X[l,d]"]))
    reasons = check_group(c, ["X", "M", "H"])
    assert len(reasons) == 1 and "iterative rank l of H cannot stay the outermost sequential loop" in reasons[0]
    assert "H needs all of l from M (M reduces l)" in reasons[0]
    assert check_group(c, ["M", "H"]) == []  # M's l is not the recurrence's loop: M runs first
    assert check_group(c, ["X", "H"])[0].startswith("not convex")  # X -> M -> H leaves the group


def test_reduction_over_the_iterative_rank_after_the_recurrence_accumulates():
    c = cascade_from_dict(scan_cascade(["H[l,d] = X[l,d] * H[l-1,d] + X[l,d]", "S[d] = sum_l(H[l,d])"]))
    assert check_group(c, ["X", "H", "S"]) == []


def test_reading_the_last_step_inside_the_loop_is_illegal():
    c = cascade_from_dict(scan_cascade(["H[l,d] = X[l,d] * H[l-1,d] + X[l,d]", "Y[l,d] = H[L-1,d] * X[l,d]"]))
    (reason,) = check_group(c, ["X", "H", "Y"])
    assert "reads H at l = L-1" in reason
    assert check_group(c, ["H", "Y"]) == []  # Y's l is its own loop, after the recurrence


def test_two_iterative_ranks_are_illegal():
    c = cascade_from_dict(scan_cascade(["H[l,d] = X[l,d] * H[l-1,d] + X[l,d]",
                                        "G[l,d] = H[l,d] * G[l,d-1] + X[l,d]"]))
    (reason,) = check_group(c, ["H", "G"])
    assert reason.startswith("two iterative ranks: l (H), d (G)")


def test_structural_reasons(mamba1):
    (reason,) = check_group(mamba1, ["X", "Y"])
    assert reason.startswith("not convex") and "leaves the group at" in reason
    (reason,) = check_group(mamba1, ["Z", "X0"])
    assert reason.startswith("not connected")
    assert check_group(mamba1, ["NOPE"]) == ["unknown Einsum(s) NOPE"]
    assert check_group(mamba1, []) == ["empty group"]


def test_chained_layers_share_one_iterative_loop():
    two = chain_layers("mamba2", 2)
    g = analyze_group(two, two.einsum_names)
    assert g.legal and g.iterative == "c"
    m1 = chain_layers("mamba1", 2)
    assert check_group(m1, m1.einsum_names) == []


def test_hand_made_and_unfused_mappings_are_legal(mamba1, mamba2):
    for cascade in (mamba1, mamba2):
        mapping = load_mapping(FIGURES / f"{cascade.name}-fused.mapping.yaml").validate(cascade)
        analyzer = GroupAnalyzer(cascade)
        for group in (*mapping.groups, *unfused_mapping(cascade).groups):
            assert analyzer.check(group.einsums) == []


# ---- JSON and tables --------------------------------------------------------------------------------------
def test_json_contract(mamba2):
    a = analyze(mamba2)
    data = json.loads(json.dumps(a.to_json(), allow_nan=False))
    assert data["params"]["dt_max"] == "inf"
    assert [e["name"] for e in data["einsums"]] == list(mamba2.einsum_names)
    for key in ("name", "text", "ranks", "reads", "writes"):
        assert all(key in e for e in data["einsums"])
    assert data["tensors"]["U"] == {"role": "input", "shape": [1, 100, 64], "dtype": "float32",
                                    "ranks": ["b", "l", "e"]}
    for edge in data["edges"]:
        assert {"producer", "consumer", "tensor", "class", "iterative", "halo"} <= set(edge)
        assert edge["class"] in ("RI", "RSb", "RSp", "RD")
    conv = next(e for e in data["edges"] if e["consumer"] == "XBC1")
    assert conv["halo"]["rank"] == "l" and conv["halo"]["size"] == 3
    assert data["groups_legal"] == 3171 and data["groups_candidates"] == 3171
    full = analyze(mamba2, max_group_size=2).to_json(include_groups=True)
    assert len(full["groups"]) == full["groups_candidates"] and "buffer" in full["groups"][0]


def test_bad_cascade_raises_the_parser_error():
    with pytest.raises(CascadeError):
        analyze(cascade_from_dict(scan_cascade(["Y[l,q] = X[l,d]"])))
