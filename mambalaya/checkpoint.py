"""Load real Mamba configs and mixer weights (Hugging Face / mamba_ssm layouts).

``mambalaya run`` executes a cascade on the weights of one mixer. This module
turns a ``config.json`` into cascade parameters and a ``.safetensors`` / ``.npz``
file into a dict of numpy arrays with mixer-level names (``in_proj.weight``,
``A_log``, ...), so the executor never sees file formats. It needs no torch:
bf16 files are decoded from the raw safetensors bytes.

Every mistake a user can make raises :class:`~mambalaya.errors.WeightsError`
with the file and a hint, never a bare ``KeyError`` or ``OSError``.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from mambalaya.errors import WeightsError

Family = Literal["mamba1", "mamba2"]

# Defaults of transformers 5.24 MambaConfig / Mamba2Config, used when a config.json omits a field
# (``to_json_file`` writes only the fields that differ from them). tests/test_checkpoint.py checks
# they still match the installed classes.
MAMBA1_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "state_size": 16,
    "conv_kernel": 4,
    "expand": 2,
    "time_step_rank": "auto",
    "num_hidden_layers": 32,
    "vocab_size": 50280,
    "tie_word_embeddings": True,
    "layer_norm_epsilon": 1e-5,
}
MAMBA2_DEFAULTS: dict[str, Any] = {
    "hidden_size": 4096,
    "state_size": 128,
    "conv_kernel": 4,
    "expand": 2,
    "num_heads": 128,
    "head_dim": 64,
    "n_groups": 8,
    "chunk_size": 256,
    "layer_norm_epsilon": 1e-5,
    "time_step_limit": (0.0, math.inf),
    "num_hidden_layers": 64,
    "vocab_size": 32768,
    "tie_word_embeddings": False,
}

# Tensors a mixer must have (optional ones: conv1d.bias, in_proj.bias, out_proj.bias).
MAMBA1_REQUIRED = (
    "in_proj.weight",
    "conv1d.weight",
    "x_proj.weight",
    "dt_proj.weight",
    "dt_proj.bias",
    "A_log",
    "D",
    "out_proj.weight",
)
MAMBA2_REQUIRED = (
    "in_proj.weight",
    "conv1d.weight",
    "dt_bias",
    "A_log",
    "D",
    "norm.weight",
    "out_proj.weight",
)

_LAYER_KEY = re.compile(r"^(?:backbone\.|model\.)?layers\.(\d+)\.mixer\.(.+)$")

# safetensors dtype codes -> numpy dtypes (BF16 handled separately: numpy has no bfloat16).
_ST_DTYPES: dict[str, str] = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "BOOL": "?",
}


# --------------------------------------------------------------------------- configs


def load_hf_config(path: str | Path) -> dict[str, Any]:
    """Read a ``config.json`` (HF MambaConfig/Mamba2Config fields, or mamba_ssm's ``ssm_cfg`` form).

    A mamba_ssm config (``d_model``, ``n_layer``, ``ssm_cfg``) is translated to the HF field
    names, so the rest of the tool sees one vocabulary. The family is checked here so a
    config that is not Mamba fails early, at the file that is wrong.
    """
    p = Path(path)
    if not p.is_file():
        raise WeightsError(
            "config file not found; pass the model's config.json (Hugging Face MambaConfig/Mamba2Config)",
            file=str(p),
        )
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WeightsError(
            f"config is not valid JSON ({exc}); pass a Hugging Face config.json", file=str(p)
        ) from exc
    if not isinstance(cfg, dict):
        raise WeightsError("config must be a JSON object (a Hugging Face config.json)", file=str(p))
    cfg = _decode_special_floats(cfg)
    try:
        if "ssm_cfg" in cfg and "d_model" in cfg and "hidden_size" not in cfg:
            cfg = _from_mamba_ssm_config(cfg)
        config_family(cfg)
        config_params(cfg)
    except WeightsError as err:
        raise err.located(file=str(p)) from None
    return cfg


_SPECIAL_FLOATS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def _decode_special_floats(obj: Any) -> Any:
    """Undo transformers' JSON encoding of non-finite floats (``{"__float__": "Infinity"}``).

    transformers >= 5 writes ``time_step_limit = (0.0, inf)`` that way; plain Python JSON
    (``Infinity``) is read by ``json.loads`` already.
    """
    if isinstance(obj, dict):
        if set(obj) == {"__float__"} and obj["__float__"] in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[obj["__float__"]]
        return {k: _decode_special_floats(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode_special_floats(v) for v in obj]
    return obj


def _from_mamba_ssm_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Translate a mamba_ssm ``MambaConfig`` (state-spaces/* repos) to HF field names.

    Defaults are those of ``mamba_ssm.modules.mamba_simple.Mamba`` / ``mamba2.Mamba2``
    (its gated RMSNorm has a fixed eps of 1e-5).
    """
    ssm = dict(raw.get("ssm_cfg") or {})
    layer = ssm.get("layer", "Mamba1")
    d_model = int(raw["d_model"])
    expand = int(ssm.get("expand", 2))
    out: dict[str, Any] = {
        "hidden_size": d_model,
        "num_hidden_layers": int(raw.get("n_layer", 1)),
        "expand": expand,
        "conv_kernel": int(ssm.get("d_conv", 4)),
        "source_format": "mamba_ssm",
        # the whole model: mamba_ssm pads the vocabulary up to a multiple (its checkpoints hold the padded size)
        "vocab_size": -(-int(raw.get("vocab_size", 50277)) // int(raw.get("pad_vocab_size_multiple", 8)))
        * int(raw.get("pad_vocab_size_multiple", 8)),
        "tie_word_embeddings": bool(raw.get("tie_embeddings", True)),
        "layer_norm_epsilon": float(raw.get("norm_epsilon", 1e-5)),
        "norm_epsilon": float(raw.get("norm_epsilon", 1e-5)),  # the blocks' norms (Mamba-2's gated one: 1e-5)
        "rms_norm": bool(raw.get("rms_norm", True)),
    }
    if layer == "Mamba1":
        out.update(
            model_type="mamba",
            state_size=int(ssm.get("d_state", 16)),
            time_step_rank=ssm.get("dt_rank", "auto"),
            intermediate_size=expand * d_model,
        )
    elif layer == "Mamba2":
        if ssm.get("d_ssm") is not None:
            raise WeightsError(
                "mamba_ssm Mamba2 with d_ssm (a gated-MLP part in in_proj) is not supported; "
                "only the published layout (d_ssm unset) is"
            )
        headdim = int(ssm.get("headdim", 64))
        out.update(
            model_type="mamba2",
            state_size=int(ssm.get("d_state", 128)),
            head_dim=headdim,
            num_heads=expand * d_model // headdim,
            n_groups=int(ssm.get("ngroups", 1)),
            chunk_size=int(ssm.get("chunk_size", 256)),
            layer_norm_epsilon=1e-5,
            time_step_limit=list(ssm.get("dt_limit", (0.0, math.inf))),
        )
    else:
        raise WeightsError(f"mamba_ssm layer type {layer!r} is not supported; use Mamba1 or Mamba2")
    return out


def config_family(cfg: dict[str, Any]) -> Family:
    """Say whether a config describes a Mamba-1 or a Mamba-2 mixer.

    ``model_type`` decides when present; otherwise Mamba-2-only fields (heads, groups,
    chunk size) do, so hand-written configs without ``model_type`` still work.
    """
    model_type = str(cfg.get("model_type", "")).lower()
    if model_type == "mamba":
        return "mamba1"
    if model_type == "mamba2":
        return "mamba2"
    if model_type:
        raise WeightsError(
            f"config model_type {model_type!r} is not a Mamba model; expected 'mamba' or 'mamba2'"
        )
    ssm_layer = (cfg.get("ssm_cfg") or {}).get("layer")
    if ssm_layer in ("Mamba1", "Mamba2"):
        return "mamba1" if ssm_layer == "Mamba1" else "mamba2"
    if any(k in cfg for k in ("n_groups", "head_dim", "num_heads", "chunk_size", "time_step_limit")):
        return "mamba2"
    if any(
        k in cfg for k in ("state_size", "hidden_size", "conv_kernel", "time_step_rank", "intermediate_size")
    ):
        return "mamba1"
    raise WeightsError(
        "cannot tell the model family: config has no model_type and no Mamba fields "
        '(hidden_size, state_size, num_heads, ...); add "model_type": "mamba" or "mamba2"'
    )


def _int_field(cfg: dict[str, Any], name: str, defaults: dict[str, Any]) -> int:
    value = cfg.get(name, defaults.get(name))
    try:
        as_int = int(value)
    except (TypeError, ValueError):
        raise WeightsError(f"config field {name!r} must be an integer, got {value!r}") from None
    if as_int != value or as_int <= 0:
        raise WeightsError(f"config field {name!r} must be a positive integer, got {value!r}")
    return as_int


def _float_field(value: Any, name: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise WeightsError(f"config field {name!r} must be a number, got {value!r}") from None


def config_params(cfg: dict[str, Any]) -> dict[str, int | float]:
    """Map a HF config to the cascade parameters (``d_model``, ``d_state``, ...).

    Names are those the shipped cascades use. Missing fields take the transformers 5.24
    defaults. Inconsistent sizes (heads x head_dim != d_inner) are rejected here rather
    than surfacing as a shape error deep in the executor.
    """
    family = config_family(cfg)
    if family == "mamba1":
        d = MAMBA1_DEFAULTS
        d_model = _int_field(cfg, "hidden_size", d)
        expand = _int_field(cfg, "expand", d)
        rank = cfg.get("time_step_rank", d["time_step_rank"])
        dt_rank = math.ceil(d_model / 16) if rank == "auto" else _int_field(cfg, "time_step_rank", d)
        d_inner = _int_field(cfg, "intermediate_size", {"intermediate_size": expand * d_model})
        return {
            "d_model": d_model,
            "d_state": _int_field(cfg, "state_size", d),
            "d_conv": _int_field(cfg, "conv_kernel", d),
            "expand": expand,
            "dt_rank": dt_rank,
            "d_inner": d_inner,
        }
    d = MAMBA2_DEFAULTS
    d_model = _int_field(cfg, "hidden_size", d)
    expand = _int_field(cfg, "expand", d)
    nheads = _int_field(cfg, "num_heads", d)
    headdim = _int_field(cfg, "head_dim", d)
    ngroups = _int_field(cfg, "n_groups", d)
    d_inner = expand * d_model
    if nheads * headdim != d_inner:
        raise WeightsError(
            f"inconsistent Mamba-2 config: num_heads*head_dim = {nheads}*{headdim} = {nheads * headdim} "
            f"but expand*hidden_size = {d_inner}; fix num_heads or head_dim"
        )
    if nheads % ngroups:
        raise WeightsError(
            f"inconsistent Mamba-2 config: num_heads={nheads} is not a multiple of n_groups={ngroups}"
        )
    limit = cfg.get("time_step_limit", d["time_step_limit"])
    if not isinstance(limit, (list, tuple)) or len(limit) != 2:
        raise WeightsError(f"config field 'time_step_limit' must be a pair [min, max], got {limit!r}")
    eps = _float_field(cfg.get("layer_norm_epsilon", d["layer_norm_epsilon"]), "layer_norm_epsilon")
    return {
        "d_model": d_model,
        "d_state": _int_field(cfg, "state_size", d),
        "d_conv": _int_field(cfg, "conv_kernel", d),
        "expand": expand,
        "d_inner": d_inner,
        "nheads": nheads,
        "headdim": headdim,
        "ngroups": ngroups,
        "chunk": _int_field(cfg, "chunk_size", d),
        "eps": eps,
        "dt_min": _float_field(limit[0], "time_step_limit[0]"),
        "dt_max": _float_field(limit[1], "time_step_limit[1]"),
    }


# --------------------------------------------------------------------------- weights


def load_mixer_weights(
    path: str | Path, layer: int | None = None, *, family: Family | None = None
) -> dict[str, np.ndarray]:
    """Read one mixer's tensors from a ``.safetensors`` or ``.npz`` file, names prefix-stripped.

    A whole-model file (``backbone.layers.N.mixer.``, ``model.layers.N.mixer.`` or
    ``layers.N.mixer.`` names) needs ``layer``; a bare-mixer file takes ``layer`` None or 0.
    Half-precision tensors (fp16, bf16) come back as float32; float64 stays float64.
    The tensors the family needs are checked here (family inferred from the names when
    not given), so a truncated file fails at load time, naming what is missing.
    """
    p = Path(path)
    if not p.is_file():
        raise WeightsError("weights file not found; pass a .safetensors or .npz file", file=str(p))
    suffix = p.suffix.lower()
    if suffix == ".safetensors":
        reader = _SafetensorsReader(p)
    elif suffix == ".npz":
        reader = _NpzReader(p)
    else:
        raise WeightsError(
            f"unknown weights file extension {p.suffix!r}; use .safetensors or .npz", file=str(p)
        )
    try:
        names = reader.keys()
        wanted = _select_layer(names, layer)
        weights = {short: _to_float(reader.get(full), full) for full, short in wanted.items()}
        _check_required(weights, family)
    except WeightsError as err:
        raise err.located(file=str(p)) from None
    finally:
        reader.close()
    return weights


def _select_layer(names: list[str], layer: int | None) -> dict[str, str]:
    """Map the file's tensor names of the chosen mixer to their mixer-level names."""
    by_layer: dict[int, dict[str, str]] = {}
    for name in names:
        m = _LAYER_KEY.match(name)
        if m:
            by_layer.setdefault(int(m.group(1)), {})[name] = m.group(2)
    if not by_layer:
        if layer not in (None, 0):
            raise WeightsError(
                f"layer {layer} requested but the file holds a single mixer (no 'backbone.layers.N.mixer.' "
                "names); drop --layer"
            )
        return {name: name for name in names}
    layers = sorted(by_layer)
    if layer is None:
        raise WeightsError(
            f"whole-model file with {len(layers)} layers ({_ranges(layers)}); choose one with --layer N"
        )
    if layer not in by_layer:
        raise WeightsError(f"layer {layer} is not in the file; it has layers {_ranges(layers)}")
    return by_layer[layer]


def _ranges(values: list[int]) -> str:
    """Compact '0-23' / '0-3, 7' form so an error stays one line even for 64 layers."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _check_required(weights: dict[str, np.ndarray], family: Family | None) -> None:
    if family is None:
        if "x_proj.weight" in weights or "dt_proj.weight" in weights:
            family = "mamba1"
        elif "dt_bias" in weights or "norm.weight" in weights:
            family = "mamba2"
        else:
            found = ", ".join(sorted(weights)[:8]) or "none"
            raise WeightsError(
                "not a Mamba mixer: no x_proj.weight (Mamba-1) nor dt_bias (Mamba-2) "
                f"among the tensors (found: {found}); pass a mixer or model checkpoint"
            )
    required = MAMBA1_REQUIRED if family == "mamba1" else MAMBA2_REQUIRED
    missing = [n for n in required if n not in weights]
    if missing:
        raise WeightsError(
            f"{'Mamba-1' if family == 'mamba1' else 'Mamba-2'} mixer is missing tensor(s) {', '.join(missing)}; "
            "the file is truncated or is not this model family"
        )


def _to_float(arr: np.ndarray, name: str) -> np.ndarray:
    """Widen half precision to float32 (the executor computes in float32 or float64)."""
    if arr.dtype == np.float16:
        return arr.astype(np.float32)
    if arr.dtype.kind == "f":
        return np.ascontiguousarray(arr)
    raise WeightsError(f"tensor {name!r} has dtype {arr.dtype}; expected a floating-point tensor")


def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """bf16 is the top half of an IEEE float32: shift the 16 bits up."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


class _NpzReader:
    def __init__(self, path: Path) -> None:
        try:
            self._npz = np.load(path, allow_pickle=False)
        except Exception as exc:  # zipfile.BadZipFile, ValueError, OSError: all mean "not a usable npz"
            raise WeightsError(
                f"cannot read .npz file ({exc}); is it a numpy savez archive?", file=str(path)
            ) from exc

    def keys(self) -> list[str]:
        return list(self._npz.files)

    def get(self, name: str) -> np.ndarray:
        try:
            return self._npz[name]
        except Exception as exc:
            raise WeightsError(f"cannot read tensor {name!r} from .npz ({exc})") from exc

    def close(self) -> None:
        self._npz.close()


class _SafetensorsReader:
    """Reads through ``safetensors.numpy`` and falls back to the raw format for bf16.

    The format: 8-byte little-endian header length, a JSON header mapping each name to
    ``dtype``, ``shape`` and ``data_offsets`` (relative to the end of the header), then
    the raw little-endian data. The header is parsed here in any case, so corrupt files
    give one clear error and bf16 tensors can be read without torch.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._header, self._data_start = self._read_header(path)
        self._fh = path.open("rb")
        from safetensors import SafetensorError, safe_open

        try:
            self._st = safe_open(str(path), framework="numpy")
        except (SafetensorError, OSError) as exc:
            self._fh.close()
            raise WeightsError(f"corrupt safetensors file ({exc}); re-export it", file=str(path)) from exc

    @staticmethod
    def _read_header(path: Path) -> tuple[dict[str, Any], int]:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise WeightsError(
                    "corrupt safetensors file: shorter than its 8-byte header length", file=str(path)
                )
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise WeightsError(
                    f"corrupt safetensors file: header length {n} exceeds the file size {size}; "
                    "the file is truncated or not safetensors",
                    file=str(path),
                )
            try:
                header = json.loads(fh.read(n).decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise WeightsError(
                    f"corrupt safetensors header ({exc}); re-export the file", file=str(path)
                ) from exc
        if not isinstance(header, dict):
            raise WeightsError("corrupt safetensors header: not a JSON object", file=str(path))
        header.pop("__metadata__", None)
        data_len = size - 8 - n
        for name, info in header.items():
            try:
                begin, end = (int(v) for v in info["data_offsets"])
                shape = [int(s) for s in info["shape"]]
                dtype = str(info["dtype"])
            except (KeyError, TypeError, ValueError) as exc:
                raise WeightsError(
                    f"corrupt safetensors header: bad entry for {name!r}", file=str(path)
                ) from exc
            if not 0 <= begin <= end <= data_len:
                raise WeightsError(
                    f"corrupt safetensors file: tensor {name!r} lies outside the data (truncated file?)",
                    file=str(path),
                )
            itemsize = 2 if dtype == "BF16" else np.dtype(_ST_DTYPES.get(dtype, "u1")).itemsize
            if (dtype in _ST_DTYPES or dtype == "BF16") and (end - begin) != itemsize * math.prod(shape):
                raise WeightsError(
                    f"corrupt safetensors header: tensor {name!r} size does not match its shape {shape}",
                    file=str(path),
                )
        return header, 8 + n

    def keys(self) -> list[str]:
        return list(self._header)

    def get(self, name: str) -> np.ndarray:
        info = self._header[name]
        dtype = info["dtype"]
        if dtype in _ST_DTYPES:  # numpy-native dtypes: the safetensors.numpy API reads them
            return self._st.get_tensor(name)
        if dtype != "BF16":
            raise WeightsError(
                f"tensor {name!r} has unsupported safetensors dtype {dtype}; convert it to F32, F16 or BF16"
            )
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        self._fh.seek(self._data_start + begin)
        buf = self._fh.read(end - begin)
        return _bf16_to_f32(np.frombuffer(buf, dtype="<u2")).reshape(shape)

    def close(self) -> None:
        self._fh.close()
        self._st = None  # safe_open has no close(); dropping it releases the mmap


# --------------------------------------------------------------------------- consistency


def expected_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Shapes of a transformers mixer's tensors for this config (biases listed as optional too)."""
    p = config_params(cfg)
    d_model, d_inner, n, k = (int(p["d_model"]), int(p["d_inner"]), int(p["d_state"]), int(p["d_conv"]))
    if config_family(cfg) == "mamba1":
        r = int(p["dt_rank"])
        return {
            "in_proj.weight": (2 * d_inner, d_model),
            "in_proj.bias": (2 * d_inner,),
            "conv1d.weight": (d_inner, 1, k),
            "conv1d.bias": (d_inner,),
            "x_proj.weight": (r + 2 * n, d_inner),
            "dt_proj.weight": (d_inner, r),
            "dt_proj.bias": (d_inner,),
            "A_log": (d_inner, n),
            "D": (d_inner,),
            "out_proj.weight": (d_model, d_inner),
            "out_proj.bias": (d_model,),
        }
    h, g = int(p["nheads"]), int(p["ngroups"])
    conv_dim = d_inner + 2 * g * n
    return {
        "in_proj.weight": (d_inner + conv_dim + h, d_model),
        "in_proj.bias": (d_inner + conv_dim + h,),
        "conv1d.weight": (conv_dim, 1, k),
        "conv1d.bias": (conv_dim,),
        "dt_bias": (h,),
        "A_log": (h,),
        "D": (h,),
        "norm.weight": (d_inner,),
        "out_proj.weight": (d_model, d_inner),
        "out_proj.bias": (d_model,),
    }


def check_mixer_weights(
    weights: dict[str, np.ndarray], cfg: dict[str, Any], *, file: str | None = None
) -> None:
    """Reject weights whose shapes do not fit the config, naming the tensor and both shapes.

    Catches the common mix-ups (a config of another size, a Mamba-2 checkpoint with a
    gated-MLP part in in_proj, D per channel instead of per head) before the cascade runs.
    """
    family = config_family(cfg)
    try:
        _check_required(weights, family)
    except WeightsError as err:
        raise err.located(file=file) from None
    shapes = expected_shapes(cfg)
    for name, want in shapes.items():  # in the layer's dataflow order, so the first culprit is named
        arr = weights.get(name)
        if arr is None or tuple(arr.shape) == want:
            continue
        hint = ""
        if family == "mamba2" and name == "in_proj.weight" and arr.shape[0] > want[0]:
            hint = " (extra rows: a mamba_ssm d_ssm gated-MLP part, which is not supported)"
        elif family == "mamba2" and name == "D" and arr.shape == shapes["norm.weight"]:
            hint = " (D per channel, mamba_ssm D_has_hdim=True, is not supported)"
        raise WeightsError(
            f"tensor {name!r} has shape {tuple(arr.shape)} but the config implies {want}{hint}; "
            "check that config and weights belong to the same model",
            file=file,
        )


# --------------------------------------------------------------------------- whole models

#: Where a whole-model file keeps the parts around the mixers (transformers' names, then mamba_ssm's).
_EMBEDDINGS = ("backbone.embeddings.weight", "backbone.embedding.weight", "embeddings.weight", "embedding.weight")
_NORM_F = ("backbone.norm_f.weight", "norm_f.weight")
_LM_HEAD = ("lm_head.weight",)
_BLOCK_NORM = re.compile(r"^(?:backbone\.|model\.)?layers\.(\d+)\.norm\.weight$")


@dataclass(frozen=True)
class ModelConfig:
    """What a whole language model adds to its mixers' config: layers, vocabulary, norms, head, stop token."""

    family: Family
    layers: int
    vocab: int
    d_model: int
    eps: float  # the blocks' RMSNorm (pre-norm and the final norm_f)
    tied: bool  # the LM head is the embedding matrix
    eos: tuple[int, ...]  # token ids that end a generation (none: run to max_new_tokens)


def model_config(cfg: dict[str, Any]) -> ModelConfig:
    """The whole-model fields of a config (transformers 5.24 defaults for the ones it omits)."""
    family = config_family(cfg)
    d = MAMBA1_DEFAULTS if family == "mamba1" else MAMBA2_DEFAULTS
    if not cfg.get("rms_norm", True):
        raise WeightsError("the config's blocks use LayerNorm (rms_norm: false); only RMSNorm blocks are supported")
    eos = cfg.get("eos_token_id", 0 if family == "mamba1" else 2)
    eos_ids = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
    if not all(isinstance(e, int) and not isinstance(e, bool) for e in eos_ids):
        raise WeightsError(f"config field 'eos_token_id' must be an integer, a list of them or null, got {eos!r}")
    return ModelConfig(
        family=family,
        layers=_int_field(cfg, "num_hidden_layers", d),
        vocab=_int_field(cfg, "vocab_size", d),
        d_model=_int_field(cfg, "hidden_size", d),
        eps=_float_field(cfg.get("norm_epsilon", cfg.get("layer_norm_epsilon", 1e-5)), "layer_norm_epsilon"),
        tied=bool(cfg.get("tie_word_embeddings", d["tie_word_embeddings"])),
        eos=eos_ids,
    )


@dataclass(frozen=True)
class ModelWeights:
    """A whole Mamba language model's tensors, float32 (or float64), mixers with mixer-level names."""

    embeddings: np.ndarray  # [vocab, d_model]
    norms: tuple[np.ndarray, ...]  # each block's pre-norm weight [d_model]
    mixers: tuple[dict[str, np.ndarray], ...]
    norm_f: np.ndarray  # [d_model]
    lm_head: np.ndarray  # [vocab, d_model]: the embeddings themselves when tied


def load_model_weights(path: str | Path, config: ModelConfig) -> ModelWeights:
    """Read every tensor a whole model needs from one ``.safetensors`` / ``.npz`` file (a CausalLM checkpoint).

    Layers must be 0 .. ``config.layers`` - 1, each with its mixer and its block norm; the LM head is
    ``lm_head.weight``, or the embeddings when the config ties them (transformers then omits it from the
    file). Shapes are checked against the config, so a file of another model fails here, naming the tensor.
    """
    p = Path(path)
    if not p.is_file():
        raise WeightsError("weights file not found; pass a .safetensors or .npz file", file=str(p))
    suffix = p.suffix.lower()
    if suffix not in (".safetensors", ".npz"):
        raise WeightsError(f"unknown weights file extension {p.suffix!r}; use .safetensors or .npz", file=str(p))
    reader = _SafetensorsReader(p) if suffix == ".safetensors" else _NpzReader(p)
    try:
        names = set(reader.keys())

        def one_of(options: tuple[str, ...], what: str) -> np.ndarray:
            for name in options:
                if name in names:
                    return _to_float(reader.get(name), name)
            raise WeightsError(f"the file has no {what} (looked for {', '.join(options)}); is it a whole-model "
                               "checkpoint (MambaForCausalLM / Mamba2ForCausalLM)?")

        embeddings = one_of(_EMBEDDINGS, "token embeddings")
        norm_f = one_of(_NORM_F, "final norm")
        if config.tied:
            lm_head = embeddings
        else:
            lm_head = one_of(_LM_HEAD, "LM head (the config does not tie it to the embeddings)")
        want = (config.vocab, config.d_model)
        for name, arr in (("embeddings", embeddings), ("lm_head", lm_head)):
            if arr.shape != want:
                raise WeightsError(f"the {name} have shape {arr.shape} but the config says (vocab_size, hidden_size) "
                                   f"= {want}; do config and weights belong to the same model?")
        if norm_f.shape != (config.d_model,):
            raise WeightsError(f"norm_f.weight has shape {norm_f.shape}, expected ({config.d_model},)")
        block_norms = {int(m.group(1)): n for n in names if (m := _BLOCK_NORM.match(n))}
        mixers, norms = [], []
        for layer in range(config.layers):
            if layer not in block_norms:
                have = sorted(block_norms)
                raise WeightsError(f"layer {layer}'s block norm is missing; the file has norms of layers "
                                   f"{_ranges(have) if have else 'none'} and the config says {config.layers} layers")
            norm = _to_float(reader.get(block_norms[layer]), block_norms[layer])
            if norm.shape != (config.d_model,):
                raise WeightsError(f"{block_norms[layer]} has shape {norm.shape}, expected ({config.d_model},)")
            norms.append(norm)
            wanted = _select_layer(sorted(names), layer)
            mixer = {short: _to_float(reader.get(full), full) for full, short in wanted.items()}
            _check_required(mixer, config.family)
            mixers.append(mixer)
    except WeightsError as err:
        raise err.located(file=str(p)) from None
    finally:
        reader.close()
    return ModelWeights(embeddings, tuple(norms), tuple(mixers), norm_f, lm_head)
