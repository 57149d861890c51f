"""Fusion class of every producer -> tensor -> consumer edge, checked by hand."""

from __future__ import annotations

import pytest
import sympy

from mambalaya.analysis import classify_edges, format_edge_table
from mambalaya.analysis.edges import evaluate_buffer, fusion_class, tile_symbol
from mambalaya.analysis.summary import analyze
from mambalaya.fileio import resolve_shipped
from mambalaya.ir.expr import param_symbol
from mambalaya.parse.cascade_file import cascade_from_dict, load_cascade

# (producer, consumer): (class, private producer ranks, private consumer ranks), with why.
MAMBA1 = {
    # in_proj X0 iterates b,l,d,e (e reduced); the conv iterates b,l,d,k and reads X0[b,l+k-d_conv+1,d]:
    # l (also in XC's output) is shared, k is private to XC and gives a backward halo of d_conv-1 rows.
    ("X0", "XC"): ("RD", {"e"}, {"k"}),
    # the conv reduces k, SiLU reads XC[b,l,d] plainly: only the producer has a private rank.
    ("XC", "X"): ("RSb", {"k"}, set()),
    # x_proj pieces read X[b,l,d] and iterate their output rank (r or n): a broadcast of X over it.
    ("X", "DTR"): ("RSp", set(), {"r"}),
    ("X", "BM"): ("RSp", set(), {"n"}),
    ("X", "CM"): ("RSp", set(), {"n"}),
    # x_proj reduces d, dt_proj produces d: same name, but neither indexes DTR[b,l,r]: private to each.
    ("DTR", "DT0"): ("RD", {"d"}, {"d"}),
    # dt_proj reduces r; softplus reads DT0[b,l,d] plainly.
    ("DT0", "DT"): ("RSb", {"r"}, set()),
    # dA = exp(dt*A) iterates n, which DT[b,l,d] lacks: a broadcast over n.
    ("DT", "DA"): ("RSp", set(), {"n"}),
    # A[d,n] is broadcast over b and l by dA.
    ("A", "DA"): ("RSp", set(), {"b", "l"}),
    # dBx = dt*B*x: DT and X broadcast over n; BM (x_proj reduces d) feeds BX, whose d is its own.
    ("DT", "BX"): ("RSp", set(), {"n"}),
    ("BM", "BX"): ("RD", {"d"}, {"d"}),
    ("X", "BX"): ("RSp", set(), {"n"}),
    # the recurrence H iterates b,l,d,n exactly like DA and BX: RI, with the iterative rank l.
    ("DA", "H"): ("RI", set(), set()),
    ("BX", "H"): ("RI", set(), set()),
    # C (x_proj reduces d) read by the readout SY, which iterates its own d.
    ("CM", "SY"): ("RD", {"d"}, {"d"}),
    # the readout S = sum_n C*H: both iterate b,l,d,n and n indexes H in both (DESIGN's RI example).
    ("H", "SY"): ("RI", set(), set()),
    # SY reduces n, Y = SY + Dskip*X reads SY[b,l,d] (DESIGN's RSb example).
    ("SY", "Y"): ("RSb", {"n"}, set()),
    # the D skip reads X[b,l,d] in Y's own iteration space.
    ("X", "Y"): ("RI", set(), set()),
    # G = Y * silu(Z) after Y (DESIGN's RI example); Z comes from in_proj, which reduces e.
    ("Y", "G"): ("RI", set(), set()),
    ("Z", "G"): ("RSb", {"e"}, set()),
    # out_proj iterates its output rank e, a broadcast of G.
    ("G", "OUT"): ("RSp", set(), {"e"}),
    # the final state reads H at the pinned step seqlen-1: l is not shared, private to H.
    ("H", "HF"): ("RSb", {"l"}, set()),
    # the final conv state reads X0[b,seqlen-d_conv+k,d]: k re-indexes a slice of l (shared); e private.
    ("X0", "CSF"): ("RSb", {"e"}, set()),
}


