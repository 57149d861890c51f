"""Whole-model greedy generation through the mapper's fused schedules: a checkpoint in, token ids out.

A Mamba language model is an embedding, ``layers`` blocks (RMSNorm, mixer, residual), a final RMSNorm
and the LM head. Every mixer runs the schedule the mapper picks for ``arch`` on the chosen backend: the
prompt through the prefill cascade (one schedule serves every layer, since they share shapes), each new
token through the decode cascade, its conv and SSM states carried per layer (the prefill's final states
feed the first step). The final norm and the head are the ``lm-head`` cascade, mapped and run the same
way. Only the embedding lookup, the blocks' pre-norms and the residual adds are numpy: they are not a
cascade's work, and they cost microseconds.

The prediction (:func:`predict_generation`) prices the same mappings with the cost model: a token is
``layers`` decode mixers plus one head; the prompt is ``layers`` prefill mixers plus one head.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from mambalaya.arch import Arch, load_arch
from mambalaya.checkpoint import (
    ModelConfig,
    ModelWeights,
    check_mixer_weights,
    load_hf_config,
    load_model_weights,
    model_config,
)
from mambalaya.cost import CostReport
from mambalaya.errors import WeightsError
from mambalaya.exec.backend import get_backend
from mambalaya.exec.device_decode import DeviceDecoder, rms_norm
from mambalaya.exec.realweights import bind_weights, layer_cascade
from mambalaya.exec.reference import check_memory
from mambalaya.exec.verify import Progress
from mambalaya.ir.cascade import Cascade
from mambalaya.mapper import optimal_mapping
from mambalaya.parse import open_cascade

#: The decode-step cascade of each family (the prefill one is :data:`~mambalaya.exec.realweights.PREFILL`).
DECODE = {"mamba1": "mamba1-decode", "mamba2": "mamba2-decode"}
#: The head every family shares: the final RMSNorm and the vocabulary projection.
HEAD = "lm-head"
#: Each family's SSM state: (its name as an input, the prefill's final state, the decode step's state out).
SSM_STATE = {"mamba1": ("H0", "HF", "H1"), "mamba2": ("S0", "SF", "S1")}
#: The conv state: the decode step's input, the prefill's final state, the decode step's state out.
CONV_STATE = ("CS0", "CSF", "CS1")
#: Mixer tensors the cascades do not model: a checkpoint that has them would generate other tokens.
_UNMODELLED = ("in_proj.bias", "out_proj.bias")
#: The largest prompt the prefill cascade is sized for before its buffers are checked (tokens).
MAX_PROMPT = 1 << 20


@dataclass(frozen=True)
class Stage:
    """One cascade of the model, mapped on the arch and compiled on the backend (built once per shape)."""

    cascade: Cascade
    report: CostReport  # the mapper's optimum, priced: what the prediction reads
    program: Any
    map_s: float
    compile_s: float

    @property
    def latency_s(self) -> float:
        return self.report.latency_s


@dataclass
class Generation:
    """A finished (or interrupted) generation: the new token ids and where the time went."""

    prompt: tuple[int, ...]
    tokens: list[int]
    arch: str
    backend: str
    prefill_s: float = 0.0  # the prompt through every layer (embedding and the blocks; the head apart)
    decode_s: list[float] = field(default_factory=list)  # per decode step: one token through every layer
    lm_head_s: float = 0.0  # the final norm and the head, every new token's
    map_s: float = 0.0  # mapping the cascades (not in the tokens/s)
    compile_s: float = 0.0  # compiling their schedules (or loading them from the disk cache)
    interrupted: bool = False  # stopped by the user (Ctrl-C): ``tokens`` holds what was finished
    stopped_at_eos: bool = False
    logits: list[np.ndarray] = field(default_factory=list)  # what each new token was picked from (keep_logits)
    predicted: GenerationPrediction | None = None  # the same schedules priced on ``arch``

    @property
    def total_s(self) -> float:
        return self.prefill_s + sum(self.decode_s) + self.lm_head_s

    @property
    def tokens_per_s(self) -> float:
        """New tokens over the time they took (prompt included, mapping and compiling not)."""
        return len(self.tokens) / self.total_s if self.total_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """The steady state: decode steps (each with its head) per second."""
        steps = len(self.decode_s)
        if not steps:
            return 0.0
        return steps / (sum(self.decode_s) + self.lm_head_s * steps / max(len(self.tokens), 1))

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt": list(self.prompt),
            "tokens": list(self.tokens),
            "tokens_per_s": self.tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "arch": self.arch,
            "backend": self.backend,
            "time_s": {"prefill": self.prefill_s, "decode": sum(self.decode_s),
                       "decode_per_token": sum(self.decode_s) / len(self.decode_s) if self.decode_s else 0.0,
                       "lm_head": self.lm_head_s, "map": self.map_s, "compile": self.compile_s},
            "interrupted": self.interrupted,
            "stopped_at_eos": self.stopped_at_eos,
            **({"predicted": self.predicted.to_json()} if self.predicted else {}),
        }


@dataclass(frozen=True)
class GenerationPrediction:
    """The cost model's figures for generating with a model's mappings on one arch."""

    arch: str
    layers: int
    prompt_len: int
    decode_layer_s: float  # one decode mixer
    lm_head_s: float
    prefill_layer_s: float  # one prefill mixer over the prompt
    dominant: tuple[tuple[str, float], ...]  # ("cascade:Einsum", share of a token's latency), largest first

    @property
    def token_s(self) -> float:
        """A decode token: every layer's decode mixer and the head."""
        return self.layers * self.decode_layer_s + self.lm_head_s

    @property
    def tokens_per_s(self) -> float:
        return 1.0 / self.token_s

    @property
    def prefill_s(self) -> float:
        """The prompt through every layer, and the head for the first new token."""
        return self.layers * self.prefill_layer_s + self.lm_head_s

    def to_json(self) -> dict[str, Any]:
        return {"arch": self.arch, "layers": self.layers, "prompt_len": self.prompt_len,
                "decode_layer_s": self.decode_layer_s, "lm_head_s": self.lm_head_s,
                "prefill_layer_s": self.prefill_layer_s, "token_s": self.token_s,
                "tokens_per_s": self.tokens_per_s, "prefill_s": self.prefill_s,
                "dominant": [{"einsum": e, "share": s} for e, s in self.dominant]}


