"""The shipped Mamba cascades against transformers' pure-PyTorch mixers.

Each case builds a random-initialised ``MambaMixer`` / ``Mamba2Mixer`` from a
config (no download), saves it as a real checkpoint (config.json plus
safetensors), runs the cascade on it through the real-weights path, and
compares with the PyTorch forward. The initialisation makes the SSM term
dominate the D skip so a wrong scan cannot hide behind it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

hf = pytest.importorskip("hf_reference")

from mambalaya.exec.realweights import run_layer  # noqa: E402

TOL = 1e-4

MAMBA1_CASES = [
    # d_model, d_state, batch, seqlen
    (16, 16, 1, 1),
    (16, 16, 2, 37),
    (32, 16, 1, 64),
    (24, 16, 3, 5),
]

MAMBA2_CASES = [
    # d_model, d_state, headdim, ngroups, chunk, batch, seqlen, dt_limit
    (32, 64, 16, 1, 16, 2, 37, (0.0, math.inf)),
    (32, 128, 8, 2, 32, 1, 70, (0.0, math.inf)),
    (64, 64, 32, 2, 64, 1, 100, (0.0, math.inf)),
    (32, 64, 16, 2, 16, 2, 33, (0.001, 0.05)),  # dt clamp active
    (16, 64, 8, 2, 16, 1, 16, (0.0, math.inf)),  # seqlen = chunk exactly
]


def _rng_input(batch: int, seqlen: int, d_model: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, seqlen, d_model)).astype(np.float32)


@pytest.mark.parametrize("d_model,d_state,batch,seqlen", MAMBA1_CASES)
def test_mamba1_matches_transformers(tmp_path, d_model, d_state, batch, seqlen):
    mixer = hf.make_mamba1(d_model=d_model, d_state=d_state, seed=seqlen)
    config, weights = hf.save_mixer(mixer, None, tmp_path)
    x = _rng_input(batch, seqlen, d_model)
    expected = hf.mixer_forward(mixer, x)
    if seqlen > 4:
        assert hf.ssm_vs_skip(mixer, x)["ratio"] > 5
    got = run_layer(config, weights, x)
    assert got.dtype == np.float32
    assert np.abs(got - expected).max() <= TOL
    got64 = run_layer(config, weights, x, dtype="float64")
    assert np.abs(got64 - expected).max() <= TOL


@pytest.mark.parametrize("d_model,d_state,headdim,ngroups,chunk,batch,seqlen,dt_limit", MAMBA2_CASES)
def test_mamba2_matches_transformers(tmp_path, d_model, d_state, headdim, ngroups, chunk, batch, seqlen, dt_limit):
    mixer = hf.make_mamba2(d_model=d_model, d_state=d_state, headdim=headdim, ngroups=ngroups, chunk=chunk,
                           dt_limit=dt_limit, seed=seqlen)
    config, weights = hf.save_mixer(mixer, None, tmp_path)
    x = _rng_input(batch, seqlen, d_model)
    expected = hf.mixer_forward(mixer, x)
    assert hf.ssm_vs_skip(mixer, x)["ratio"] > 5
    got = run_layer(config, weights, x)
    assert np.abs(got - expected).max() <= TOL


def test_whole_model_file_picks_the_layer(tmp_path):
    mixers = [hf.make_mamba2(d_model=16, d_state=64, headdim=8, ngroups=2, chunk=16, seed=s, num_layers=3,
                             layer_idx=s) for s in range(3)]
    config, weights = hf.save_model(mixers, None, tmp_path)
    x = _rng_input(1, 20, 16)
    for layer in (0, 2):
        got = run_layer(config, weights, x, layer=layer)
        assert np.abs(got - hf.mixer_forward(mixers[layer], x)).max() <= TOL


def test_bf16_checkpoint_runs(tmp_path):
    import torch

    mixer = hf.make_mamba1(d_model=16, seed=3)
    config, weights = hf.save_mixer(mixer, None, tmp_path, dtype=torch.bfloat16)
    x = _rng_input(1, 9, 16)
    got = run_layer(config, weights, x)
    # the weights were rounded to bf16, so compare with a mixer holding the same rounded weights
    with torch.no_grad():
        for p in mixer.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    assert np.abs(got - hf.mixer_forward(mixer, x)).max() <= TOL
