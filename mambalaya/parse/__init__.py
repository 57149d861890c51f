"""Stage 1: cascade files and Einsum text -> the cascade IR."""

from __future__ import annotations

from pathlib import Path

from mambalaya.errors import CascadeError, MambalayaError
from mambalaya.fileio import resolve_shipped
from mambalaya.ir.cascade import Cascade
from mambalaya.parse.cascade_file import cascade_from_dict, load_cascade, parse_cascade_text
from mambalaya.parse.models import MODELS, model_params


def parse_set(items: list[str] | None) -> dict[str, int | float]:
    """``["seqlen=4096", "eps=1e-5"]`` -> ``{"seqlen": 4096, "eps": 1e-5}`` (numbers only, no eval)."""
    out: dict[str, int | float] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key or not raw:
            raise CascadeError(f"--set expects name=value, got '{item}'")
        try:
            value: int | float = int(raw)
        except ValueError:
            try:
                value = float(raw)
            except ValueError:
                raise CascadeError(f"--set {key}: '{raw}' is not a number") from None
        out[key] = value
    return out


def open_cascade(
    name_or_path: str | Path,
    model: str | None = None,
    params: dict[str, int | float] | None = None,
) -> Cascade:
    """A shipped cascade by name or a file by path, sized by a published model and overrides."""
    try:
        path = resolve_shipped(name_or_path, "cascades")
    except MambalayaError as err:
        raise CascadeError(err.message) from None
    cascade = load_cascade(path)
    overrides: dict[str, int | float] = {}
    if model:
        family = cascade.meta.get("config")
        try:
            overrides.update(model_params(model, family, set(cascade.params)))
        except CascadeError as err:
            raise err.located(str(path)) from None
    overrides.update(params or {})
    return cascade.with_params(**overrides) if overrides else cascade


__all__ = [
    "MODELS",
    "cascade_from_dict",
    "load_cascade",
    "open_cascade",
    "parse_cascade_text",
    "parse_set",
]
