"""Run a Mamba cascade on a real checkpoint: config and weights in, hidden states out.

The shipped Mamba cascades name each weight's checkpoint tensor (``source:``),
so binding is a lookup plus dropping singleton axes (``conv1d.weight`` is
``[C, 1, K]`` in the checkpoint, ``[C, K]`` in the cascade).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mambalaya.arch import Arch, load_arch
from mambalaya.checkpoint import config_family, config_params, load_hf_config, load_mixer_weights
from mambalaya.errors import WeightsError
from mambalaya.exec.reference import check_memory, run_reference
from mambalaya.ir.cascade import Cascade
from mambalaya.parse import open_cascade

#: The prefill cascade that runs each checkpoint family.
PREFILL = {"mamba1": "mamba1", "mamba2": "mamba2"}


def bind_weights(cascade: Cascade, weights: dict[str, np.ndarray], file: str | None = None) -> dict[str, np.ndarray]:
    """The cascade's weight tensors, taken from checkpoint tensors by their ``source`` names."""
    bound: dict[str, np.ndarray] = {}
    for name, spec in cascade.tensors.items():
        if spec.source is None:
            continue
        if spec.source not in weights:
            raise WeightsError(f"the checkpoint has no tensor '{spec.source}' (needed for {name}); it has: "
                               f"{', '.join(sorted(weights))}", file=file)
        arr = np.asarray(weights[spec.source])
        want = cascade.shape(name)
        if arr.shape != want:
            squeezed = arr.reshape([s for s in arr.shape if s != 1]) if arr.size == np.prod(want) else arr
            if squeezed.size != np.prod(want) or tuple(s for s in want if s != 1) != squeezed.shape:
                raise WeightsError(f"checkpoint tensor '{spec.source}' has shape {arr.shape} but the cascade's "
                                   f"{name} needs {want}: does the config match the weights?", file=file)
            arr = squeezed.reshape(want)
        bound[name] = arr
    return bound


def layer_cascade(config: dict, batch: int, seqlen: int, cascade: str | Path | None = None) -> Cascade:
    """The prefill cascade for a checkpoint's config, sized for an input of (batch, seqlen)."""
    family = config_family(config)
    c = open_cascade(cascade or PREFILL[family])
    params = {k: v for k, v in config_params(config).items() if k in c.params}
    params.update({k: v for k, v in {"batch": batch, "seqlen": seqlen}.items() if k in c.params})
    c = c.with_params(**params)
    inner = config_params(config).get("d_inner")
    if inner is not None and "D" in c.values and c.values["D"] != inner:
        raise WeightsError(f"config's intermediate size {inner} is not expand*d_model = {c.values['D']}")
    return c


def run_layer(
    config_path: str | Path,
    weights_path: str | Path,
    hidden_states: np.ndarray,
    layer: int | None = None,
    cascade: str | Path | None = None,
    dtype: str = "float32",
    arch: str | Arch | None = None,
    backend: str = "numba",
    matmul_precision: str = "fp32",
    notes: list[str] | None = None,
) -> np.ndarray:
    """The mixer's output for ``hidden_states`` of shape (batch, seqlen, d_model).

    With ``arch``, the fused schedule the mapper picks for that architecture runs (the Numba
    executor, residency decided by the arch's fusion buffer) instead of the reference interpreter.
    ``backend="triton"`` runs that schedule as generated Triton kernels (one per fusion group; on a
    GPU, or under Triton's interpreter), for ``arch`` or, by default, ``h200``, with ``matmul_precision``
    (fp32, tf32 or bf16) in its tl.dot products; a group Triton cannot express runs on the labelled
    reference fallback, and ``notes`` (when given) receives one line per such group.
    """
    config = load_hf_config(config_path)
    x = np.asarray(hidden_states)
    if x.ndim != 3:
        raise WeightsError(f"input hidden states must be (batch, seqlen, d_model), got shape {x.shape}")
    c = layer_cascade(config, x.shape[0], x.shape[1], cascade)
    if x.shape[2] != c.rank_size("e"):
        raise WeightsError(f"input has d_model {x.shape[2]} but the config says {c.rank_size('e')}")
    check_memory(c, dtype, reference=False)
    weights = load_mixer_weights(weights_path, layer, family=config_family(config))
    inputs = bind_weights(c, weights, str(weights_path))
    inputs["U"] = x
    if backend == "numba" and arch is None:
        out = run_reference(c, inputs, dtype=dtype, keep="outputs")
    else:
        from mambalaya.exec.backend import execute
        from mambalaya.mapper import optimal_mapping
        from mambalaya.schedule import lower_mapping

        arch_obj = arch if isinstance(arch, Arch) else load_arch(arch or ("h200" if backend == "triton" else "mambalaya"))
        schedule = lower_mapping(c, optimal_mapping(c, arch_obj).mapping, arch_obj)
        options = {"matmul_precision": matmul_precision} if backend == "triton" else {}
        res = execute(c, schedule, inputs, backend, dtype, **options)
        if notes is not None:
            notes.extend(f"group {i} ran on the reference fallback: {why}" for i, why in res.fallbacks)
        out = res.outputs
    return out["OUT"].astype(x.dtype if x.dtype.kind == "f" else np.float32)
