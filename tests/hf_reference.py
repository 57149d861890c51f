"""Reference Mamba mixers from Hugging Face transformers, for tests (no download, CPU, float32).

The cascades must match ``MambaMixer`` / ``Mamba2Mixer`` run on their pure-PyTorch paths.
This module builds small random layers whose SSM term dominates the D skip (so a
wrong scan cannot hide behind ``D * x``), runs them for prefill and token-by-token
decode, and writes them as checkpoints in the layouts ``mambalaya run`` accepts.

Facts of transformers 5.24 this relies on: the kernel choice is made at import time by
``use_kernel_func_from_hub_with_fallback`` (hub ``kernels`` if installed, else the
``mamba_ssm`` / ``causal_conv1d`` packages if importable, else the torch function);
:func:`torch_path_report` reads that choice back from each wrapper's closure. Decode
state lives in a ``DynamicCache(config=...)`` whose ``LinearAttentionLayer`` holds
``conv_states`` (batch, channels, d_conv) and ``recurrent_states``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import DynamicCache, Mamba2Config, Mamba2ForCausalLM, MambaConfig, MambaForCausalLM
from transformers.models.mamba import modeling_mamba
from transformers.models.mamba2 import modeling_mamba2

MambaMixer = modeling_mamba.MambaMixer
Mamba2Mixer = modeling_mamba2.Mamba2Mixer
Mixer = MambaMixer | Mamba2Mixer

# Functions that transformers may route to a CUDA kernel; all must be the torch fallback here.
_KERNEL_FUNCS: dict[str, tuple[Any, ...]] = {
    "mamba1": (
        modeling_mamba,
        (
            "causal_conv1d_fn",
            "causal_conv1d_update",
            "mamba_inner_fn",
            "mamba_selective_scan",
            "mamba_selective_state_update",
        ),
    ),
    "mamba2": (
        modeling_mamba2,
        (
            "causal_conv1d_fn",
            "causal_conv1d_update",
            "mamba2_split_conv1d_scan_combined",
            "mamba2_chunk_scan",
            "mamba2_selective_state_update",
        ),
    ),
}


# --------------------------------------------------------------------------- torch path


def _closure(fn) -> dict:
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ()), strict=True))


def _see_through_func_module(fn):
    """The plain function inside a ``kernels`` ``Func`` module, or None if a hub kernel replaced it.

    With the ``kernels`` package installed (transformers >= 5.25 pulls it in), each
    wrapped function becomes an ``nn.Module`` whose class-level ``forward`` calls the
    wrapper; ``kernelize`` binds another ``forward`` on the instance.
    """
    if not isinstance(fn, torch.nn.Module):
        return fn
    if "forward" in vars(fn):
        return None
    inner = _closure(type(fn).forward).get("func")
    return inner if callable(inner) else None


def torch_path_report() -> dict[str, bool]:
    """``{"mamba1.causal_conv1d_fn": True, ...}``: True where the torch reference runs.

    Each wrapper made by ``use_kernel_func_from_hub_with_fallback`` closes over
    ``implementation`` and ``is_new_implementation``; the torch path is taken exactly
    when ``is_new_implementation`` is False (and no hub kernel replaced the function).
    """
    report: dict[str, bool] = {}
    for family, (module, names) in _KERNEL_FUNCS.items():
        for name in names:
            fn = getattr(module, name)
            while hasattr(fn, "spied_original"):  # see through a test's _spy wrapper
                fn = fn.spied_original
            fn = _see_through_func_module(fn)
            if fn is None:  # a hub kernel was bound in its place
                report[f"{family}.{name}"] = False
                continue
            cells = _closure(fn)
            is_torch = (
                "is_new_implementation" in cells
                and cells["is_new_implementation"] is False
                and cells["implementation"] is cells["torch_function"]
            )
            report[f"{family}.{name}"] = bool(is_torch)
    return report


def assert_torch_path() -> None:
    """Fail loudly if any optional CUDA / hub kernel would replace the reference torch code."""
    bad = [name for name, ok in torch_path_report().items() if not ok]
    assert not bad, f"transformers would use optimized kernels for {bad}; uninstall mamba_ssm/causal_conv1d"


# --------------------------------------------------------------------------- builders


def _inv_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


def _log_uniform(gen: torch.Generator, n: int, lo: float, hi: float) -> torch.Tensor:
    return torch.exp(torch.rand(n, generator=gen) * (math.log(hi) - math.log(lo)) + math.log(lo))


def _normal(gen: torch.Generator, shape: Sequence[int], std: float) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * std


@torch.no_grad()
def _init_common(mixer: Mixer, gen: torch.Generator, *, d_model: int, d_inner: int, d_conv: int) -> None:
    """Weights that keep activations O(1) for O(1) inputs."""
    mixer.in_proj.weight.copy_(_normal(gen, mixer.in_proj.weight.shape, 1.0 / math.sqrt(d_model)))
    if mixer.in_proj.bias is not None:
        mixer.in_proj.bias.copy_(_normal(gen, mixer.in_proj.bias.shape, 0.1))
    mixer.conv1d.weight.copy_(_normal(gen, mixer.conv1d.weight.shape, 1.0 / math.sqrt(d_conv)))
    if mixer.conv1d.bias is not None:
        mixer.conv1d.bias.copy_(_normal(gen, mixer.conv1d.bias.shape, 0.1))
    mixer.out_proj.weight.copy_(_normal(gen, mixer.out_proj.weight.shape, 1.0 / math.sqrt(d_inner)))
    if mixer.out_proj.bias is not None:
        mixer.out_proj.bias.copy_(_normal(gen, mixer.out_proj.bias.shape, 0.1))


def make_mamba1(
    d_model: int = 16,
    d_state: int = 16,
    d_conv: int = 4,
    expand: int = 2,
    dt_rank: int | None = None,
    seed: int = 0,
    *,
    use_bias: bool = False,
    use_conv_bias: bool = True,
    num_layers: int = 1,
    layer_idx: int = 0,
) -> MambaMixer:
    """A random ``MambaMixer`` (eval mode, float32) whose scan dominates the D skip.

    dt lies around 0.01..0.5 (bias = softplus^-1 of a log-uniform draw), A = -exp(A_log)
    in [-4, -0.5] so decays exp(dt*A) are neither ~1 nor ~0, and D in [0.01, 0.05].
    The HF config is attached as ``mixer.hf_config``.
    """
    config = MambaConfig(
        hidden_size=d_model,
        state_size=d_state,
        conv_kernel=d_conv,
        expand=expand,
        time_step_rank="auto" if dt_rank is None else dt_rank,
        num_hidden_layers=num_layers,
        use_bias=use_bias,
        use_conv_bias=use_conv_bias,
    )
    gen = torch.Generator().manual_seed(seed)
    mixer = MambaMixer(config, layer_idx=layer_idx).to(torch.float32).eval()
    d_inner, rank = config.intermediate_size, int(config.time_step_rank)
    _init_common(mixer, gen, d_model=d_model, d_inner=d_inner, d_conv=d_conv)
    with torch.no_grad():
        mixer.x_proj.weight.copy_(_normal(gen, mixer.x_proj.weight.shape, 1.0 / math.sqrt(d_inner)))
        mixer.x_proj.weight[rank:] *= 2.0  # rows [dt_low | B | C]: larger B, C so the scan term is O(1)
        mixer.dt_proj.weight.copy_(_normal(gen, mixer.dt_proj.weight.shape, 0.5 / math.sqrt(rank)))
        mixer.dt_proj.bias.copy_(_inv_softplus(_log_uniform(gen, d_inner, 0.01, 0.5)))
        a = 0.5 + 3.5 * torch.rand(d_inner, d_state, generator=gen)
        mixer.A_log.copy_(torch.log(a))
        mixer.D.copy_(0.01 + 0.04 * torch.rand(d_inner, generator=gen))
    mixer.hf_config = config
    return mixer


def make_mamba2(
    d_model: int = 16,
    d_state: int = 8,
    d_conv: int = 4,
    expand: int = 2,
    headdim: int = 8,
    ngroups: int = 2,
    chunk: int = 4,
    eps: float = 1e-5,
    dt_limit: tuple[float, float] = (0.0, math.inf),
    seed: int = 0,
    *,
    use_bias: bool = False,
    use_conv_bias: bool = True,
    num_layers: int = 1,
    layer_idx: int = 0,
) -> Mamba2Mixer:
    """A random ``Mamba2Mixer`` (eval mode, float32) whose scan dominates the D skip.

    dt = softplus(dt_raw + dt_bias) around 0.01..0.5, A in [-4, -0.5] per head,
    D in [0.01, 0.05] per head, norm weight in [0.5, 1.5] (so a missing weight shows).
    The HF config is attached as ``mixer.hf_config`` (Mamba2Mixer keeps none itself).
    """
    d_inner = expand * d_model
    if d_inner % headdim:
        raise ValueError(f"expand*d_model={d_inner} is not a multiple of headdim={headdim}")
    nheads = d_inner // headdim
    config = Mamba2Config(
        hidden_size=d_model,
        state_size=d_state,
        conv_kernel=d_conv,
        expand=expand,
        num_heads=nheads,
        head_dim=headdim,
        n_groups=ngroups,
        chunk_size=chunk,
        layer_norm_epsilon=eps,
        time_step_limit=tuple(dt_limit),
        num_hidden_layers=num_layers,
        use_bias=use_bias,
        use_conv_bias=use_conv_bias,
    )
    gen = torch.Generator().manual_seed(seed)
    mixer = Mamba2Mixer(config, layer_idx=layer_idx).to(torch.float32).eval()
    _init_common(mixer, gen, d_model=d_model, d_inner=d_inner, d_conv=d_conv)
    with torch.no_grad():
        # in_proj rows are [z | x | B | C | dt]: larger B, C (scan term O(1)); smaller dt_raw so that
        # dt = softplus(dt_raw + dt_bias) stays near the 0.01..0.5 that dt_bias sets.
        mixer.in_proj.weight[2 * d_inner : mixer.in_proj.weight.shape[0] - nheads] *= 2.0
        mixer.in_proj.weight[-nheads:] *= 0.25
        mixer.dt_bias.copy_(_inv_softplus(_log_uniform(gen, nheads, 0.01, 0.5)))
        mixer.A_log.copy_(torch.log(0.5 + 3.5 * torch.rand(nheads, generator=gen)))
        mixer.D.copy_(0.01 + 0.04 * torch.rand(nheads, generator=gen))
        mixer.norm.weight.copy_(0.5 + torch.rand(d_inner, generator=gen))
    mixer.hf_config = config
    return mixer


def family_of(mixer: Mixer) -> str:
    """``"mamba1"`` or ``"mamba2"``."""
    return "mamba2" if isinstance(mixer, Mamba2Mixer) else "mamba1"


# --------------------------------------------------------------------------- running


def _as_input(mixer: Mixer, x: np.ndarray) -> torch.Tensor:
    if x.ndim != 3 or x.shape[-1] != mixer.hidden_size:
        raise ValueError(f"input must be (batch, seqlen, {mixer.hidden_size}), got {x.shape}")
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))


def mixer_forward(mixer: Mixer, x: np.ndarray) -> np.ndarray:
    """Prefill output (batch, seqlen, d_model) through the torch reference path, no cache."""
    assert_torch_path()
    return _forward_unchecked(mixer, x)


def _forward_unchecked(mixer: Mixer, x: np.ndarray) -> np.ndarray:
    assert not mixer.training, "call .eval(): in training mode transformers tries the fused kernel first"
    with torch.no_grad():
        return mixer(_as_input(mixer, x)).numpy()


def _new_cache(mixer: Mixer) -> DynamicCache:
    return DynamicCache(config=mixer.hf_config)


def mixer_step(
    mixer: Mixer, x_token: np.ndarray, conv_state: np.ndarray, ssm_state: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One decode step with explicit states in and out: the oracle of a decode cascade.

    ``x_token`` is (batch, d_model) or (batch, 1, d_model); ``conv_state`` is
    (batch, conv channels, d_conv) holding the last d_conv pre-conv inputs, oldest first
    (Mamba-1: channels = d_inner; Mamba-2: the xBC channels d_inner + 2*G*N);
    ``ssm_state`` is (batch, d_inner, N) for Mamba-1 and (batch, H, P, N) for Mamba-2.
    Runs the single-token branch (``causal_conv1d_update`` + ``selective_state_update``).
    """
    assert_torch_path()
    x = np.asarray(x_token, dtype=np.float32)
    x = x[:, None, :] if x.ndim == 2 else x
    cache = _new_cache(mixer)
    idx = mixer.layer_idx
    cache.update_conv_state(torch.tensor(conv_state, dtype=torch.float32), idx)
    cache.update_recurrent_state(torch.tensor(ssm_state, dtype=torch.float32), idx)
    with torch.no_grad():
        y = mixer(_as_input(mixer, x), cache=cache)
    layer = cache.layers[idx]
    return y[:, 0].numpy(), layer.conv_states[0].numpy().copy(), layer.recurrent_states[0].numpy().copy()


