"""Op counts worked out by hand (module rule: mambalaya/cost/ops.py docstring)."""

from __future__ import annotations

import sympy

from mambalaya.cost.ops import MATRIX_MAC, cascade_ops, einsum_ops, flops, ops_by_kind
from mambalaya.parse import open_cascade, parse_cascade_text


def test_gemm_chain_is_matrix_macs(mlp):
    ops = cascade_ops(mlp)
    assert ops["T"] == {MATRIX_MAC: 8 * 4 * 6}  # M*K*N MACs: A[m,k] x W1[k,n], k reduced, m and n private
    assert ops["Y"] == {MATRIX_MAC: 8 * 6 * 2}
    assert flops(ops["T"]) == 2 * 192


def test_elementwise_chain(eltwise):
    ops = cascade_ops(eltwise)
    assert ops == {"B": {"exp": 10}, "C": {"mul": 10}, "D": {"add": 10}}


def test_recurrence_and_reduction(scan):
    ops = cascade_ops(scan)
    assert ops["DA"] == {"exp": 15}
    assert ops["H"] == {"mul": 15, "add": 15}  # DA*H[l-1] then + X, over l,n
    assert ops["Y"] == {"mac": 15}  # sum_n C*H: no private rank on C's side, so element-wise, not matrix
    assert ops["HF"] == {}  # a copy costs no arithmetic


def test_hoisting_and_contraction_order():
    c = parse_cascade_text("""
name: h
params: {I: 4, J: 5, K: 3}
ranks: {i: I, j: J, k: K}
einsums:
  - Y[i,j] = exp(A[i]) * B[i,j]
  - Z[i,j] = P[i,k] * Q[i,k] * R[k,j]
""")
    ops = cascade_ops(c)
    assert ops["Y"] == {"exp": 4, "mul": 20}  # exp hoisted out of j: I exps, then I*J muls
    # P*Q first (union i,k: 12 points), then a GEMM-shaped MAC over i,j,k (60)
    assert ops["Z"] == {"mul": 12, MATRIX_MAC: 60}


def test_causal_mask_counts_kept_pairs():
    c = parse_cascade_text("""
name: m
params: {Q: 8, H: 2}
ranks: {q: Q, s: Q, h: H}
einsums:
  - LM[q,s,h] = exp(A[q,h] - A[s,h]) where s <= q
""")
    ops = cascade_ops(c)
    assert ops["LM"] == {"add": 2 * 36, "exp": 2 * 36}  # Q(Q+1)/2 = 36 kept (q, s) pairs per head


def test_symbolic_matches_numeric():
    c = open_cascade("mamba2", params={"seqlen": 100})
    sym = cascade_ops(c, symbolic=True)
    num = cascade_ops(c)
    values = {sympy.Symbol(k, positive=True): v for k, v in c.values.items()}
    for name, kinds in num.items():
        assert set(sym[name]) == set(kinds)
        for k, v in kinds.items():
            assert int(sympy.sympify(sym[name][k]).subs(values)) == v, (name, k)


def test_mamba2_ssd_is_on_the_matrix_unit():
    c = open_cascade("mamba2", model="mamba2-370m", params={"seqlen": 512})
    for name in ("Z", "CB", "YD", "ST", "YO", "OUT"):
        assert MATRIX_MAC in ops_by_kind(einsum_ops(c, name)), name
    assert MATRIX_MAC not in ops_by_kind(einsum_ops(c, "XBC1"))  # depthwise conv: element-wise
