"""The decode cascades: one token at a time, states carried, equal to prefill."""

from __future__ import annotations

import numpy as np
import pytest

hf = pytest.importorskip("hf_reference")

from mambalaya.exec.realweights import bind_weights, layer_cascade  # noqa: E402
from mambalaya.exec.reference import run_reference  # noqa: E402


def _cascades(mixer, batch, seqlen, family):
    cfg = mixer.hf_config.to_dict()
    prefill = layer_cascade(cfg, batch, seqlen)
    decode = layer_cascade(cfg, batch, 1, cascade=f"{family}-decode")
    weights = hf.mixer_arrays(mixer)
    return prefill, decode, bind_weights(prefill, weights), bind_weights(decode, weights)


@pytest.mark.parametrize("family", ["mamba1", "mamba2"])
def test_decode_reproduces_prefill_token_by_token(family):
    batch, seqlen = 2, 11
    if family == "mamba1":
        mixer = hf.make_mamba1(d_model=16, seed=5)
    else:
        mixer = hf.make_mamba2(d_model=16, d_state=32, headdim=8, ngroups=2, chunk=4, seed=5)
    prefill, decode, wp, wd = _cascades(mixer, batch, seqlen, family)
    x = np.random.default_rng(0).standard_normal((batch, seqlen, 16))
    full = run_reference(prefill, {**wp, "U": x})
    conv = np.zeros(decode.shape("CS0"))
    state = np.zeros(decode.shape("H0" if family == "mamba1" else "S0"))
    state_in, state_out = ("H0", "H1") if family == "mamba1" else ("S0", "S1")
    for t in range(seqlen):
        step = run_reference(decode, {**wd, "U": x[:, t : t + 1], "CS0": conv, state_in: state})
        np.testing.assert_allclose(step["OUT"], full["OUT"][:, t], atol=1e-10, rtol=0)
        conv, state = step["CS1"], step[state_out]
    final_state = full["HF"] if family == "mamba1" else full["SF"]
    np.testing.assert_allclose(state, final_state, atol=1e-10, rtol=0)
    np.testing.assert_allclose(conv, full["CSF"], atol=1e-12, rtol=0)


@pytest.mark.parametrize("family", ["mamba1", "mamba2"])
def test_decode_step_matches_transformers_cache_step(family):
    if family == "mamba1":
        mixer = hf.make_mamba1(d_model=16, seed=7)
    else:
        mixer = hf.make_mamba2(d_model=16, d_state=32, headdim=8, ngroups=2, chunk=4, seed=7)
    _, decode, _, wd = _cascades(mixer, 2, 1, family)
    rng = np.random.default_rng(1)
    conv0, ssm0 = (rng.standard_normal(s.shape).astype(np.float32) for s in hf.zero_states(mixer, 2))
    x = rng.standard_normal((2, 16)).astype(np.float32)
    y, conv1, ssm1 = hf.mixer_step(mixer, x, conv0, ssm0)
    state_in, state_out = ("H0", "H1") if family == "mamba1" else ("S0", "S1")
    got = run_reference(decode, {**wd, "U": x[:, None], "CS0": conv0, state_in: ssm0}, dtype="float32")
    assert np.abs(got["OUT"] - y).max() <= 1e-4
    assert np.abs(got["CS1"] - conv1).max() <= 1e-6
    assert np.abs(got[state_out] - ssm1).max() <= 1e-4


def test_prefill_is_causal():
    """The first half of a prefill does not depend on the second half (Mamba-2, chunk-crossing)."""
    mixer = hf.make_mamba2(d_model=16, d_state=32, headdim=8, ngroups=1, chunk=4, seed=2)
    cfg = mixer.hf_config.to_dict()
    weights = hf.mixer_arrays(mixer)
    x = np.random.default_rng(3).standard_normal((1, 16, 16))
    whole, half = layer_cascade(cfg, 1, 16), layer_cascade(cfg, 1, 6)
    full = run_reference(whole, {**bind_weights(whole, weights), "U": x})
    first = run_reference(half, {**bind_weights(half, weights), "U": x[:, :6]})
    np.testing.assert_allclose(first["OUT"], full["OUT"][:, :6], atol=1e-10)
