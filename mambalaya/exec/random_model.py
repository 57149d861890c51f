"""A random-initialised model of a published size, in transformers' checkpoint layout.

So a study (``run``, ``generate``, ``predict_generation``, the README's example) can start without
downloading a checkpoint: ``config.json`` with MambaConfig / Mamba2Config fields and ``model.safetensors``
with transformers' tensor names, initialised as Mamba's reference code does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save

from mambalaya.checkpoint import config_params, expected_shapes, model_config
from mambalaya.errors import WeightsError, did_you_mean
from mambalaya.fileio import write_atomic
from mambalaya.parse.models import MODELS


def random_model_config(model: str, layers: int | None = None, **fields: Any) -> dict[str, Any]:
    """A transformers ``config.json`` (MambaConfig / Mamba2Config fields) of a published size.

    ``layers`` overrides the published depth; ``fields`` any config field (``vocab_size=1024``).
    """
    if model not in MODELS:
        raise WeightsError(f"unknown model {model!r}{did_you_mean(model, MODELS)} (known: {', '.join(MODELS)})")
    size = MODELS[model]
    p = size.params
    d_model = int(p["d_model"])
    common = {
        "hidden_size": d_model, "state_size": int(p["d_state"]), "conv_kernel": int(p["d_conv"]),
        "expand": int(p["expand"]), "num_hidden_layers": size.layers if layers is None else layers,
        "vocab_size": int(p["vocab"]), "layer_norm_epsilon": 1e-5, "use_bias": False, "use_conv_bias": True,
        "tie_word_embeddings": True, "rms_norm": True, "residual_in_fp32": True,
        "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
    }
    if size.family == "mamba1":
        cfg = {"model_type": "mamba", "architectures": ["MambaForCausalLM"], **common,
               "intermediate_size": int(p["expand"]) * d_model, "time_step_rank": int(p["dt_rank"])}
    else:
        headdim = int(p["headdim"])
        cfg = {"model_type": "mamba2", "architectures": ["Mamba2ForCausalLM"], **common,
               "num_heads": int(p["expand"]) * d_model // headdim, "head_dim": headdim,
               "n_groups": int(p["ngroups"]), "chunk_size": int(p["chunk"]), "norm_before_gate": False}
    cfg.update(fields)
    config_params(cfg)  # refuse an inconsistent override here, not at load time
    return cfg


def random_model_weights(cfg: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Whole-model tensors under transformers' names, initialised as Mamba's reference code does.

    Projections N(0, 0.02); ``dt`` log-uniform in [1e-3, 0.1] through the inverse softplus; ``A`` from
    1..d_state (Mamba-1) or uniform in [1, 16] (Mamba-2); D and the norms ones.
    """
    rng = np.random.default_rng(seed)
    mc = model_config(cfg)
    p = config_params(cfg)
    shapes = expected_shapes(cfg)

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def dt_inv_softplus(n: int) -> np.ndarray:
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(0.1), n))
        return (dt + np.log(-np.expm1(-dt))).astype(np.float32)

    out = {"backbone.embeddings.weight": normal((mc.vocab, mc.d_model), 0.02),
           "backbone.norm_f.weight": np.ones(mc.d_model, np.float32)}
    if not mc.tied:
        out["lm_head.weight"] = normal((mc.vocab, mc.d_model), 0.02)
    k, n = int(p["d_conv"]), int(p["d_state"])
    for layer in range(mc.layers):
        pre = f"backbone.layers.{layer}."
        out[pre + "norm.weight"] = np.ones(mc.d_model, np.float32)
        mixer = {
            "in_proj.weight": normal(shapes["in_proj.weight"], 0.02),
            "conv1d.weight": rng.uniform(-1, 1, shapes["conv1d.weight"]).astype(np.float32) / np.sqrt(k),
            "conv1d.bias": normal(shapes["conv1d.bias"], 0.02),
            "D": np.ones(shapes["D"], np.float32),
            "out_proj.weight": normal(shapes["out_proj.weight"], 0.02 / np.sqrt(mc.layers)),
        }
        if mc.family == "mamba1":
            d_inner, r = int(p["d_inner"]), int(p["dt_rank"])
            mixer |= {
                "x_proj.weight": normal(shapes["x_proj.weight"], 0.02),
                "dt_proj.weight": rng.uniform(-1, 1, (d_inner, r)).astype(np.float32) / np.sqrt(r),
                "dt_proj.bias": dt_inv_softplus(d_inner),
                "A_log": np.log(np.tile(np.arange(1, n + 1, dtype=np.float32), (d_inner, 1))),
            }
        else:
            h = int(p["nheads"])
            mixer |= {"dt_bias": dt_inv_softplus(h),
                      "A_log": np.log(rng.uniform(1, 16, h)).astype(np.float32),
                      "norm.weight": np.ones(shapes["norm.weight"], np.float32)}
        out |= {pre + "mixer." + name: arr for name, arr in mixer.items()}
    return out


def write_random_model(folder: str | Path, model: str = "mamba2-130m", layers: int | None = None,
                       seed: int = 0, **fields: Any) -> tuple[Path, Path]:
    """Write ``config.json`` and ``model.safetensors`` of a random-initialised model into ``folder``.

    The layout transformers' ``from_pretrained`` and ``mambalaya run`` / ``generate`` read, so a
    study can start without downloading a checkpoint. Returns the two paths.
    """
    cfg = random_model_config(model, layers, **fields)
    weights = random_model_weights(cfg, seed)
    out = Path(folder)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise WeightsError(f"cannot make the folder {out}: {err.strerror or err}; choose another") from None
    config_path, weights_path = out / "config.json", out / "model.safetensors"
    write_atomic(weights_path, save(weights, metadata={"format": "pt"}))
    write_atomic(config_path, json.dumps(cfg, indent=2) + "\n")
    return config_path, weights_path


__all__ = ["random_model_config", "random_model_weights", "write_random_model"]