def head_cascade(config: ModelConfig, batch: int = 1) -> Cascade:
    """The ``lm-head`` cascade sized for a model's config."""
    return open_cascade(HEAD, params={"batch": batch, "d_model": config.d_model, "vocab": config.vocab,
                                      "eps": config.eps})


def model_cascades(config: dict, prompt_len: int, batch: int = 1) -> dict[str, Cascade]:
    """The three cascades a generation runs, sized for a config: ``prefill`` (the prompt), ``decode``, ``head``."""
    if not 1 <= prompt_len <= MAX_PROMPT:
        raise WeightsError(f"the prompt has {prompt_len} tokens; give 1 to {MAX_PROMPT}")
    mc = model_config(config)
    return {"prefill": layer_cascade(config, batch, prompt_len),
            "decode": layer_cascade(config, batch, 1, DECODE[mc.family]),
            "head": head_cascade(mc, batch)}


def _dominant(parts: Sequence[tuple[CostReport, int]]) -> tuple[tuple[str, float], ...]:
    """Every Einsum's share of a token, largest first: each report's rows weighted by how often it runs."""
    total = sum(r.latency_s * n for r, n in parts)
    rows: dict[str, float] = {}
    for report, n in parts:
        for e in report.einsums:
            rows[f"{report.cascade}:{e.name}"] = rows.get(f"{report.cascade}:{e.name}", 0.0) + e.latency_s * n
    ranked = sorted(rows.items(), key=lambda kv: -kv[1])
    return tuple((name, s / total if total > 0 else 0.0) for name, s in ranked)


def _prediction(arch: str, layers: int, prompt_len: int, prefill: CostReport, decode: CostReport,
                head: CostReport) -> GenerationPrediction:
    return GenerationPrediction(arch, layers, prompt_len, decode.latency_s, head.latency_s, prefill.latency_s,
                                _dominant([(decode, layers), (head, 1)]))


