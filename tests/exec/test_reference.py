"""The reference interpreter against straight-line loops, one language feature at a time."""

from __future__ import annotations

import numpy as np
import pytest

from mambalaya.exec.reference import random_inputs, run_reference
from mambalaya.parse import parse_cascade_text


def run(text: str, seed: int = 0, **inputs):
    cascade = parse_cascade_text(text)
    values = random_inputs(cascade, seed)
    values.update(inputs)
    return cascade, values, run_reference(cascade, values)


def test_implicit_summation_is_per_term():
    # the bias is added once, not once per k: Einstein summation applies to each product term
    _, v, out = run("""
name: t
params: {M: 3, K: 4}
ranks: {m: M, k: K}
einsums:
  - Y[m] = W[m,k] * X[k] + b[m]
""")
    np.testing.assert_allclose(out["Y"], v["W"] @ v["X"] + v["b"], atol=1e-12)


@pytest.mark.parametrize("op,fn", [("sum", np.sum), ("max", np.max), ("min", np.min), ("mean", np.mean)])
def test_explicit_reductions(op, fn):
    _, v, out = run(f"""
name: t
params: {{M: 3, N: 5}}
ranks: {{m: M, n: N}}
einsums:
  - Y[m] = {op}_n(A[m,n] * 2)
""")
    np.testing.assert_allclose(out["Y"], fn(v["A"] * 2, axis=1), atol=1e-12)


def test_prefix_sum_keeps_its_rank():
    _, v, out = run("""
name: t
params: {N: 6}
ranks: {n: N}
einsums:
  - Y[n] = cumsum_n(A[n])
""")
    np.testing.assert_allclose(out["Y"], np.cumsum(v["A"]), atol=1e-12)


@pytest.mark.parametrize("fn,ref", [
    ("exp", np.exp), ("softplus", lambda x: np.log1p(np.exp(x))), ("silu", lambda x: x / (1 + np.exp(-x))),
    ("sigmoid", lambda x: 1 / (1 + np.exp(-x))), ("neg", np.negative), ("abs", np.abs),
])
def test_unary_functions(fn, ref):
    _, v, out = run(f"""
name: t
params: {{N: 7}}
ranks: {{n: N}}
einsums:
  - Y[n] = {fn}(A[n])
""")
    np.testing.assert_allclose(out["Y"], ref(v["A"]), atol=1e-12)


def test_positive_only_functions_and_params():
    _, v, out = run("""
name: t
params: {N: 7, eps: 0.5, lo: -0.2, hi: 0.3}
ranks: {n: N}
einsums:
  - P[n] = A[n] * A[n] + eps
  - Y[n] = log(P[n]) + sqrt(P[n]) * rsqrt(P[n]) + clamp(A[n], lo, hi)
""")
    p = v["A"] ** 2 + 0.5
    np.testing.assert_allclose(out["Y"], np.log(p) + 1 + np.clip(v["A"], -0.2, 0.3), atol=1e-12)


def test_affine_halo_reads_zero_outside():
    _, v, out = run("""
name: t
params: {L: 9, K: 4}
ranks: {l: L, k: K}
tensors:
  X: {shape: [L]}
einsums:
  - Y[l] = W[k] * X[l+k-K+1]
""")
    x, w = v["X"], v["W"]
    expected = [sum(w[k] * x[i + k - 3] for k in range(4) if i + k - 3 >= 0) for i in range(9)]
    np.testing.assert_allclose(out["Y"], expected, atol=1e-12)


def test_rank_split_and_merge_with_padding():
    # l -> (c, q): 10 tokens in chunks of 4 -> 3 chunks, the last padded with zeros
    _, v, out = run("""
name: t
params: {L: 10, Q: 4}
derived: {C: ceil(L/Q)}
ranks: {l: L, c: C, q: Q}
tensors:
  X: {shape: [L]}
einsums:
  - XC[c,q] = X[c*Q+q] * 1
  - Y[l] = XC[l//Q, l%Q] * 2
""")
    padded = np.zeros(12)
    padded[:10] = v["X"]
    np.testing.assert_allclose(out["XC"], padded.reshape(3, 4), atol=0)
    np.testing.assert_allclose(out["Y"], 2 * v["X"], atol=0)


