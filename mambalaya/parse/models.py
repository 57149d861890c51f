"""Published Mamba model sizes, as cascade params (``--model mamba2-370m``).

From the released checkpoints' configs (state-spaces/mamba-* and
state-spaces/mamba2-*), cross-checked with ``transformers``' MambaConfig and
Mamba2Config. Layer counts and the vocabulary are kept for whole-model
studies (``layers``; the ``lm-head`` cascade's ``vocab``): 50277 tokens, padded
in the checkpoints to a multiple of 8 (Mamba-1: 50280) or 16 (Mamba-2: 50288).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mambalaya.errors import CascadeError


@dataclass(frozen=True)
class ModelSize:
    name: str
    family: str  # "mamba1" or "mamba2": the cascades it instantiates
    layers: int
    params: dict[str, int | float]


def _mamba1(name: str, d_model: int, layers: int) -> ModelSize:
    return ModelSize(name, "mamba1", layers, {
        "d_model": d_model, "expand": 2, "d_state": 16, "d_conv": 4, "dt_rank": math.ceil(d_model / 16),
        "vocab": 50280,
    })


def _mamba2(name: str, d_model: int, layers: int) -> ModelSize:
    return ModelSize(name, "mamba2", layers, {
        "d_model": d_model, "expand": 2, "d_state": 128, "d_conv": 4, "headdim": 64, "ngroups": 1,
        "chunk": 256, "eps": 1e-5, "vocab": 50288,
    })


MODELS: dict[str, ModelSize] = {
    m.name: m
    for m in (
        _mamba1("mamba-130m", 768, 24),
        _mamba1("mamba-370m", 1024, 48),
        _mamba1("mamba-790m", 1536, 48),
        _mamba1("mamba-1.4b", 2048, 48),
        _mamba1("mamba-2.8b", 2560, 64),
        _mamba2("mamba2-130m", 768, 24),
        _mamba2("mamba2-370m", 1024, 48),
        _mamba2("mamba2-780m", 1536, 48),
        _mamba2("mamba2-1.3b", 2048, 48),
        _mamba2("mamba2-2.7b", 2560, 64),
    )
}


def model_params(model: str, cascade_family: str | None, cascade_params: set[str]) -> dict[str, int | float]:
    """The params a published model sets on a cascade of the given family."""
    if model not in MODELS:
        raise CascadeError(f"unknown model '{model}' (known: {', '.join(MODELS)})")
    size = MODELS[model]
    if cascade_family is not None and cascade_family != size.family:
        want = "mamba-*" if cascade_family == "mamba1" else "mamba2-*"
        raise CascadeError(f"model {model} is a {size.family} model but the cascade is {cascade_family}: "
                           f"use a {want} model")
    return {k: v for k, v in size.params.items() if k in cascade_params}
