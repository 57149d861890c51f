"""Checks of the transformers reference harness itself (tests/hf_reference.py).

If these fail, every numerical check against the reference is suspect: the harness
must run the pure-PyTorch path, its decode must reproduce its prefill, and its
random layers must make the SSM term dominate the D skip.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

try:
    from tests import hf_reference as H
except ImportError:  # tests/ is not a package: pytest puts tests/ itself on sys.path
    import hf_reference as H

from transformers.models.mamba import modeling_mamba
from transformers.models.mamba2 import modeling_mamba2

BUILDERS = {
    "m1": lambda: H.make_mamba1(d_model=16, d_state=8, seed=3),
    "m1-rank": lambda: H.make_mamba1(d_model=12, d_state=4, d_conv=3, expand=3, dt_rank=5, seed=4),
    "m2": lambda: H.make_mamba2(d_model=16, d_state=8, headdim=8, ngroups=2, chunk=4, seed=5),
    "m2-g1-odd": lambda: H.make_mamba2(
        d_model=16, d_state=6, headdim=4, ngroups=1, chunk=3, d_conv=2, seed=6
    ),
    "m2-g4": lambda: H.make_mamba2(d_model=16, d_state=4, headdim=4, ngroups=4, chunk=5, seed=7),
}


def _x(batch: int = 2, seqlen: int = 11, d_model: int = 16, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, seqlen, d_model)).astype(np.float32)


def test_torch_path_everywhere() -> None:
    report = H.torch_path_report()
    assert len(report) == 10 and all(report.values()), report


@pytest.mark.parametrize("name", list(BUILDERS))
def test_forward_calls_torch_functions(name: str) -> None:
    """The functions the forward actually calls are the torch references we inspected."""
    mixer = BUILDERS[name]()
    module, scan = (
        (modeling_mamba2, "mamba2_chunk_scan")
        if name.startswith("m2")
        else (modeling_mamba, "mamba_selective_scan")
    )
    calls: list[dict] = []
    conv_calls: list[dict] = []
    with H._spy(module, scan, calls), H._spy(module, "causal_conv1d_fn", conv_calls):
        y = H._forward_unchecked(mixer, _x(d_model=mixer.hidden_size))
    assert len(calls) == 1 and len(conv_calls) == 1
    assert y.shape == (2, 11, mixer.hidden_size) and np.isfinite(y).all()
    assert 0.05 < float(np.sqrt((y**2).mean())) < 20  # O(1) activations, not vanishing or exploding


@pytest.mark.parametrize("first_token", ["prefill", "step"])
@pytest.mark.parametrize("name", list(BUILDERS))
def test_decode_matches_prefill(name: str, first_token: str) -> None:
    mixer = BUILDERS[name]()
    x = _x(d_model=mixer.hidden_size)
    y = H.mixer_forward(mixer, x)
    y_dec, conv_state, ssm_state = H.mixer_decode(mixer, x, first_token=first_token)
    np.testing.assert_allclose(y_dec, y, rtol=0, atol=1e-4 * max(1.0, np.abs(y).max()))
    conv0, ssm0 = H.zero_states(mixer, 2)
    assert conv_state.shape == conv0.shape and ssm_state.shape == ssm0.shape


@pytest.mark.parametrize("name", ["m1", "m2"])
def test_decode_uses_single_token_branch(name: str) -> None:
    mixer = BUILDERS[name]()
    module, fn = (
        (modeling_mamba2, "mamba2_selective_state_update")
        if name == "m2"
        else (modeling_mamba, "mamba_selective_state_update")
    )
    for first_token, expected in (("prefill", 6), ("step", 7)):
        calls: list[dict] = []
        with H._spy(module, fn, calls):
            H.mixer_decode(mixer, _x(seqlen=7), first_token=first_token)
        assert len(calls) == expected, first_token


@pytest.mark.parametrize("name", ["m1", "m2-g1-odd"])
def test_state_layout_and_step(name: str) -> None:
    """conv_state holds the last d_conv pre-conv inputs oldest first; mixer_step continues a decode."""
    mixer = BUILDERS[name]()
    x = _x(seqlen=9, d_model=mixer.hidden_size)
    y, _, _, convs, ssms = H.mixer_decode(mixer, x, history=True)
    k = mixer.conv_kernel_size
    with torch.no_grad():
        proj = mixer.in_proj(torch.from_numpy(x)).numpy()
    d_inner = mixer.intermediate_size
    pre_conv = proj[..., d_inner : d_inner + mixer.conv_dim] if name.startswith("m2") else proj[..., :d_inner]
    np.testing.assert_allclose(convs[-1], pre_conv[:, -k:].transpose(0, 2, 1), atol=1e-6)
    np.testing.assert_allclose(convs[0][..., :-1], 0.0)  # token 0: zeros before the start
    t = 5
    y_t, conv_t, ssm_t = H.mixer_step(mixer, x[:, t], convs[t - 1], ssms[t - 1])
    np.testing.assert_allclose(y_t, y[:, t], atol=1e-5)
    np.testing.assert_allclose(conv_t, convs[t], atol=1e-6)
    np.testing.assert_allclose(ssm_t, ssms[t], atol=1e-5)


@pytest.mark.parametrize("name", ["m1", "m2"])
def test_decode_final_state_matches_prefill_state(name: str) -> None:
    mixer = BUILDERS[name]()
    x = _x(seqlen=10)
    _, conv_state, ssm_state = H.mixer_decode(mixer, x)
    cache = H._new_cache(mixer)
    with torch.no_grad():
        mixer(torch.from_numpy(x), cache=cache)
    layer = cache.layers[mixer.layer_idx]
    np.testing.assert_allclose(ssm_state, layer.recurrent_states[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(conv_state, layer.conv_states[0].numpy(), atol=1e-6)


def test_dt_clamp_applies_in_prefill_not_in_decode_step() -> None:
    """Mamba-2's time_step_limit clamps dt in the chunked prefill only (transformers 5.24)."""
    kwargs = {"d_model": 16, "d_state": 8, "headdim": 8, "ngroups": 2, "chunk": 4, "seed": 5}
    free, clamped = H.make_mamba2(**kwargs), H.make_mamba2(dt_limit=(0.0, 0.03), **kwargs)
    x = _x()
    y_free, y_clamped = H.mixer_forward(free, x), H.mixer_forward(clamped, x)
    assert np.abs(y_free - y_clamped).max() > 1e-2  # the clamp bites in prefill
    y_step, _, _ = H.mixer_decode(clamped, x, first_token="step")
    np.testing.assert_allclose(y_step, y_free, atol=1e-4)  # and is ignored by the decode step


@pytest.mark.parametrize("name", list(BUILDERS))
def test_ssm_term_dominates_skip(name: str) -> None:
    mixer = BUILDERS[name]()
    stats = H.ssm_vs_skip(mixer, _x(seqlen=16, d_model=mixer.hidden_size))
    assert stats["ratio"] > 5, stats
    assert stats["ssm_rms"] > 0.05, stats


def test_save_round_trip_runs_same(tmp_path: Path) -> None:
    """Weights written by save_mixer load back into a fresh mixer that computes the same output."""
    from safetensors.torch import load_file

    mixer = BUILDERS["m2"]()
    _, w_path = H.save_mixer(mixer, None, tmp_path)
    fresh = H.make_mamba2(d_model=16, d_state=8, headdim=8, ngroups=2, chunk=4, seed=99)
    fresh.load_state_dict(load_file(str(w_path)))
    x = _x()
    np.testing.assert_array_equal(H.mixer_forward(fresh, x), H.mixer_forward(mixer, x))