def predict_generation(config: dict | str | Path, arch: Arch | str, prompt_len: int = 1,
                       *, layers: int | None = None, progress: bool | None = None) -> GenerationPrediction:
    """Predicted speed of greedy generation for a model config on ``arch``, from the mapper's optima of the
    prefill, decode and head cascades (no weights needed). ``layers`` overrides the config's count. Each cascade's
    mapping is a step shown on a terminal's stderr (``progress``: force it on or off): a GPU arch takes minutes."""
    cfg = load_hf_config(config) if isinstance(config, (str, Path)) else config
    arch_obj = arch if isinstance(arch, Arch) else load_arch(arch)
    mc = model_config(cfg)
    steps = Progress(progress)
    reports = {}
    for stage, cascade in model_cascades(cfg, prompt_len).items():
        with steps.step(f"mapping the {stage} cascade ({cascade.name}) on {arch_obj.name}"):
            reports[stage] = optimal_mapping(cascade, arch_obj).report
    return _prediction(arch_obj.name, layers or mc.layers, prompt_len, reports["prefill"], reports["decode"],
                       reports["head"])


class Generator:
    """A loaded model with its cascades mapped and compiled, ready to generate.

    Stages are built on first use and kept: the decode and head stages once, a prefill stage per prompt
    length. ``dtype`` is the executor's (float32; float64 for checks).
    """

    def __init__(self, config: dict, weights: ModelWeights, arch: Arch | str | None = None,
                 backend: str = "numba", dtype: str = "float32", **options: Any) -> None:
        self.config = config
        self.model = model_config(config)
        self.weights = weights
        self.backend = backend
        self.engine = get_backend(backend)
        why = self.engine.available()
        if why is not None:
            raise WeightsError(f"the {backend} backend cannot run here: {why}")
        self.arch = arch if isinstance(arch, Arch) else load_arch(arch or ("h200" if backend == "triton" else "cpu"))
        self.dtype = dtype
        self.options = options
        self._stages: dict[tuple[str, int], Stage] = {}
        self._bound: dict[str, list[dict[str, np.ndarray]]] = {}
        self._device: tuple[list, DeviceDecoder] | None = None  # (the states it started from, the decoder)
        self.family = self.model.family
        for layer, mixer in enumerate(weights.mixers):
            check_mixer_weights(mixer, config, file=f"layer {layer}")
            extra = [n for n in _UNMODELLED if n in mixer]
            if extra:
                raise WeightsError(f"layer {layer} has {', '.join(extra)}: the Mamba cascades model no projection "
                                   "biases (use_bias: true), so they would generate other tokens")

    # ---- stages ------------------------------------------------------------------------------------------

    def stage(self, kind: str, prompt_len: int = 1) -> Stage:
        """The mapped, compiled cascade ``kind`` (``prefill`` sized for ``prompt_len``, ``decode``, ``head``)."""
        key = (kind, prompt_len if kind == "prefill" else 0)
        if key not in self._stages:
            cascade = model_cascades(self.config, prompt_len)[kind]
            check_memory(cascade, self.dtype, reference=False)  # (a long prompt's prefill holds every token's states)
            t0 = time.perf_counter()
            report = optimal_mapping(cascade, self.arch).report
            t1 = time.perf_counter()
            assert report.schedule is not None
            program = self.engine.compile(cascade, report.schedule, self.dtype, **self.options)
            stage = Stage(cascade, report, program, t1 - t0, 0.0)
            self._warm_up(kind, stage)  # JIT backends compile at the first call: not a token's time
            self._stages[key] = replace(stage, compile_s=time.perf_counter() - t1)
        return self._stages[key]

    def _warm_up(self, kind: str, stage: Stage) -> None:
        """One run on layer 0's weights and zero activations."""
        c = stage.cascade
        zeros = {n: np.zeros(c.shape(n), self.dtype) for n, t in c.tensors.items()
                 if t.role == "input" and t.source is None}
        self._run(stage, {**self._layer_inputs(kind, stage)[0], **zeros}, count=True)

    def _layer_inputs(self, kind: str, stage: Stage) -> list[dict[str, np.ndarray]]:
        """Each layer's bound weights for a stage's cascade (the mixer cascades share source names)."""
        key = f"{kind}:{stage.cascade.params.get('seqlen', 0)}"
        if key not in self._bound:
            if kind == "head":
                w = {"norm_f.weight": self.weights.norm_f, "lm_head.weight": self.weights.lm_head}
                self._bound[key] = [bind_weights(stage.cascade, w)]
            else:
                self._bound[key] = [bind_weights(stage.cascade, m) for m in self.weights.mixers]
        return self._bound[key]

    def prediction(self, prompt_len: int) -> GenerationPrediction:
        """The cost model's figures for this generator's own schedules."""
        return _prediction(self.arch.name, self.model.layers, prompt_len, self.stage("prefill", prompt_len).report,
                           self.stage("decode").report, self.stage("head").report)

    # ---- running -----------------------------------------------------------------------------------------

    def _run(self, stage: Stage, inputs: dict[str, np.ndarray], count: bool = False) -> dict[str, np.ndarray]:
        """A stage's outputs (uncounted but for the warm-up: a token does not wait on counters)."""
        return self.engine.run(stage.program, inputs, count=count).outputs

    def _norm(self, h: np.ndarray, w: np.ndarray) -> np.ndarray:
        """The blocks' RMSNorm (transformers' MambaRMSNorm, in the executor's dtype)."""
        return rms_norm(h, w, self.model.eps)

    def _embed(self, ids: Sequence[int]) -> np.ndarray:
        return self.weights.embeddings[np.asarray(ids)][None].astype(self.dtype)

    def prefill(self, ids: Sequence[int]) -> tuple[np.ndarray, list[dict[str, np.ndarray]]]:
        """The last position's hidden state after every block, and each layer's states for decode."""
        stage = self.stage("prefill", len(ids))
        ssm_in, ssm_final, _ = SSM_STATE[self.family]
        h = self._embed(ids)
        states = []
        zero = np.zeros(stage.cascade.shape(ssm_in), self.dtype)
        for w, bound in zip(self.weights.norms, self._layer_inputs("prefill", stage), strict=True):
            out = self._run(stage, {**bound, "U": self._norm(h, w), ssm_in: zero})
            h = h + out["OUT"]
            states.append({CONV_STATE[0]: out[CONV_STATE[1]], ssm_in: out[ssm_final]})
        return h[:, -1], states

    def step(self, token: int, states: list[dict[str, np.ndarray]]) -> np.ndarray:
        """One new token through every block (``states`` advanced in place); the last hidden state. On the triton
        backend the states move to the device at the first step from them and advance there
        (:class:`~mambalaya.exec.device_decode.DeviceDecoder`: a token is one CUDA graph's replay)."""
        stage = self.stage("decode")
        ssm_in, _, ssm_out = SSM_STATE[self.family]
        if self.backend == "triton":
            if self._device is None or self._device[0] is not states:
                self._device = (states, DeviceDecoder(self, states, CONV_STATE[::2], (ssm_in, ssm_out)))
            return self._device[1].step(self._embed([token]))
        h = self._embed([token])
        for w, bound, st in zip(self.weights.norms, self._layer_inputs("decode", stage), states, strict=True):
            out = self._run(stage, {**bound, "U": self._norm(h, w), **st})
            h = h + out["OUT"].reshape(h.shape)
            st[CONV_STATE[0]], st[ssm_in] = out[CONV_STATE[2]], out[ssm_out]
        return h[:, -1]

    def head(self, hidden: np.ndarray) -> np.ndarray:
        """Next-token logits [vocab] from the last block's output (final norm and LM head, one cascade)."""
        if self._device is not None:
            return self._device[1].logits_of(hidden)
        stage = self.stage("head")
        (bound,) = self._layer_inputs("head", stage)
        return self._run(stage, {**bound, "U": hidden.reshape(1, -1)})["LOGITS"][0]

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, stop_at_eos: bool = True,
                 keep_logits: bool = False, on_token: Callable[[int, int], None] | None = None) -> Generation:
        """Greedy decoding: ``max_new_tokens`` new ids (fewer when an end-of-sequence id comes first).

        ``on_token(done, total)`` is called after each new token (a progress bar). Ctrl-C ends the
        generation with the tokens finished so far (``interrupted``) instead of losing them.
        """
        ids = _check_prompt(prompt, self.model.vocab)
        if max_new_tokens < 1:
            raise WeightsError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        gen = Generation(tuple(ids), [], self.arch.name, self.backend)
        try:
            for kind in ("prefill", "decode", "head"):  # mapped and compiled up front: not in the tokens/s
                s = self.stage(kind, len(ids))
                gen.map_s += s.map_s
                gen.compile_s += s.compile_s
            gen.predicted = self.prediction(len(ids))
            t = time.perf_counter()
            hidden, states = self.prefill(ids)
            gen.prefill_s = time.perf_counter() - t
            while True:
                t = time.perf_counter()
                logits = self.head(hidden)
                token = int(np.argmax(logits))
                gen.lm_head_s += time.perf_counter() - t
                gen.tokens.append(token)
                if keep_logits:
                    gen.logits.append(logits.copy())
                if on_token is not None:
                    on_token(len(gen.tokens), max_new_tokens)
                if stop_at_eos and token in self.model.eos:
                    gen.stopped_at_eos = True
                    break
                if len(gen.tokens) == max_new_tokens:
                    break
                t = time.perf_counter()
                hidden = self.step(token, states)
                gen.decode_s.append(time.perf_counter() - t)
        except KeyboardInterrupt:
            gen.interrupted = True
            del gen.decode_s[len(gen.tokens):]  # a step cut short is not timed
        return gen