def zero_states(mixer: Mixer, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Zero (conv_state, ssm_state) of the shapes :func:`mixer_step` takes."""
    k = mixer.conv_kernel_size
    if isinstance(mixer, Mamba2Mixer):
        conv = np.zeros((batch, mixer.conv_dim, k), np.float32)
        ssm = np.zeros((batch, mixer.num_heads, mixer.head_dim, mixer.ssm_state_size), np.float32)
    else:
        conv = np.zeros((batch, mixer.intermediate_size, k), np.float32)
        ssm = np.zeros((batch, mixer.intermediate_size, mixer.ssm_state_size), np.float32)
    return conv, ssm


def mixer_decode(
    mixer: Mixer, x: np.ndarray, *, first_token: str = "prefill", history: bool = False
) -> tuple[np.ndarray, ...]:
    """Run ``x`` (batch, seqlen, d_model) token by token through a transformers cache.

    Returns ``(outputs (batch, seqlen, d_model), final conv_state, final ssm_state)``;
    with ``history=True`` also the lists of conv and ssm states after each token.
    ``first_token="prefill"`` starts from an empty cache as ``generate`` does (token 0
    takes the prefill branch, which applies Mamba-2's dt clamp); ``"step"`` starts from
    zero states so every token takes the single-token decode branch.
    """
    assert_torch_path()
    if first_token not in ("prefill", "step"):
        raise ValueError("first_token must be 'prefill' or 'step'")
    xt = _as_input(mixer, x)
    idx = mixer.layer_idx
    cache = _new_cache(mixer)
    if first_token == "step":
        conv0, ssm0 = zero_states(mixer, x.shape[0])
        cache.update_conv_state(torch.from_numpy(conv0), idx)
        cache.update_recurrent_state(torch.from_numpy(ssm0), idx)
    outs: list[np.ndarray] = []
    convs: list[np.ndarray] = []
    ssms: list[np.ndarray] = []
    with torch.no_grad():
        for t in range(xt.shape[1]):
            outs.append(mixer(xt[:, t : t + 1], cache=cache)[:, 0].numpy())
            layer = cache.layers[idx]
            convs.append(layer.conv_states[0].numpy().copy())
            ssms.append(layer.recurrent_states[0].numpy().copy())
    result = (np.stack(outs, axis=1), convs[-1], ssms[-1])
    return result + (convs, ssms) if history else result


# --------------------------------------------------------------------------- SSM vs D skip


@contextmanager
def _spy(module: Any, name: str, sink: list[dict[str, Any]]) -> Iterator[Callable[..., Any]]:
    """Temporarily wrap ``module.name`` to record its call arguments; yields the original."""
    original = getattr(module, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        sink.append({"args": args, "kwargs": kwargs})
        return original(*args, **kwargs)

    spy.spied_original = original  # type: ignore[attr-defined]
    setattr(module, name, spy)
    try:
        yield original
    finally:
        setattr(module, name, original)


def _rms(t: torch.Tensor) -> float:
    return float(t.detach().double().pow(2).mean().sqrt())


def ssm_vs_skip(mixer: Mixer, x: np.ndarray) -> dict[str, float]:
    """RMS of the scan term and of the ``D * x`` skip at the scan's output, and their ratio.

    Captures the arguments the mixer passes to its scan function and re-runs the scan
    with ``D=None`` (and no gate), so the two terms are measured exactly as transformers
    combines them. A test asserts ``ratio`` is large: then a cascade with a wrong scan
    cannot pass a tolerance check on the strength of the skip alone.
    """
    assert_torch_path()
    calls: list[dict[str, Any]] = []
    if isinstance(mixer, Mamba2Mixer):
        with _spy(modeling_mamba2, "mamba2_chunk_scan", calls) as scan:
            _forward_unchecked(mixer, x)
        args, kwargs = calls[0]["args"], dict(calls[0]["kwargs"])
        u = args[0]  # (batch, seqlen, heads, headdim)
        skip = kwargs["D"][None, None, :, None] * u
        kwargs.update(D=None, return_final_states=False)
        with torch.no_grad():
            ssm = scan(*args, **kwargs)
    else:
        with _spy(modeling_mamba, "mamba_selective_scan", calls) as scan:
            _forward_unchecked(mixer, x)
        args, kwargs = calls[0]["args"], dict(calls[0]["kwargs"])
        u = args[0]  # (batch, d_inner, seqlen)
        skip = kwargs["D"][None, :, None] * u
        kwargs.update(D=None, z=None, return_last_state=False)
        with torch.no_grad():
            ssm = scan(*args, **kwargs)
    ssm_rms, skip_rms = _rms(ssm), _rms(skip)
    return {"ssm_rms": ssm_rms, "skip_rms": skip_rms, "ratio": ssm_rms / skip_rms}


# --------------------------------------------------------------------------- checkpoints


def _config_of(mixer: Mixer, config: MambaConfig | Mamba2Config | None) -> MambaConfig | Mamba2Config:
    return config if config is not None else mixer.hf_config


def _write_config(config: MambaConfig | Mamba2Config, path: Path, num_layers: int | None = None) -> None:
    """Full config (``use_diff=False``), so the file does not depend on the class defaults.

    Goes through ``to_json_string`` so non-finite floats are written the transformers way
    (``{"__float__": "Infinity"}``), as real checkpoints written by transformers 5 have them.
    """
    data = json.loads(config.to_json_string(use_diff=False))
    if num_layers is not None:
        data["num_hidden_layers"] = num_layers
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _write_tensors(tensors: dict[str, torch.Tensor], path: Path, dtype: torch.dtype | None) -> None:
    tensors = {k: (v.to(dtype) if dtype is not None else v).detach().contiguous() for k, v in tensors.items()}
    if path.suffix == ".npz":
        if dtype == torch.bfloat16:
            raise ValueError("numpy cannot hold bf16; write bf16 as .safetensors")
        np.savez(path, **{k: v.numpy() for k, v in tensors.items()})
    else:
        save_file(tensors, str(path), metadata={"format": "pt"})


def save_mixer(
    mixer: Mixer,
    config: MambaConfig | Mamba2Config | None,
    directory: str | Path,
    *,
    fmt: str = "safetensors",
    dtype: torch.dtype | None = None,
) -> tuple[Path, Path]:
    """Write ``config.json`` and a bare-mixer ``mixer.<fmt>`` (state_dict names); return both paths.

    ``dtype`` (e.g. ``torch.bfloat16``) converts the tensors before writing.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config_path, weights_path = directory / "config.json", directory / f"mixer.{fmt}"
    _write_config(_config_of(mixer, config), config_path)
    _write_tensors(dict(mixer.state_dict()), weights_path, dtype)
    return config_path, weights_path


def save_model(
    mixers: Sequence[Mixer],
    config: MambaConfig | Mamba2Config | None,
    directory: str | Path,
    *,
    prefix: str = "backbone.layers.{}.mixer.",
    fmt: str = "safetensors",
    dtype: torch.dtype | None = None,
    extra: dict[str, torch.Tensor] | None = None,
) -> tuple[Path, Path]:
    """Write a whole-model-style file: mixer i's tensors under ``prefix.format(i)``.

    ``extra`` adds non-mixer tensors (e.g. ``backbone.embeddings.weight``,
    ``backbone.layers.0.norm.weight``) as a real checkpoint has them.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config_path, weights_path = directory / "config.json", directory / f"model.{fmt}"
    _write_config(_config_of(mixers[0], config), config_path, num_layers=len(mixers))
    tensors: dict[str, torch.Tensor] = dict(extra or {})
    for i, mixer in enumerate(mixers):
        tensors.update({prefix.format(i) + k: v for k, v in mixer.state_dict().items()})
    _write_tensors(tensors, weights_path, dtype)
    return config_path, weights_path


def mixer_arrays(mixer: Mixer) -> dict[str, np.ndarray]:
    """The mixer's tensors as float32 numpy arrays, keyed like its state_dict."""
    return {k: v.detach().numpy().copy() for k, v in mixer.state_dict().items()}


# --------------------------------------------------------------------------- whole language models


def make_lm(
    family: str,
    *,
    layers: int = 2,
    vocab: int = 256,
    seed: int = 0,
    tie: bool | None = None,
    eos: int | None = None,
    **mixer: Any,
) -> MambaForCausalLM | Mamba2ForCausalLM:
    """A random ``MambaForCausalLM`` / ``Mamba2ForCausalLM`` (eval, float32) built from :func:`make_mamba1` /
    :func:`make_mamba2` mixers (one seed per layer), with embeddings and head of unit scale (so greedy picks
    are not near-ties; a tied head's embeddings smaller, see below) and norm weights in [0.5, 1.5] (so a missing one shows). ``mixer`` keywords size the
    mixers; ``tie`` ties the head to the embeddings (default: the config class's default); ``eos`` is the
    config's end-of-sequence id (None: generate to the end).
    """
    make = make_mamba1 if family == "mamba1" else make_mamba2
    mixers = [make(seed=seed + i, num_layers=layers, layer_idx=i, **mixer) for i in range(layers)]
    config = mixers[0].hf_config
    config.vocab_size = vocab
    config.eos_token_id = eos
    if tie is not None:
        config.tie_word_embeddings = tie
    cls = MambaForCausalLM if family == "mamba1" else Mamba2ForCausalLM
    model = cls(config).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():
        for layer, mixer_i in zip(model.backbone.layers, mixers, strict=True):
            layer.mixer.load_state_dict(mixer_i.state_dict())
            layer.norm.weight.copy_(0.5 + torch.rand(config.hidden_size, generator=gen))
        # a tied head scores each token by its embedding: at unit scale the input token's own embedding
        # wins every pick (greedy copies the last token); smaller, the blocks' outputs decide
        emb_std = 0.1 if config.tie_word_embeddings else 1.0
        model.backbone.embeddings.weight.copy_(_normal(gen, (vocab, config.hidden_size), emb_std))
        model.backbone.norm_f.weight.copy_(0.5 + torch.rand(config.hidden_size, generator=gen))
        if not config.tie_word_embeddings:
            model.lm_head.weight.copy_(_normal(gen, (vocab, config.hidden_size), 1.0))
    return model


def save_lm(model: MambaForCausalLM | Mamba2ForCausalLM, directory: str | Path,
            dtype: torch.dtype | None = None) -> tuple[Path, Path]:
    """Write the model as transformers does (``save_pretrained``: config.json and model.safetensors, the tied
    head left out); ``dtype`` converts the weights first. Returns (config, weights)."""
    directory = Path(directory)
    (model.to(dtype) if dtype is not None else model).save_pretrained(directory)
    model.to(torch.float32)
    return directory / "config.json", directory / "model.safetensors"


def lm_generate(model: MambaForCausalLM | Mamba2ForCausalLM, prompt: Sequence[int],
                max_new_tokens: int) -> tuple[list[int], list[np.ndarray]]:
    """transformers' greedy ``generate`` on the pure-PyTorch path: the new ids and each step's logits."""
    assert_torch_path()
    ids = torch.tensor([list(prompt)])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0)
    return out.sequences[0, len(prompt):].tolist(), [lg[0].float().numpy() for lg in out.logits]