def test_mask_protects_against_overflow():
    # exp of a large positive number outside the mask must not leak inf or nan
    _, v, out = run("""
name: t
params: {Q: 5}
ranks: {q: Q, s: Q}
einsums:
  - M[q,s] = exp(A[q] - A[s]) where s <= q
""", A=np.array([0.0, -400.0, -800.0, -1200.0, -1600.0]))
    a = np.array([0.0, -400.0, -800.0, -1200.0, -1600.0])
    with np.errstate(over="ignore"):
        expected = np.where(np.arange(5)[None, :] <= np.arange(5)[:, None], np.exp(a[:, None] - a[None, :]), 0)
    assert np.isfinite(out["M"]).all()
    np.testing.assert_allclose(out["M"], expected)


def test_recurrence_with_named_initial_state():
    _, v, out = run("""
name: t
params: {L: 6, D: 3}
ranks: {l: L, d: D}
tensors:
  H: {init: H0}
einsums:
  - H[l,d] = A[l,d] * H[l-1,d] + X[l,d]
  - P[l,d] = H[l-1,d] * 1
""")
    h = v["H0"].copy()
    states = []
    for t in range(6):
        h = v["A"][t] * h + v["X"][t]
        states.append(h)
    np.testing.assert_allclose(out["H"], np.array(states), atol=1e-12)
    # another Einsum reading H one step back sees the initial state at step 0
    np.testing.assert_allclose(out["P"][0], v["H0"], atol=0)
    np.testing.assert_allclose(out["P"][1:], np.array(states)[:-1], atol=0)


def test_missing_initial_state_is_zero():
    cascade = parse_cascade_text("""
name: t
params: {L: 4}
ranks: {l: L}
tensors:
  H: {init: H0}
einsums:
  - H[l] = H[l-1] + X[l]
""")
    x = np.arange(4.0)
    out = run_reference(cascade, {"X": x})
    np.testing.assert_allclose(out["H"], np.cumsum(x))


def test_float32_mode_computes_in_float32():
    cascade, v, out64 = run("""
name: t
params: {M: 4, K: 3}
ranks: {m: M, k: K}
einsums:
  - Y[m] = A[m,k] * B[k]
""")
    out32 = run_reference(cascade, v, dtype="float32")
    assert out32["Y"].dtype == np.float32
    np.testing.assert_allclose(out32["Y"], out64["Y"], rtol=1e-5)


def test_wrong_input_shape_is_a_clear_error():
    from mambalaya.errors import MambalayaError

    cascade = parse_cascade_text("name: t\nparams: {M: 4}\nranks: {m: M}\neinsums:\n  - Y[m] = A[m] * 2\n")
    with pytest.raises(MambalayaError, match=r"A has shape \(5,\), the cascade expects \(4,\)"):
        run_reference(cascade, {"A": np.zeros(5)})


def test_shipped_attention_is_causal_softmax_attention():
    from mambalaya.parse import open_cascade

    cascade = open_cascade("attention", params={"seqlen": 9, "headdim": 8, "heads": 2, "batch": 2})
    v = random_inputs(cascade, 4)
    out = run_reference(cascade, v)
    q, k, val = v["Q"], v["K"], v["V"]
    scores = np.einsum("bhme,bhpe->bhmp", q, k) / np.sqrt(8)
    scores = np.where(np.tril(np.ones((9, 9), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    np.testing.assert_allclose(out["O"], probs @ val, atol=1e-12)


def test_shipped_mlp():
    from mambalaya.parse import open_cascade

    cascade = open_cascade("mlp2")
    v = random_inputs(cascade, 5)
    t = v["A"] @ v["W1"]
    np.testing.assert_allclose(run_reference(cascade, v)["Y"], (t / (1 + np.exp(-t))) @ v["W2"], atol=1e-10)