def _check_prompt(prompt: Sequence[int], vocab: int) -> list[int]:
    ids = [int(i) for i in prompt]
    if not ids:
        raise WeightsError("the prompt is empty; give at least one token id")
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise WeightsError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab}); "
                           "the ids must come from this model's tokenizer")
    return ids


def load_generator(config: str | Path, weights: str | Path, arch: Arch | str | None = None,
                   backend: str = "numba", **options: Any) -> Generator:
    """A :class:`Generator` for a whole-model checkpoint (config.json and its .safetensors / .npz)."""
    cfg = load_hf_config(config)
    return Generator(cfg, load_model_weights(weights, model_config(cfg)), arch, backend, **options)


def generate(config: str | Path, weights: str | Path, prompt: Sequence[int], max_new_tokens: int,
             arch: Arch | str | None = None, backend: str = "numba", *, stop_at_eos: bool = True,
             keep_logits: bool = False, on_token: Callable[[int, int], None] | None = None,
             **options: Any) -> Generation:
    """Greedy generation from a whole Mamba checkpoint, every mixer through the schedule the mapper picks for
    ``arch`` (default: ``cpu`` for ``numba``, ``h200`` for ``triton``). See :class:`Generator`."""
    gen = load_generator(config, weights, arch, backend, **options)
    return gen.generate(prompt, max_new_tokens, stop_at_eos=stop_at_eos, keep_logits=keep_logits, on_token=on_token)


