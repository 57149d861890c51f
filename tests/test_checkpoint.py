"""Tests for mambalaya.checkpoint: configs -> cascade params, checkpoint files -> mixer arrays."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import Mamba2Config, MambaConfig

from mambalaya.checkpoint import (
    MAMBA1_DEFAULTS,
    MAMBA2_DEFAULTS,
    check_mixer_weights,
    config_family,
    config_params,
    load_hf_config,
    load_mixer_weights,
)
from mambalaya.errors import WeightsError

try:
    from tests import hf_reference as H
except ImportError:  # tests/ is not a package: pytest puts tests/ itself on sys.path
    import hf_reference as H


@pytest.fixture(scope="module")
def m1() -> H.MambaMixer:
    return H.make_mamba1(d_model=16, d_state=8, seed=1)


@pytest.fixture(scope="module")
def m2() -> H.Mamba2Mixer:
    return H.make_mamba2(d_model=16, d_state=8, headdim=8, ngroups=2, chunk=4, seed=2)


def _assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype, k
        np.testing.assert_array_equal(got[k], w, err_msg=k)


def _raises(
    match: str, fn: Callable[..., object], *args: object, file: Path, **kwargs: object
) -> WeightsError:
    with pytest.raises(WeightsError, match=match) as info:
        fn(*args, **kwargs)
    err = info.value
    assert err.file == str(file)
    assert str(err).startswith(str(file))
    return err


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
@pytest.mark.parametrize("which", ["m1", "m2"])
def test_bare_mixer_round_trip(tmp_path: Path, request: pytest.FixtureRequest, which: str, fmt: str) -> None:
    mixer = request.getfixturevalue(which)
    cfg_path, w_path = H.save_mixer(mixer, None, tmp_path, fmt=fmt)
    weights = load_mixer_weights(w_path)
    _assert_same(weights, H.mixer_arrays(mixer))
    cfg = load_hf_config(cfg_path)
    assert config_family(cfg) == ("mamba1" if which == "m1" else "mamba2")
    check_mixer_weights(weights, cfg, file=str(w_path))
    assert (
        load_mixer_weights(w_path, layer=0).keys() == weights.keys()
    )  # --layer 0 on a bare mixer is harmless


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
@pytest.mark.parametrize(
    "prefix", ["backbone.layers.{}.mixer.", "model.layers.{}.mixer.", "layers.{}.mixer."]
)
def test_whole_model_picks_layer(tmp_path: Path, prefix: str, fmt: str) -> None:
    mixers = [H.make_mamba1(d_model=8, d_state=4, seed=s, num_layers=3, layer_idx=s) for s in range(3)]
    extra = {"backbone.embeddings.weight": torch.zeros(10, 8), "backbone.layers.1.norm.weight": torch.ones(8)}
    cfg_path, w_path = H.save_model(mixers, None, tmp_path, prefix=prefix, fmt=fmt, extra=extra)
    for i, mixer in enumerate(mixers):
        _assert_same(load_mixer_weights(w_path, layer=i), H.mixer_arrays(mixer))
    assert load_hf_config(cfg_path)["num_hidden_layers"] == 3


def test_whole_model_mamba2(tmp_path: Path) -> None:
    mixers = [H.make_mamba2(seed=s, num_layers=2, layer_idx=s) for s in range(2)]
    cfg_path, w_path = H.save_model(mixers, None, tmp_path)
    weights = load_mixer_weights(w_path, layer=1, family="mamba2")
    _assert_same(weights, H.mixer_arrays(mixers[1]))
    check_mixer_weights(weights, load_hf_config(cfg_path))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_becomes_float32(tmp_path: Path, m2: H.Mamba2Mixer, dtype: torch.dtype) -> None:
    _, w_path = H.save_mixer(m2, None, tmp_path, dtype=dtype)
    weights = load_mixer_weights(w_path)
    want = {k: v.detach().to(dtype).float().numpy() for k, v in m2.state_dict().items()}
    _assert_same(weights, want)  # bf16 -> f32 is exact, so equality must hold bit for bit


def test_bf16_whole_model(tmp_path: Path) -> None:
    mixers = [H.make_mamba1(d_model=8, d_state=4, seed=s, num_layers=2, layer_idx=s) for s in range(2)]
    _, w_path = H.save_model(mixers, None, tmp_path, dtype=torch.bfloat16)
    got = load_mixer_weights(w_path, layer=1)
    want = {k: v.detach().bfloat16().float().numpy() for k, v in mixers[1].state_dict().items()}
    _assert_same(got, want)


def test_float64_kept(tmp_path: Path, m1: H.MambaMixer) -> None:
    path = tmp_path / "m.npz"
    np.savez(path, **{k: v.astype(np.float64) for k, v in H.mixer_arrays(m1).items()})
    assert all(v.dtype == np.float64 for v in load_mixer_weights(path).values())


# --------------------------------------------------------------------------- weight errors


def test_missing_weights_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.safetensors"
    _raises("not found", load_mixer_weights, path, file=path)


def test_unknown_extension(tmp_path: Path) -> None:
    path = tmp_path / "mixer.pt"
    path.write_bytes(b"x")
    _raises(r"extension '\.pt'.*\.safetensors or \.npz", load_mixer_weights, path, file=path)


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
def test_whole_model_without_layer(tmp_path: Path, fmt: str) -> None:
    mixers = [H.make_mamba1(d_model=8, d_state=4, seed=s, num_layers=3, layer_idx=s) for s in range(3)]
    _, w_path = H.save_model(mixers, None, tmp_path, fmt=fmt)
    _raises(r"3 layers \(0-2\).*--layer", load_mixer_weights, w_path, file=w_path)
    _raises(
        r"layer 7 is not in the file; it has layers 0-2", load_mixer_weights, w_path, layer=7, file=w_path
    )


def test_layer_list_is_compact(tmp_path: Path, m1: H.MambaMixer) -> None:
    arrays = H.mixer_arrays(m1)
    path = tmp_path / "sparse.npz"
    np.savez(path, **{f"backbone.layers.{i}.mixer.{k}": v for i in (0, 1, 2, 5) for k, v in arrays.items()})
    _raises(r"has layers 0-2, 5$", load_mixer_weights, path, layer=3, file=path)


def test_layer_on_bare_mixer(tmp_path: Path, m1: H.MambaMixer) -> None:
    _, w_path = H.save_mixer(m1, None, tmp_path)
    _raises("single mixer.*drop --layer", load_mixer_weights, w_path, layer=2, file=w_path)


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
def test_missing_tensor(tmp_path: Path, m2: H.Mamba2Mixer, fmt: str) -> None:
    arrays = {k: v for k, v in H.mixer_arrays(m2).items() if k not in ("A_log", "norm.weight")}
    path = tmp_path / f"cut.{fmt}"
    if fmt == "npz":
        np.savez(path, **arrays)
    else:
        from safetensors.numpy import save_file

        save_file(arrays, str(path))
    _raises(r"Mamba-2 mixer is missing tensor\(s\) A_log, norm\.weight", load_mixer_weights, path, file=path)
    _raises("Mamba-1 mixer is missing", load_mixer_weights, path, family="mamba1", file=path)


def test_not_a_mamba_file(tmp_path: Path) -> None:
    path = tmp_path / "other.npz"
    np.savez(path, **{"lm_head.weight": np.zeros((2, 2), np.float32)})
    _raises("not a Mamba mixer", load_mixer_weights, path, file=path)


def _valid_safetensors(tmp_path: Path, m1: H.MambaMixer) -> bytes:
    _, w_path = H.save_mixer(m1, None, tmp_path / "ok")
    return w_path.read_bytes()


@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param(lambda b: b[:5], id="shorter-than-length"),
        pytest.param(lambda b: (10**9).to_bytes(8, "little") + b[8:], id="length-too-big"),
        pytest.param(lambda b: b[:8] + b"\xff" * 20 + b[28:], id="garbage-json"),
        pytest.param(lambda b: b[: len(b) // 2], id="truncated-data"),
        pytest.param(lambda b: (2).to_bytes(8, "little") + b"[]", id="not-an-object"),
    ],
)
def test_corrupt_safetensors(tmp_path: Path, m1: H.MambaMixer, corrupt: Callable[[bytes], bytes]) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(corrupt(_valid_safetensors(tmp_path, m1)))
    _raises("corrupt safetensors", load_mixer_weights, path, file=path)


def test_corrupt_npz(tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    path.write_bytes(b"PK\x03\x04 definitely not a zip")
    _raises("cannot read .npz", load_mixer_weights, path, file=path)


def test_shape_mismatch_with_config(tmp_path: Path, m1: H.MambaMixer) -> None:
    cfg_path, w_path = H.save_mixer(m1, None, tmp_path)
    cfg = load_hf_config(cfg_path)
    cfg["state_size"] = 4
    with pytest.raises(WeightsError, match=r"'x_proj.weight' has shape .* config implies") as info:
        check_mixer_weights(load_mixer_weights(w_path), cfg, file=str(w_path))
    assert info.value.file == str(w_path)


def test_mamba2_gated_mlp_part_is_named(tmp_path: Path, m2: H.Mamba2Mixer) -> None:
    cfg_path, _ = H.save_mixer(m2, None, tmp_path)
    weights = H.mixer_arrays(m2)
    weights["in_proj.weight"] = np.zeros((weights["in_proj.weight"].shape[0] + 8, 16), np.float32)
    with pytest.raises(WeightsError, match="d_ssm gated-MLP"):
        check_mixer_weights(weights, load_hf_config(cfg_path))


# --------------------------------------------------------------------------- configs

MAMBA1_SIZES = {  # the published configs: name -> (d_model, layers)
    "mamba-130m": (768, 24),
    "mamba-370m": (1024, 48),
    "mamba-790m": (1536, 48),
    "mamba-1.4b": (2048, 48),
    "mamba-2.8b": (2560, 64),
}
MAMBA2_SIZES = {
    "mamba2-130m": (768, 24),
    "mamba2-370m": (1024, 48),
    "mamba2-780m": (1536, 48),
    "mamba2-1.3b": (2048, 48),
    "mamba2-2.7b": (2560, 64),
}


@pytest.mark.parametrize("name", list(MAMBA1_SIZES))
def test_config_params_mamba1_published(tmp_path: Path, name: str) -> None:
    d_model, layers = MAMBA1_SIZES[name]
    config = MambaConfig(
        hidden_size=d_model, num_hidden_layers=layers, state_size=16, expand=2, conv_kernel=4
    )
    config.to_json_file(tmp_path / "config.json")  # use_diff: default-valued fields are left out
    params = config_params(load_hf_config(tmp_path / "config.json"))
    assert params == {
        "d_model": d_model,
        "d_state": 16,
        "d_conv": 4,
        "expand": 2,
        "dt_rank": math.ceil(d_model / 16),
        "d_inner": 2 * d_model,
    }
    assert params["dt_rank"] == config.time_step_rank and params["d_inner"] == config.intermediate_size


@pytest.mark.parametrize("name", list(MAMBA2_SIZES))
def test_config_params_mamba2_published(tmp_path: Path, name: str) -> None:
    d_model, layers = MAMBA2_SIZES[name]
    config = Mamba2Config(
        hidden_size=d_model,
        num_hidden_layers=layers,
        state_size=128,
        expand=2,
        conv_kernel=4,
        head_dim=64,
        num_heads=2 * d_model // 64,
        n_groups=1,
        chunk_size=256,
    )
    config.to_json_file(tmp_path / "config.json")
    params = config_params(load_hf_config(tmp_path / "config.json"))
    assert params == {
        "d_model": d_model,
        "d_state": 128,
        "d_conv": 4,
        "expand": 2,
        "d_inner": 2 * d_model,
        "nheads": 2 * d_model // 64,
        "headdim": 64,
        "ngroups": 1,
        "chunk": 256,
        "eps": 1e-5,
        "dt_min": 0.0,
        "dt_max": math.inf,
    }
    if name == "mamba2-370m":  # the IMAX study's layer
        assert (params["d_inner"], params["nheads"]) == (2048, 32)


def test_defaults_match_transformers() -> None:
    """The hard-coded defaults must track the installed transformers classes."""
    c1, c2 = MambaConfig(), Mamba2Config()
    for k, v in MAMBA1_DEFAULTS.items():
        assert getattr(c1, k) == (math.ceil(c1.hidden_size / 16) if v == "auto" else v), k
    for k, v in MAMBA2_DEFAULTS.items():
        got = getattr(c2, k)
        assert (tuple(got) if k == "time_step_limit" else got) == v, k
    assert config_params({"model_type": "mamba"})["dt_rank"] == c1.time_step_rank
    p2 = config_params({"model_type": "mamba2"})
    assert (p2["nheads"], p2["headdim"], p2["ngroups"], p2["chunk"]) == (128, 64, 8, 256)


def test_time_step_limit_round_trips_through_json(tmp_path: Path) -> None:
    mixer = H.make_mamba2(dt_limit=(0.001, 0.25))
    cfg_path, _ = H.save_mixer(mixer, None, tmp_path)
    params = config_params(load_hf_config(cfg_path))
    assert (params["dt_min"], params["dt_max"]) == (0.001, 0.25)
    (tmp_path / "inf.json").write_text('{"model_type": "mamba2", "time_step_limit": [0.0, Infinity]}')
    assert config_params(load_hf_config(tmp_path / "inf.json"))["dt_max"] == math.inf


def test_family_from_fields() -> None:
    assert config_family({"hidden_size": 64, "state_size": 16}) == "mamba1"
    assert config_family({"hidden_size": 64, "n_groups": 1, "head_dim": 32}) == "mamba2"
    assert config_family({"model_type": "mamba2", "hidden_size": 64}) == "mamba2"
    with pytest.raises(WeightsError, match="model_type"):
        config_family({"vocab_size": 10})
    with pytest.raises(WeightsError, match="'llama' is not a Mamba model"):
        config_family({"model_type": "llama"})


def test_mamba_ssm_style_config(tmp_path: Path) -> None:
    """state-spaces/* repositories ship mamba_ssm configs, not HF ones."""
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({"d_model": 1024, "n_layer": 48, "vocab_size": 50277, "ssm_cfg": {"layer": "Mamba2"}})
    )
    params = config_params(load_hf_config(path))
    assert (params["d_model"], params["d_state"], params["nheads"], params["headdim"]) == (1024, 128, 32, 64)
    assert (params["ngroups"], params["chunk"], params["eps"]) == (1, 256, 1e-5)
    path.write_text(json.dumps({"d_model": 768, "n_layer": 24, "ssm_cfg": {}}))
    assert config_params(load_hf_config(path))["dt_rank"] == 48


def test_config_errors(tmp_path: Path) -> None:
    missing = tmp_path / "none.json"
    _raises("config file not found", load_hf_config, missing, file=missing)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    _raises("not valid JSON", load_hf_config, bad, file=bad)
    bad.write_text('{"model_type": "mamba2", "hidden_size": 64, "num_heads": 3, "head_dim": 64}')
    _raises("num_heads\\*head_dim", load_hf_config, bad, file=bad)
    bad.write_text('{"model_type": "mamba", "hidden_size": "big"}')
    _raises("'hidden_size' must be an integer", load_hf_config, bad, file=bad)
    bad.write_text('{"model_type": "gpt2"}')
    _raises("not a Mamba model", load_hf_config, bad, file=bad)