@pytest.fixture(scope="module")
def mamba1():
    return load_cascade(resolve_shipped("mamba1", "cascades"))


@pytest.fixture(scope="module")
def mamba2():
    return load_cascade(resolve_shipped("mamba2", "cascades"))


@pytest.fixture(scope="module")
def edges1(mamba1):
    return {(e.producer, e.consumer): e for e in classify_edges(mamba1)}


@pytest.fixture(scope="module")
def edges2(mamba2):
    return {(e.producer, e.consumer): e for e in classify_edges(mamba2)}


def test_mamba1_has_exactly_the_hand_checked_edges(edges1):
    assert set(edges1) == set(MAMBA1)


@pytest.mark.parametrize("pair", sorted(MAMBA1))
def test_mamba1_edge_class(edges1, pair):
    cls, private_p, private_c = MAMBA1[pair]
    e = edges1[pair]
    assert (e.fusion_class, set(e.private_producer), set(e.private_consumer)) == (cls, private_p, private_c)


def test_conv_edge_halo_and_buffer(edges1):
    e = edges1[("X0", "XC")]
    (halo,) = e.halos
    assert (halo.rank, halo.direction, halo.size, halo.ranks) == ("l", "backward", 3, ("k",))
    assert sympy.simplify(halo.window - (param_symbol("d_conv") - 1)) == 0
    T = {r: tile_symbol(r) for r in "bld"}
    assert sympy.simplify(e.buffer - T["b"] * T["d"] * (T["l"] + param_symbol("d_conv") - 1)) == 0
    assert e.needs_complete == ("e",)
    assert e.multi_consumer == ("CSF",)


def test_iterative_modifier_on_the_recurrence_edges(edges1):
    for pair in [("DA", "H"), ("BX", "H"), ("H", "SY")]:
        it = edges1[pair].iterative
        assert (it.rank, it.einsum, it.kind) == ("l", "H", "recurrence")
    assert edges1[("H", "HF")].iterative is None  # l is pinned, not shared
    assert edges1[("SY", "Y")].iterative is None


def test_rd_buffer_holds_the_full_mismatched_rank(edges1):
    # dt_proj reduces the shared r and produces its private d: partial sums over a tile of l, all of D
    e = edges1[("DTR", "DT0")]
    T = {r: tile_symbol(r) for r in "blr"}
    D = param_symbol("D")
    assert sympy.simplify(e.buffer - (T["b"] * T["l"] * T["r"] + T["b"] * T["l"] * D)) == 0
    assert e.partial_sums == ("r",)


def test_pinned_and_slice_reads(edges1):
    hf = edges1[("H", "HF")]
    (pinned,) = [m for m in hf.positions if m.pinned]
    assert (pinned.producer_rank, pinned.pinned) == ("l", ("seqlen-1",))
    csf = edges1[("X0", "CSF")]
    assert ("l", "k") in csf.shared
    assert [m.kind for m in csf.positions] == ["same", "slice", "same"]


def test_multi_consumer_lists_the_other_readers(edges1):
    assert set(edges1[("X", "Y")].multi_consumer) == {"DTR", "BM", "CM", "BX"}
    assert edges1[("Y", "G")].multi_consumer == ()


def test_full_extent_fallback(mamba1, edges1):
    e = edges1[("H", "SY")]
    assert e.buffer_full_elems == mamba1.size("H")
    assert evaluate_buffer(mamba1, e.buffer_full) == mamba1.size("H")


