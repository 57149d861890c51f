"""The design-space grid: validate a sweep up front, then expand it into points in a fixed order.

Everything a user can get wrong (an unknown param or override key, a bad value, an
unknown model) is checked here, before any worker starts, so a typo costs
milliseconds and not a half-finished sweep.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mambalaya.arch import OVERRIDABLE, Arch, load_arch
from mambalaya.errors import MambalayaError, did_you_mean
from mambalaya.ir.cascade import Cascade
from mambalaya.parse import open_cascade
from mambalaya.parse.models import model_params

#: A sweep key that is not a cascade param: the published model size.
MODEL_KEY = "model"


@dataclass(frozen=True)
class Point:
    """One design point: a sized cascade on one (overridden) arch; ``labels`` are its row's key columns."""

    index: int
    cascade: Cascade
    arch: Arch
    labels: dict[str, Any]


def _values(key: str, raw: Any) -> list[Any]:
    """A scalar or a sequence of values -> a non-empty list (strings are scalars)."""
    values = [raw] if isinstance(raw, (str, bytes, int, float)) else list(raw)
    if not values:
        raise MambalayaError(f"sweep '{key}' has no values")
    return values


def _product(axes: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    keys = list(axes)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(axes[k] for k in keys))]


def _cascades(base: Cascade, sweep: Mapping[str, Any]) -> list[tuple[dict[str, Any], Cascade]]:
    """Every sized cascade of the param grid (model first, then params), built once here."""
    for key in sweep:
        if key != MODEL_KEY and key not in base.params:
            raise MambalayaError(
                f"unknown sweep param '{key}' for cascade {base.name}{did_you_mean(key, [*base.params, MODEL_KEY])}"
                f"; known: {', '.join([MODEL_KEY, *base.params])}"
            )
    axes = {k: _values(k, v) for k, v in sweep.items()}
    out = []
    for combo in _product(axes):
        overrides: dict[str, Any] = {}
        if MODEL_KEY in combo:
            overrides.update(model_params(str(combo[MODEL_KEY]), base.meta.get("config"), set(base.params)))
        for k, v in combo.items():
            if k != MODEL_KEY:
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise MambalayaError(f"sweep param '{k}': {v!r} is not a number")
                overrides[k] = v
        out.append((combo, base.with_params(**overrides) if overrides else base))
    return out


def _archs(archs: Sequence[Arch | str], arch_overrides: Mapping[str, Any]) -> list[tuple[dict[str, Any], Arch]]:
    """Every overridden arch of the grid; overrides are reported as the resolved SI numbers."""
    for key in arch_overrides:
        if key not in OVERRIDABLE:
            raise MambalayaError(
                f"unknown arch override '{key}'{did_you_mean(key, list(OVERRIDABLE))}; overridable: {', '.join(OVERRIDABLE)}"
            )
    axes = {k: _values(k, v) for k, v in arch_overrides.items()}
    out = []
    for spec in archs:
        arch = load_arch(spec) if isinstance(spec, str) else spec
        for combo in _product(axes):
            new = arch.with_overrides(**combo)
            labels = {"arch": arch.name, **{k: getattr(new, k) for k in combo}}
            out.append((labels, new))
    return out


def build_grid(
    cascade: Cascade | str,
    archs: Arch | str | Sequence[Arch | str],
    sweep: Mapping[str, Any] | None = None,
    arch_overrides: Mapping[str, Any] | None = None,
) -> list[Point]:
    """All points, params outermost then arch then overrides (the row order of the result)."""
    base = open_cascade(cascade) if isinstance(cascade, str) else cascade
    arch_list = [archs] if isinstance(archs, (str, Arch)) else list(archs)
    if not arch_list:
        raise MambalayaError("explore needs at least one arch")
    cascades = _cascades(base, sweep or {})
    arch_points = _archs(arch_list, arch_overrides or {})
    points = []
    for combo, sized in cascades:
        for arch_labels, arch in arch_points:
            labels = {"cascade": base.name, **combo, **arch_labels}
            points.append(Point(len(points), sized, arch, labels))
    return points


__all__ = ["MODEL_KEY", "Point", "build_grid"]