def read_prompt_ids(text: str | None = None, path: str | Path | None = None) -> list[int]:
    """Prompt ids from ``1,2,3`` or from a file: ``.npy`` (an integer array) or text (ids split by commas or
    white space)."""
    if (text is None) == (path is None):
        raise WeightsError("give the prompt as --prompt-ids 1,2,3 or as --prompt-file ids.npy (one of them)")
    if text is not None:
        parts = [p for p in text.replace(",", " ").split() if p]
        source = "--prompt-ids"
    else:
        p = Path(path)  # type: ignore[arg-type]
        if not p.is_file():
            raise WeightsError("prompt file not found", file=str(p))
        if p.suffix == ".npy":
            try:
                arr = np.load(p, allow_pickle=False)
            except (OSError, ValueError) as err:
                raise WeightsError(f"cannot read the prompt ids: {err}", file=str(p)) from None
            if arr.dtype.kind not in "iu" or arr.ndim > 2 or (arr.ndim == 2 and arr.shape[0] != 1):
                raise WeightsError(f"the prompt file holds a {arr.dtype} array of shape {arr.shape}; give integer "
                                   "token ids, shape (n,) or (1, n)", file=str(p))
            return [int(i) for i in arr.reshape(-1)]
        parts = p.read_text(encoding="utf-8", errors="replace").replace(",", " ").split()
        source = str(p)
    ids = []
    for part in parts:
        if not part.lstrip("-").isdigit():
            raise WeightsError(f"{source}: {part!r} is not a token id (integers, separated by commas)")
        ids.append(int(part))
    if not ids:
        raise WeightsError(f"{source}: no token ids")
    return ids


__all__ = ["CONV_STATE", "DECODE", "HEAD", "SSM_STATE", "Generation", "GenerationPrediction", "Generator", "Stage",
           "generate", "head_cascade", "load_generator", "model_cascades", "predict_generation", "read_prompt_ids"]