# ---- representative Mamba-2 edges (chunked SSD: splits, merges, chunk recurrence) -------------------
MAMBA2 = {
    # the conv over xBC: RD with a backward halo on l, as in Mamba-1
    ("XBC0", "XBC1"): "RD",
    # DA[b,l,h] read as DA[b,c*chunk+q,h]: l split into (c, q), all shared after re-tiling
    ("DA", "ACS"): "RI",
    # the causal mask reads ACS at q and at s: both shared with ACS's q (q crossed)
    ("ACS", "LM"): "RI",
    # x read as XBC[b,l,h*headdim+p]: the channel rank x split into (h, p)
    ("XBC", "XDT"): "RI",
    # CB reduces n, YD sweeps p; CB[.., h//HG] coarsens h onto the group rank g
    ("CB", "YD"): "RD",
    # chunk states (reduce q) feed the recurrence over chunks
    ("ST", "S"): "RSb",
    # the state read one chunk back, swept over q by YO
    ("S", "YO"): "RSp",
    # the recurrence reads the cumulative decay at the chunk's last step: q pinned, S sweeps p, n
    ("ACS", "S"): "RD",
    # Y[b,l,h,p] reads YD[b,l//chunk,l%chunk,h,p]: (c, q) merged into l; YD reduces s
    ("YD", "Y"): "RSb",
    # Y[b,l,d//headdim,d%headdim]: (h, p) merged into d
    ("Y", "YG"): "RI",
    # the grouped mean reads YG[b,l,DG*g+m] (a split of d) ...
    ("YG", "NV"): "RI",
    # ... and the norm reads NV[b,l,d//DG] (d coarsened onto g); NV reduces m
    ("NV", "YN"): "RSb",
    # the final state reads S at the pinned last chunk
    ("S", "SF"): "RSb",
}


@pytest.mark.parametrize("pair", sorted(MAMBA2))
def test_mamba2_edge_class(edges2, pair):
    assert edges2[pair].fusion_class == MAMBA2[pair]


def test_mamba2_split_merge_and_modifiers(edges2):
    acs = edges2[("DA", "ACS")]
    assert {("l", "c"), ("l", "q")} <= set(acs.shared)
    assert (acs.iterative.rank, acs.iterative.kind) == ("q", "prefix_sum")
    assert [m.kind for m in acs.positions] == ["same", "split", "same"]
    y = edges2[("YD", "Y")]
    assert {("c", "l"), ("q", "l")} <= set(y.shared)
    assert [m.kind for m in y.positions][1:3] == ["merge", "merge"]
    yo = edges2[("S", "YO")]
    assert (yo.iterative.rank, yo.iterative.einsum) == ("c", "S")
    (halo,) = yo.halos
    assert (halo.rank, halo.size, halo.direction, halo.ranks) == ("c", 1, "backward", ())
    lm = edges2[("ACS", "LM")]
    (crossed,) = [m for m in lm.positions if m.cross]
    assert (crossed.shared, crossed.cross) == (("q",), ("s",))
    assert "q" in lm.needs_complete
    assert edges2[("ST", "S")].iterative.rank == "c"
    assert edges2[("NV", "YN")].shared[-1] == ("g", "d")


def test_fusion_class_table():
    assert [fusion_class(p, c) for p, c in [(0, 0), (1, 0), (0, 1), (1, 1)]] == ["RI", "RSb", "RSp", "RD"]


def test_custom_cascade_same_named_private_ranks():
    c = cascade_from_dict({
        "name": "mlp", "params": {"M": 4, "K": 3, "N": 5},
        "ranks": {"m": "M", "k": "K", "n": "N"},
        "tensors": {"W1": {"role": "weight"}, "W2": {"role": "weight"}},
        "einsums": ["T[m,n] = A[m,k] * W1[k,n]", "R[m,n] = silu(T[m,n])", "Y[m,k] = R[m,n] * W2[n,k]"],
    })
    e = {(x.producer, x.consumer): x for x in classify_edges(c)}
    assert e[("T", "R")].fusion_class == "RSb"
    assert e[("R", "Y")].fusion_class == "RSp"  # Y's k is not T's k: private, even though same-named


def test_edge_table_lists_every_edge(mamba1):
    text = format_edge_table(analyze(mamba1, max_group_size=1))
    for producer, consumer in MAMBA1:
        assert producer in text and consumer in text
    assert "halo l <- d_conv - 1" in text
